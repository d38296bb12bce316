"""POST /tokenize and POST /decode (TEI's shapes): what a model reads, for any package."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from service.routes.answers import ERRORS, as_list, json_response
from service.routes.inference import InferenceRequest, InferenceRoute
from service.schemas import DecodeRequest, SimpleToken, TokenizeRequest

router = APIRouter(tags=["tokenization"], route_class=InferenceRoute)


@router.post("/tokenize", response_model=list[list[SimpleToken]], responses=ERRORS)
async def tokenize_texts(body: TokenizeRequest, request: InferenceRequest) -> Response:
    """Per input its tokens, with character offsets into it; nothing is truncated (a list of
    lists also for a single string, as TEI answers)."""
    texts, _ = as_list(body.inputs)
    tokens = await request.engine.answer(body.options(), texts, model=body.model, call=request.call)
    return json_response(tokens)


@router.post("/decode", response_model=list[str], responses=ERRORS)
async def decode_ids(body: DecodeRequest, request: InferenceRequest) -> Response:
    """Per id list its text (a list also for one id list, as TEI answers)."""
    ids = body.ids if body.ids and isinstance(body.ids[0], list) else [body.ids]
    texts = await request.engine.answer(body.options(), ids, model=body.model, call=request.call)
    return json_response(texts)
