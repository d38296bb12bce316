"""Reranking in three dialects: POST /rerank (text-embeddings-inference's), POST /v1/rerank
(Cohere's v1, as Jina and infinity serve it) and POST /v2/rerank (Cohere's v2, ClientV2). One
path: the engine's rerank task; each counts documents against max_client_batch_size, never the
query."""

from __future__ import annotations

import uuid

from fastapi import APIRouter
from starlette.responses import Response

from service.routes.answers import ERRORS, json_response
from service.routes.inference import InferenceRequest, InferenceRoute
from service.schemas import (
    CohereRerankRequest,
    CohereRerankResponse,
    OpenRerankRequest,
    OpenRerankResponse,
    Rank,
    RerankRequest,
)

router = APIRouter(tags=["reranking"], route_class=InferenceRoute)


@router.post("/rerank", response_model=list[Rank], responses=ERRORS)
async def rerank_texts(body: RerankRequest, request: InferenceRequest) -> Response:
    """Every document's `{index, score}`, best first (`text` with return_text)."""
    ranked = await request.engine.answer(
        body.options(), body.texts, model=body.model, call=request.call
    )
    if body.return_text:
        ranked = [{**r, "text": body.texts[r["index"]]} for r in ranked]
    return json_response(ranked)


@router.post("/v1/rerank", response_model=OpenRerankResponse, responses=ERRORS)
async def open_rerank(body: OpenRerankRequest, request: InferenceRequest) -> Response:
    """The best top_n documents as `{index, relevance_score}` (`document` with
    return_documents), with the model and the tokens read."""
    texts = [d if isinstance(d, str) else d.text for d in body.documents]
    ranked = await request.engine.answer(body.options(), texts, model=body.model, call=request.call)
    call = request.call  # the engine chose its model and ran its job
    assert call is not None and call.model is not None and call.job is not None
    results = []
    for r in ranked:
        item = {"index": r["index"], "relevance_score": r["score"]}
        if body.return_documents:
            item["document"] = {"text": texts[r["index"]]}
        if "window" in r:
            item["window"] = r["window"]
        results.append(item)
    usage = {"total_tokens": call.job.tokens}  # type: ignore[attr-defined]  # a rerank.Job's
    return json_response({"results": results, "model": call.model.name, "usage": usage})


@router.post("/v2/rerank", response_model=CohereRerankResponse, responses=ERRORS)
async def cohere_rerank(body: CohereRerankRequest, request: InferenceRequest) -> Response:
    """Cohere's v2 rerank (ClientV2.rerank): the best top_n documents as `{index,
    relevance_score}`, each document read up to max_tokens_per_doc tokens."""
    ranked = await request.engine.answer(
        body.options(), body.documents, model=body.model, call=request.call
    )
    call = request.call
    assert call is not None and call.job is not None  # the engine ran it
    results = [{"index": r["index"], "relevance_score": r["score"]} for r in ranked]
    meta = {
        "api_version": {"version": "2"},
        "billed_units": {"search_units": 1},
        "tokens": {"input_tokens": call.job.tokens},  # type: ignore[attr-defined]  # a rerank.Job's
    }
    return json_response({"id": str(uuid.uuid4()), "results": results, "meta": meta})
