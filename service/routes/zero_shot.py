"""POST /zero-shot: texts and labels chosen per request, scored by an NLI model as the
transformers zero-shot-classification pipeline scores them."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from service.routes.answers import ERRORS, answer, as_list
from service.routes.inference import Inference, InferenceRoute
from service.schemas import ZeroShotAnswer, ZeroShotRequest

router = APIRouter(tags=["classification"], route_class=InferenceRoute)


@router.post("/zero-shot", response_model=ZeroShotAnswer | list[ZeroShotAnswer], responses=ERRORS)
async def zero_shot(body: ZeroShotRequest, run: Inference) -> Response:
    """Per input `{sequence, labels, scores}`, best first (one object for a single string, as
    the pipeline answers)."""
    texts, single = as_list(body.inputs)
    labels = body.candidate_labels
    if isinstance(labels, str):  # the pipeline's comma-separated form
        labels = [label.strip() for label in labels.split(",") if label.strip()]
    answers = await run.engine.zero_shot(
        texts,
        labels,
        model=body.model,
        hypothesis_template=body.hypothesis_template,
        multi_label=body.multi_label,
        call=run,
    )
    return answer(answers, single)
