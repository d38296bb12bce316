"""Sentence embeddings: texts -> vectors.

    prepared = encode_pre(tokenizer, ["a cat sits", "a dog runs"], 256)
    # the batcher runs prepared.sequences; stack each row's `embeddings` (H,) into (N, H)
    vectors = encode_post(embeddings, normalize=True)

Pooling (mask-aware mean or CLS) happens inside the ONNX graph; normalisation is a per-request
choice and happens here. Truncation is the classifier's: the same code, one place (`_text`).

Layer features (Devlin et al. 2018 §5.3): a package exported with `--hidden-states` also
outputs every layer's states pooled both ways, (L + 1, H) per input, embeddings output first;
`combine_layers` picks layers from them (-1 the last, as Python indexes) and joins them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tokenizers import Tokenizer

from service.contract import HIDDEN_STATE_OUTPUTS
from service.rows import InvalidInput, Prepared, encode_texts

__all__ = [
    "EPS",
    "LAYER_OUTPUTS",
    "Prepared",
    "combine_layers",
    "encode_post",
    "encode_pre",
    "hidden_states",
]

# Same floor as torch.nn.functional.normalize: an all-zero vector stays zero instead of NaN.
EPS = 1e-12
# pooling -> the output holding every layer's states pooled that way (training.export writes it).
LAYER_OUTPUTS = HIDDEN_STATE_OUTPUTS
COMBINE = ("concat", "sum", "mean")


def encode_pre(
    tokenizer: Tokenizer, texts: list[str], max_seq_length: int, truncate: bool = True
) -> Prepared:
    """One row `[CLS] text [SEP]` per text; too long -> truncated (counted) or, with
    `truncate=False`, an InvalidInput."""
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InvalidInput(f"inputs[{i}]: expected a string")
    return encode_texts(tokenizer, list(texts), max_seq_length, truncate)


def encode_post(embeddings: np.ndarray, normalize: bool) -> np.ndarray:
    """(N, H) pooled embeddings -> (N, H) float32, L2-normalised when asked."""
    x = np.asarray(embeddings, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"embeddings must be (N, H), got {x.shape}")
    if not normalize:
        return x
    # The norm in float64: fp16 graphs can hand back values whose squares overflow float16/32.
    norms = np.linalg.norm(x.astype(np.float64), axis=-1, keepdims=True)
    return (x / np.maximum(norms, EPS)).astype(np.float32)


def hidden_states(outputs: list[dict[str, Any]]) -> int | None:
    """How many hidden states (L + 1) a package's outputs hold per pooling; None without."""
    shapes = {o["name"]: o.get("shape", []) for o in outputs}
    if not all(name in shapes for name in LAYER_OUTPUTS.values()):
        return None
    return int(shapes[LAYER_OUTPUTS["mean"]][1])


def check_layers(layers: list[int], n_states: int) -> list[int]:
    """Request indices -> indices into the n_states states; out of range is an InvalidInput."""
    bad = [i for i in layers if not -n_states <= i < n_states]
    if bad:
        raise InvalidInput(
            f"layers {bad} out of range: this model has {n_states} hidden states "
            f"(0 the embeddings output, {n_states - 1} or -1 the last layer)"
        )
    return [i % n_states for i in layers]


def combine_layers(states: np.ndarray, layers: list[int], combine: str) -> np.ndarray:
    """states (N, L + 1, H) -> (N, k H) the k chosen layers concatenated in request order, or
    (N, H) their sum or mean."""
    chosen = states[:, check_layers(layers, states.shape[1])]  # (N, k, H)
    if combine == "concat":
        return chosen.reshape(len(chosen), -1)
    if combine == "sum":
        return chosen.sum(axis=1)
    if combine == "mean":
        return chosen.mean(axis=1)
    raise ValueError(f"combine must be one of {COMBINE}, not {combine!r}")
