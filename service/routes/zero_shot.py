"""POST /zero-shot: texts and labels chosen per request, scored by an NLI model as the
transformers zero-shot-classification pipeline scores them."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from service.routes.answers import ERRORS, answer, as_list
from service.routes.inference import InferenceRequest, InferenceRoute
from service.schemas import LabelScore, ZeroShotAnswer, ZeroShotRequest

router = APIRouter(tags=["classification"], route_class=InferenceRoute)


@router.post(
    "/zero-shot",
    response_model=ZeroShotAnswer
    | list[ZeroShotAnswer]
    | list[LabelScore]
    | list[list[LabelScore]],
    responses=ERRORS,
)
async def zero_shot(body: ZeroShotRequest, request: InferenceRequest) -> Response:
    """Per input `{sequence, labels, scores}`, best first (one object for a single string, as
    the pipeline answers). The Hugging Face form (`parameters`) gets per input a list of
    `{label, score}`, as InferenceClient.zero_shot_classification parses it."""
    texts, single = as_list(body.inputs)
    answers = await request.engine.answer(
        body.options(), texts, model=body.model, call=request.call
    )
    if body.parameters is not None:
        return answer(
            [
                [
                    {"label": label, "score": score}
                    for label, score in zip(a["labels"], a["scores"], strict=True)
                ]
                for a in answers
            ],
            single,
        )
    return answer(answers, single)
