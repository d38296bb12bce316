"""POST /ner: texts -> entities with character offsets; long texts are windowed, never cut."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from service.routes.answers import ERRORS, answer, as_list
from service.routes.inference import InferenceRequest, InferenceRoute
from service.schemas import NerRequest, NerResponse

router = APIRouter(tags=["token classification"], route_class=InferenceRoute)


@router.post("/ner", response_model=NerResponse, responses=ERRORS)
async def recognize_entities(body: NerRequest, request: InferenceRequest) -> Response:
    """Per input a list of `{entity_group, score, word, start, end}` (`word` is
    `text[start:end]`); aggregation_strategy "none" gives one entry per token."""
    texts, single = as_list(body.inputs)
    entities = await request.engine.answer(
        body.options(), texts, model=body.model, call=request.call
    )
    return answer(entities, single)
