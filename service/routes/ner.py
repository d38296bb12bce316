"""POST /ner: texts -> entities with character offsets; long texts are windowed, never cut."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from heads.tasks import ner
from service.routes.answers import ERRORS, answer, as_list, sizes
from service.routes.inference import Inference, InferenceRoute
from service.schemas import NerRequest, NerResponse

router = APIRouter(tags=["token classification"], route_class=InferenceRoute)


@router.post("/ner", response_model=NerResponse, responses=ERRORS)
async def recognize_entities(body: NerRequest, run: Inference) -> Response:
    """Per input a list of `{entity_group, score, word, start, end}` (`word` is
    `text[start:end]`); aggregation_strategy "none" gives one entry per token."""
    model = run.use("token-classification", body.model)
    texts, single = as_list(body.inputs)
    run.check_sizes(sizes(texts))
    job = ner.Job(
        model.package,
        texts,
        aggregation_strategy=body.aggregation_strategy,
        ignore_labels=body.ignore_labels,
        stride=body.stride,
    )
    return answer(await run.run(job), single)
