"""Sentence embeddings in two dialects: POST /embed (TEI: always a list of vectors) and
POST /v1/embeddings (OpenAI: `data[].embedding`, `usage`)."""

from __future__ import annotations

import base64

import numpy as np
from fastapi import APIRouter
from fastapi.responses import JSONResponse

from service.errors import InputError
from service.routes._shape import ERRORS, as_list, chars, json_response
from service.routes.deps import Inference, InferenceDep
from service.schemas import (
    EmbedRequest,
    EmbedResponse,
    OpenAIEmbeddingRequest,
    OpenAIEmbeddingResponse,
)
from service.tasks import embed

router = APIRouter(tags=["embeddings"])


async def _embed(
    run: Inference, texts: list[str], normalize: bool, truncate: bool
) -> tuple[np.ndarray, int]:
    """(N, H) float32 vectors and the number of tokens they took."""
    model = run.model
    run.check_sizes(texts)
    prepared = await run.tokenize(
        lambda: embed.encode_pre(model.tokenizer, texts, model.package.max_seq_length, truncate),
        chars(texts),
    )
    run.count(truncated=prepared.truncated)
    outputs = await run.run(prepared.sequences)
    vectors = await run.postprocess(
        lambda: embed.encode_post(np.stack([out["embeddings"] for out in outputs]), normalize),
    )
    return vectors, run.tokens


@router.post("/embed", response_model=EmbedResponse, responses=ERRORS)
async def embed_texts(body: EmbedRequest, run: InferenceDep) -> JSONResponse:
    """A list of vectors, one per input, also for a single string (as TEI answers)."""
    model = run.use("embedding", body.model)
    texts, _ = as_list(body.inputs)
    normalize = model.package.normalize if body.normalize is None else body.normalize
    vectors, _tokens = await _embed(run, texts, normalize, body.truncate)
    return json_response(vectors.tolist())


@router.post("/v1/embeddings", response_model=OpenAIEmbeddingResponse, responses=ERRORS)
async def openai_embeddings(body: OpenAIEmbeddingRequest, run: InferenceDep) -> JSONResponse:
    """The OpenAI embeddings API; vectors use the package's normalisation, texts over the
    window are truncated (OpenAI refuses them; truncation is what TEI does here)."""
    model = run.use("embedding", body.model)
    texts, _ = as_list(body.input)
    vectors, tokens = await _embed(run, texts, model.package.normalize, truncate=True)
    if body.dimensions is not None and body.dimensions != vectors.shape[1]:
        raise InputError(f"dimensions must be {vectors.shape[1]} for model {model.name!r}")
    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode()
            if body.encoding_format == "base64"
            else v.tolist(),
        }
        for i, v in enumerate(vectors)
    ]
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return json_response({"object": "list", "data": data, "model": model.name, "usage": usage})
