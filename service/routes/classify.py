"""POST /classify: texts or text pairs -> labels with scores, best first."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from service.routes.answers import ERRORS, answer
from service.routes.inference import InferenceRequest, InferenceRoute
from service.schemas import ClassifyRequest, ClassifyResponse

router = APIRouter(tags=["classification"], route_class=InferenceRoute)


@router.post("/classify", response_model=ClassifyResponse, responses=ERRORS)
async def classify_texts(body: ClassifyRequest, request: InferenceRequest) -> Response:
    """One list of `{label, score}` per input (top_k of them; null = all labels). The Hugging
    Face form (`parameters`) gets a list of such lists also for one input, as
    InferenceClient.text_classification parses it."""
    single = isinstance(body.inputs, str) and body.parameters is None
    inputs = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    labels = await request.engine.answer(
        body.options(), inputs, model=body.model, call=request.call
    )
    return answer(labels, single)
