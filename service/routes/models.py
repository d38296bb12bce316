"""GET /models: every package found, loaded or not, with what it runs on and the limits; GET
/v1/models and /v1/models/{id}: OpenAI's models API over what /v1/embeddings serves."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from heads.package import ModelPackage
from heads.rows import InvalidInput
from heads.tasks import embed
from service.errors import Forbidden, InputError, ModelNotFound, ServiceError
from service.metrics import ANY_TASK_ENDPOINTS, ENDPOINTS_BY_TASK, SPARSE_ENDPOINTS
from service.registry import Entry, Registry
from service.routes.answers import ERRORS
from service.routes.deps import ApiKey, RegistryDep, SettingsDep, require_bearer
from service.schemas import (
    Limits,
    ModelInfo,
    ModelsResponse,
    OpenAIModel,
    OpenAIModelList,
    VariantAgreement,
)
from service.selection import defaults, unfit

router = APIRouter(tags=["models"], dependencies=[ApiKey])
control = APIRouter(tags=["model control"])


def adapter_fields(entry: Entry, registry: Registry | None) -> dict[str, Any]:
    """An adapter's base and weights, an encoder's adapters (heads.adapters)."""
    model = entry.model
    assert model is not None
    if model.adapter is not None and model.base is not None:
        a, p = model.adapter, model.package
        targets = p.adapter.get("targets", []) if p.adapter else []
        return {
            "base": model.base.name,
            "adapter": {"kind": a.kind, "rank": a.rank, "targets": targets, "bytes": a.nbytes},
        }
    if model.package.encoder is not None and registry is not None:
        return {"adapters": [e.name for e in registry.riders(model)]}
    return {}


def describe(
    entry: Entry, chosen_for: list[str] | None = None, registry: Registry | None = None
) -> ModelInfo:
    """`chosen_for`: the request tasks it answers when a request names no model."""
    info = ModelInfo(
        name=entry.name,
        path=str(entry.path),
        state=entry.state,
        error=entry.error,
        task=entry.task,
        reload_error=entry.reload_error,
    )
    if entry.model is None:
        return info
    p = entry.model.package
    return info.model_copy(
        update={
            "version": entry.model.version,
            "loaded_at": round(entry.model.loaded_at, 3),
            "package_name": entry.model.package_name
            if entry.model.package_name != p.name
            else None,
            "default_for": chosen_for or None,
            "labels": p.labels,
            "reads": p.reads if p.task == "classification" else None,
            "problem_type": p.problem_type,
            "pooling": p.pooling,
            "normalize": p.normalize if p.task == "embedding" else None,
            "hidden_states": embed.hidden_states(p.outputs) if p.task == "embedding" else None,
            **adapter_fields(entry, registry),
            "prompts": p.prompts or None,
            "default_prompt_name": p.default_prompt_name,
            "max_seq_length": p.max_seq_length,
            "special_tokens": p.special_tokens or None,
            "variant": entry.model.variant,
            "variants": sorted(p.variants),
            "agreement": agreements(p),
            "provider": entry.model.backend.provider,
            "warmup_seconds": round(entry.model.warmup_seconds, 4),
            "endpoints": [
                *(SPARSE_ENDPOINTS if p.sparse else ENDPOINTS_BY_TASK.get(p.task, ())),
                *ANY_TASK_ENDPOINTS,
            ],
        }
    )


def agreements(package: ModelPackage) -> dict[str, VariantAgreement] | None:
    """Each variant's recorded agreement with fp32, int8 left out by the export included."""
    out = {}
    for variant, entry in package.parity.items():
        record = package.agreement(variant)
        if record is None:
            continue
        out[variant] = VariantAgreement(
            metrics=record["metrics"],
            gate=record["gate"],
            passed=record["passed"],
            sample=(record.get("sample") or {}).get("inputs"),
            choice=(record.get("choice") or {}).get("name"),
            written=entry.get("written", True) and variant in package.variants,
        )
    return out or None


@router.get("/models", response_model=ModelsResponse, responses={401: ERRORS[401]})
async def list_models(registry: RegistryDep, settings: SettingsDep) -> ModelsResponse:
    limits = Limits(
        max_batch_tokens=settings.max_batch_tokens,
        max_batch_size=settings.max_batch_size,
        max_client_batch_size=settings.max_client_batch_size,
        max_text_chars=settings.max_text_chars,
        payload_limit=settings.payload_limit,
        request_timeout=settings.request_timeout,
    )
    ready = [e.model for e in registry.entries if e.model is not None]
    chosen = defaults(ready, settings.default_model)
    return ModelsResponse(
        models=[
            describe(e, [use for use, name in chosen.items() if name == e.name], registry)
            for e in registry.entries
        ],
        defaults=chosen,
        limits=limits,
    )


# -- OpenAI's models API: what /v1/embeddings serves ----


def openai_models(registry: Registry) -> list[OpenAIModel]:
    """The ready dense embedding models (/v1/embeddings' `model`), as OpenAI lists models."""
    return [
        OpenAIModel(id=m.name, created=int(m.loaded_at), owned_by="bert-heads")
        for e in registry.entries
        if (m := e.model) is not None and unfit(m.package, "embedding") is None
    ]


@router.get("/v1/models", response_model=OpenAIModelList, responses={401: ERRORS[401]})
async def list_openai_models(registry: RegistryDep) -> OpenAIModelList:
    """OpenAI's `models.list()`: the models /v1/embeddings can serve."""
    return OpenAIModelList(data=openai_models(registry))


@router.get(
    "/v1/models/{model_id}",
    response_model=OpenAIModel,
    responses={k: ERRORS[k] for k in (401, 404)},
)
async def retrieve_openai_model(model_id: str, registry: RegistryDep) -> OpenAIModel:
    """OpenAI's `models.retrieve(id)`: 404 unless /v1/embeddings can serve it."""
    for model in openai_models(registry):
        if model.id == model_id:
            return model
    raise ModelNotFound(
        f"no embedding model named {model_id!r}; GET /v1/models lists what /v1/embeddings serves"
    )


# -- model control (explicit): the admin key only ---------------------------------------------


def require_admin_key(request: Request) -> None:
    """403 unless model_control is explicit; 401 unless `Authorization: Bearer <admin_key>`
    (an inference key is not one)."""
    settings = request.app.state.settings
    if settings.model_control != "explicit" or settings.admin_key is None:
        raise Forbidden(
            "model control is off: start with BERT_HEADS_MODEL_CONTROL=explicit and "
            "BERT_HEADS_ADMIN_KEY to load and unload by request"
        )
    require_bearer(request, request.app.state.admin_keys, "admin key")


AdminKey = Depends(require_admin_key)
CONTROL_ERRORS: dict[int | str, dict[str, Any]] = {k: ERRORS[k] for k in (401, 403, 404, 422)}


@control.post(
    "/models/{name}/load",
    response_model=ModelInfo,
    responses=CONTROL_ERRORS,
    dependencies=[AdminKey],
)
async def load_model(name: str, request: Request) -> ModelInfo:
    """Load model_dir/<name>, or reload it: the new version opens and warms up beside the one
    serving, then takes the new requests; a package that fails leaves the old one serving
    (422 says why)."""
    engine = request.app.state.engine
    try:
        await engine.load(name)
    except (ServiceError, InvalidInput):
        raise
    except Exception as exc:
        raise InputError(f"model {name!r} did not load: {type(exc).__name__}: {exc}") from None
    entry = engine.registry.entry(name)
    return describe(entry, registry=engine.registry)


@control.post("/models/{name}/unload", responses=CONTROL_ERRORS, dependencies=[AdminKey])
async def unload_model(name: str, request: Request) -> dict[str, str]:
    """Stop serving `name`: new requests get 404, the ones it holds finish."""
    await request.app.state.engine.unload(name)
    return {"name": name, "state": "unloaded"}
