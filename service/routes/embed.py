"""Sentence embeddings in two dialects: POST /embed (TEI: always a list of vectors) and
POST /v1/embeddings (OpenAI: `data[].embedding`, `usage`); POST /embed_all (TEI's: a vector
per token, also a ColBERT model's); and POST /similarity (TEI's: a source sentence's cosine
similarity to each other sentence)."""

from __future__ import annotations

import base64

import numpy as np
from fastapi import APIRouter
from starlette.responses import Response

from service.routes.answers import ERRORS, as_list, json_response
from service.routes.inference import InferenceRequest, InferenceRoute
from service.schemas import (
    EmbedAllRequest,
    EmbedAllResponse,
    EmbedRequest,
    EmbedResponse,
    OpenAIEmbeddingRequest,
    OpenAIEmbeddingResponse,
    SimilarityParameters,
    SimilarityRequest,
)

router = APIRouter(tags=["embeddings"], route_class=InferenceRoute)


@router.post("/embed", response_model=EmbedResponse, responses=ERRORS)
async def embed_texts(body: EmbedRequest, request: InferenceRequest) -> Response:
    """A list of vectors, one per input, also for a single string (as TEI answers)."""
    texts, _ = as_list(body.inputs)
    vectors = await request.engine.answer(
        body.options(), texts, model=body.model, call=request.call
    )
    return json_response(vectors)  # (N, H) float32, written straight from numpy


@router.post("/embed_all", response_model=EmbedAllResponse, responses=ERRORS)
async def embed_all(body: EmbedAllRequest, request: InferenceRequest) -> Response:
    """Per input, a vector per token: (tokens, H) of an embedding model's last hidden state,
    or a late-interaction (ColBERT) model's query or document vectors."""
    texts, _ = as_list(body.inputs)
    answers = await request.engine.answer(
        body.options(), texts, model=body.model, call=request.call
    )
    return json_response(answers)  # float32 arrays, written straight from numpy


@router.post("/v1/embeddings", response_model=OpenAIEmbeddingResponse, responses=ERRORS)
async def openai_embeddings(body: OpenAIEmbeddingRequest, request: InferenceRequest) -> Response:
    """The OpenAI embeddings API; vectors use the package's normalisation, texts over the
    window are truncated (OpenAI refuses them; truncation is what TEI does here)."""
    texts, _ = as_list(body.input)
    vectors = await request.engine.answer(
        body.options(truncate=True), texts, model=body.model, call=request.call
    )
    call = request.call  # the engine chose its model and ran its job
    assert call is not None and call.model is not None and call.job is not None
    base64_vectors = body.encoding_format == "base64"
    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode()
            if base64_vectors
            else v,
        }
        for i, v in enumerate(vectors)
    ]
    tokens = call.job.tokens  # type: ignore[attr-defined]  # an embed.Job's
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return json_response({"object": "list", "data": data, "model": call.model.name, "usage": usage})


@router.post("/similarity", response_model=list[float], responses=ERRORS)
async def similarity(body: SimilarityRequest, request: InferenceRequest) -> Response:
    """The cosine similarity of `source_sentence` to each of `sentences`, in their order (TEI's
    /similarity; huggingface_hub's InferenceClient.sentence_similarity)."""
    parameters = body.parameters or SimilarityParameters()
    texts = [body.inputs.source_sentence, *body.inputs.sentences]
    vectors = await request.engine.answer(
        parameters.options(normalize=True), texts, model=body.model, call=request.call
    )
    # normalised, and the sum of a unit vector's squares is 1 only to float32's precision
    cosine = vectors[1:].astype(np.float64) @ vectors[0].astype(np.float64)
    return json_response(np.clip(cosine, -1.0, 1.0).tolist())
