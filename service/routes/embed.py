"""Sentence embeddings in two dialects: POST /embed (TEI: always a list of vectors) and
POST /v1/embeddings (OpenAI: `data[].embedding`, `usage`)."""

from __future__ import annotations

import base64
from dataclasses import dataclass

import numpy as np
from fastapi import APIRouter
from fastapi.responses import JSONResponse

from service.errors import InputError
from service.package import ModelPackage
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


@dataclass(frozen=True)
class Features:
    """Which hidden states make the vector (Devlin et al. §5.3); None: the package's."""

    output: str  # one of embed.LAYER_OUTPUTS' values
    layers: list[int]
    combine: str


def _features(body: EmbedRequest, package: ModelPackage) -> Features | None:
    """The request's layers / pooling, checked against what the package exports."""
    pooling = body.pooling or package.pooling or "mean"  # read_package checks it is set
    if body.layers is None and pooling == package.pooling:
        return None  # the package's own embedding output
    n_states = embed.hidden_states(package.outputs)
    if n_states is None:
        raise InputError(
            f"model {package.name!r} has no hidden-state outputs, so `layers` and a `pooling` "
            f"other than its own ({package.pooling}) cannot be served; export it with "
            "`python -m training.export --task embedding --hidden-states`"
        )
    layers = body.layers if body.layers is not None else [-1]
    embed.check_layers(layers, n_states)  # a 422 before any compute
    return Features(embed.LAYER_OUTPUTS[pooling], layers, body.combine)


async def _embed(
    run: Inference,
    texts: list[str],
    normalize: bool,
    truncate: bool,
    features: Features | None = None,
) -> tuple[np.ndarray, int]:
    """(N, H) float32 vectors (N, F with layer features) and the number of tokens they took."""
    model = run.model
    run.check_sizes(texts)
    prepared = await run.tokenize(
        lambda: embed.encode_pre(model.tokenizer, texts, model.package.max_seq_length, truncate),
        chars(texts),
    )
    run.count(truncated=prepared.truncated)
    outputs = await run.run(prepared.sequences)

    def post() -> np.ndarray:
        if features is None:
            return embed.encode_post(np.stack([out["embeddings"] for out in outputs]), normalize)
        states = np.stack([out[features.output] for out in outputs])  # (N, L + 1, H)
        vectors = embed.combine_layers(states, features.layers, features.combine)
        return embed.encode_post(vectors, normalize)

    vectors = await run.postprocess(post)
    return vectors, run.tokens


@router.post("/embed", response_model=EmbedResponse, responses=ERRORS)
async def embed_texts(body: EmbedRequest, run: InferenceDep) -> JSONResponse:
    """A list of vectors, one per input, also for a single string (as TEI answers)."""
    model = run.use("embedding", body.model)
    texts, _ = as_list(body.inputs)
    normalize = model.package.normalize if body.normalize is None else body.normalize
    features = _features(body, model.package)
    vectors, _tokens = await _embed(run, texts, normalize, body.truncate, features)
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
