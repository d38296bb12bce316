"""POST /qa: (question, context) -> answer spans of the context; long contexts are windowed
and the best span over all windows wins."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from service.routes.answers import ERRORS, answer
from service.routes.inference import InferenceRequest, InferenceRoute
from service.schemas import QaRequest, QaResponse

router = APIRouter(tags=["question answering"], route_class=InferenceRoute)


@router.post("/qa", response_model=QaResponse, responses=ERRORS)
async def answer_questions(body: QaRequest, request: InferenceRequest) -> Response:
    """`{answer, score, start, end}` per input (a list of top_k of them when top_k > 1;
    null when the context has no valid span)."""
    if body.inputs is None:
        assert body.question is not None and body.context is not None  # schema-checked
        pairs, single = [(body.question, body.context)], True
    else:
        pairs, single = [(item.question, item.context) for item in body.inputs], False
    spans = await request.engine.answer(body.options(), pairs, model=body.model, call=request.call)
    return answer(spans, single)
