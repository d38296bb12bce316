"""Sentence embeddings in two dialects: POST /embed (TEI: always a list of vectors) and
POST /v1/embeddings (OpenAI: `data[].embedding`, `usage`)."""

from __future__ import annotations

import base64

from fastapi import APIRouter
from starlette.responses import Response

from heads.tasks import embed
from service.errors import InputError
from service.routes.answers import ERRORS, as_list, json_response, sizes
from service.routes.inference import Inference, InferenceRoute
from service.schemas import (
    EmbedRequest,
    EmbedResponse,
    OpenAIEmbeddingRequest,
    OpenAIEmbeddingResponse,
)

router = APIRouter(tags=["embeddings"], route_class=InferenceRoute)


@router.post("/embed", response_model=EmbedResponse, responses=ERRORS)
async def embed_texts(body: EmbedRequest, run: Inference) -> Response:
    """A list of vectors, one per input, also for a single string (as TEI answers)."""
    model = run.use("embedding", body.model)
    texts, _ = as_list(body.inputs)
    features = embed.features(model.package, body.layers, body.pooling, body.combine)
    prompt = embed.prompt(model.package, body.prompt_name)
    run.check_sizes(sizes(texts))
    job = embed.Job(
        model.package,
        texts,
        normalize=body.normalize,
        truncate=body.truncate,
        features=features,
        prompt=prompt,
    )
    return json_response(await run.run(job))  # (N, H) float32, written straight from numpy


@router.post("/v1/embeddings", response_model=OpenAIEmbeddingResponse, responses=ERRORS)
async def openai_embeddings(body: OpenAIEmbeddingRequest, run: Inference) -> Response:
    """The OpenAI embeddings API; vectors use the package's normalisation, texts over the
    window are truncated (OpenAI refuses them; truncation is what TEI does here)."""
    model = run.use("embedding", body.model)
    texts, _ = as_list(body.input)
    prompt = embed.prompt(model.package, body.prompt_name)
    run.check_sizes(sizes(texts))
    job = embed.Job(model.package, texts, truncate=True, prompt=prompt)
    vectors = await run.run(job)
    if body.dimensions is not None and body.dimensions != vectors.shape[1]:
        raise InputError(f"dimensions must be {vectors.shape[1]} for model {model.name!r}")
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
    usage = {"prompt_tokens": job.tokens, "total_tokens": job.tokens}
    return json_response({"object": "list", "data": data, "model": model.name, "usage": usage})
