"""POST /fill-mask (the transformers fill-mask pipeline's answers) and POST /embed_sparse
(text-embeddings-inference's sparse embeddings), from masked-LM packages."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.responses import Response

from service.routes.answers import ERRORS, answer, as_list, json_response
from service.routes.inference import InferenceRequest, InferenceRoute
from service.schemas import Filler, FillMaskRequest, SparseEmbedRequest, SparseValue

router = APIRouter(tags=["masked LM"], route_class=InferenceRoute)
FillMaskAnswer = list[Filler] | list[list[Filler]]


@router.post("/fill-mask", response_model=FillMaskAnswer | list[FillMaskAnswer], responses=ERRORS)
async def fill_mask(body: FillMaskRequest, request: InferenceRequest) -> Response:
    """Per input the top_k fillers of its mask (a list of lists with several masks); one
    input's answer alone for a single string, as the pipeline answers."""
    texts, single = as_list(body.inputs)
    answers: list[Any] = await request.engine.answer(
        body.options(), texts, model=body.model, call=request.call
    )
    return answer(answers, single)


@router.post("/embed_sparse", response_model=list[list[SparseValue]], responses=ERRORS)
async def embed_sparse(body: SparseEmbedRequest, request: InferenceRequest) -> Response:
    """Per input its non-zero vocabulary weights, by index (a list also for one string)."""
    texts, _ = as_list(body.inputs)
    entries = await request.engine.answer(
        body.options(), texts, model=body.model, call=request.call
    )
    return json_response(entries)
