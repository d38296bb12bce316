"""POST /analyze: several heads trained on one frozen encoder (heads.adapters, kind "frozen")
over the same texts in one encoder pass: each head's answer, as its own endpoint gives it."""

from __future__ import annotations

from typing import Any, cast

from fastapi import APIRouter
from pydantic import ValidationError
from starlette.responses import Response

from heads.tasks import TaskOptions
from service.errors import InputError
from service.http import describe_validation
from service.registry import Registry
from service.routes.answers import ERRORS, as_list, json_response
from service.routes.inference import InferenceRequest, InferenceRoute
from service.schemas import AnalyzeRequest, AnalyzeResponse, ClassifyRequest, NerRequest, TaskBody

router = APIRouter(tags=["heads"], route_class=InferenceRoute)

# the endpoint body whose options a head of each task takes in /analyze
BODIES: dict[str, type[TaskBody]] = {
    "classification": ClassifyRequest,
    "token-classification": NerRequest,
}


def head_options(registry: Registry, name: str, given: dict[str, Any]) -> TaskOptions:
    """The options of head `name`, read as its task's endpoint reads them (422 naming the
    head and the option that is wrong)."""
    entry = registry.entry(name)
    task = entry.task if entry is not None else None
    body = BODIES.get(task or "")
    if body is None:
        if entry is None or entry.model is None:
            registry.select(None, name, "/analyze")  # its 404 / 503
        raise InputError(
            f"model {name!r} is for {task}; /analyze runs heads of "
            f"{' and '.join(BODIES)} trained on a frozen encoder"
        )
    if "model" in given or "inputs" in given:
        raise InputError(f"models.{name}: 'inputs' and 'model' are the request's, not a head's")
    try:
        return body.model_validate({"inputs": "-", **given}).options()  # type: ignore[no-any-return]
    except ValidationError as e:
        raise InputError(
            f"models.{name}: {describe_validation(cast(list[dict[str, Any]], e.errors()))}"
        ) from None


@router.post("/analyze", response_model=AnalyzeResponse, responses=ERRORS)
async def analyze(body: AnalyzeRequest, request: InferenceRequest) -> Response:
    """{head name: its answer} for heads trained on one frozen encoder, from one pass of it."""
    texts, _ = as_list(body.inputs)
    named = body.models if isinstance(body.models, dict) else dict.fromkeys(body.models, {})
    registry = request.engine.registry
    heads = {name: head_options(registry, name, given) for name, given in named.items()}
    answers = await request.engine.analyze(heads, texts, call=request.call)
    return json_response(answers)
