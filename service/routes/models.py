"""GET /models: every package found, loaded or not, with what it runs on and the limits."""

from __future__ import annotations

from fastapi import APIRouter

from heads.tasks import embed
from service.metrics import ANY_TASK_ENDPOINTS, ENDPOINTS_BY_TASK, SPARSE_ENDPOINTS
from service.registry import Entry
from service.routes.answers import ERRORS
from service.routes.deps import ApiKey, RegistryDep
from service.schemas import Limits, ModelInfo, ModelsResponse

router = APIRouter(tags=["models"], dependencies=[ApiKey])


def describe(entry: Entry) -> ModelInfo:
    info = ModelInfo(
        name=entry.name, path=str(entry.path), state=entry.state, error=entry.error, task=entry.task
    )
    if entry.model is None:
        return info
    p = entry.model.package
    return info.model_copy(
        update={
            "labels": p.labels,
            "problem_type": p.problem_type,
            "pooling": p.pooling,
            "normalize": p.normalize if p.task == "embedding" else None,
            "hidden_states": embed.hidden_states(p.outputs) if p.task == "embedding" else None,
            "prompts": p.prompts or None,
            "default_prompt_name": p.default_prompt_name,
            "max_seq_length": p.max_seq_length,
            "variant": entry.model.variant,
            "variants": sorted(p.variants),
            "provider": entry.model.backend.provider,
            "warmup_seconds": round(entry.model.warmup_seconds, 4),
            "endpoints": [
                *(SPARSE_ENDPOINTS if p.sparse else ENDPOINTS_BY_TASK.get(p.task, ())),
                *ANY_TASK_ENDPOINTS,
            ],
        }
    )


@router.get("/models", response_model=ModelsResponse, responses={401: ERRORS[401]})
async def list_models(registry: RegistryDep) -> ModelsResponse:
    s = registry.settings
    limits = Limits(
        max_batch_tokens=s.max_batch_tokens,
        max_batch_size=s.max_batch_size,
        max_client_batch_size=s.max_client_batch_size,
        max_text_chars=s.max_text_chars,
        payload_limit=s.payload_limit,
        request_timeout=s.request_timeout,
    )
    return ModelsResponse(models=[describe(e) for e in registry.entries], limits=limits)
