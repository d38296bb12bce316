"""Sentence embeddings: texts -> vectors.

    prepared = encode_pre(tokenizer, ["a cat sits", "a dog runs"], 256)
    # the batcher runs prepared.sequences; stack each row's `embeddings` (H,) into (N, H)
    vectors = encode_post(embeddings, normalize=True)

Pooling (mask-aware mean or CLS) happens inside the ONNX graph; normalisation is a per-request
choice and happens here. Truncation is the classifier's: the same code, one place (`_text`).
"""

from __future__ import annotations

import numpy as np
from tokenizers import Tokenizer

from service.errors import InputError
from service.tasks._text import Prepared, encode_texts

__all__ = ["EPS", "Prepared", "encode_post", "encode_pre"]

# Same floor as torch.nn.functional.normalize: an all-zero vector stays zero instead of NaN.
EPS = 1e-12


def encode_pre(
    tokenizer: Tokenizer, texts: list[str], max_seq_length: int, truncate: bool = True
) -> Prepared:
    """One row `[CLS] text [SEP]` per text; too long -> truncated (counted) or, with
    `truncate=False`, an InputError."""
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InputError(f"inputs[{i}]: expected a string")
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
