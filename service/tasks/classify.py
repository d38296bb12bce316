"""Sequence classification (sentiment, NLI, paraphrase): texts or text pairs -> labels.

    prepared = encode_pre(tokenizer, ["a fine film", ("a man sleeps", "a person rests")], 128)
    # the batcher runs prepared.sequences; stack each row's `logits` (C,) into (N, C)
    answers = encode_post(logits, labels, "single_label", top_k=None)

Semantics follow transformers' text-classification pipeline: the scoring function defaults by
problem type (single_label -> softmax, multi_label -> sigmoid, regression -> none; a single
output that is not regression -> sigmoid, since a softmax over one logit is always 1), and the
labels come sorted by score, best first. Differences, on purpose:

- every input gets a list, also with top_k=1 (the pipeline's default returns a bare dict);
- inputs longer than max_seq_length are truncated (longest_first for pairs) and counted, or
  refused with `truncate=False`; the pipeline does not truncate unless asked and then fails
  inside the model;
- the empty or whitespace-only text is classified as the empty sequence `[CLS] [SEP]`, as the
  pipeline does.
"""

from __future__ import annotations

import numpy as np
from tokenizers import Tokenizer

from service.rows import InvalidInput, Prepared, TextInput, encode_texts

__all__ = ["FUNCTIONS", "Prepared", "default_function", "encode_post", "encode_pre"]

FUNCTIONS = ("softmax", "sigmoid", "none")

# Our package.json names and the transformers config names for the same problem types.
_DEFAULTS = {
    "single_label": "softmax",
    "single_label_classification": "softmax",
    "multi_label": "sigmoid",
    "multi_label_classification": "sigmoid",
    "regression": "none",
}


def encode_pre(
    tokenizer: Tokenizer, inputs: list[TextInput], max_seq_length: int, truncate: bool = True
) -> Prepared:
    """One row per input: a text, or an (a, b) pair encoded `[CLS] a [SEP] b [SEP]`."""
    return encode_texts(tokenizer, inputs, max_seq_length, truncate)


def default_function(problem_type: str, num_labels: int) -> str:
    """The function the pipeline applies when the request names none."""
    if problem_type not in _DEFAULTS:
        raise ValueError(
            f"unknown problem_type {problem_type!r}; expected one of {sorted(_DEFAULTS)}"
        )
    if num_labels == 1 and problem_type != "regression":
        return "sigmoid"
    return _DEFAULTS[problem_type]


def _apply(function: str, logits: np.ndarray) -> np.ndarray:
    """(N, C) float32 logits -> (N, C) float64 scores."""
    x = logits.astype(np.float64)
    if function == "softmax":
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    if function == "sigmoid":
        # exp(-|x|) never overflows, for logits of either sign
        e = np.exp(-np.abs(x))
        return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    return x


def encode_post(
    logits: np.ndarray,
    labels: list[str],
    problem_type: str,
    function_to_apply: str | None = None,
    top_k: int | None = 1,
) -> list[list[dict]]:
    """logits (N, C) -> per input a list of {"label", "score"}, best first.

    function_to_apply: "softmax" | "sigmoid" | "none", or None for the problem type's default.
    top_k: how many labels per input; None for all of them.
    """
    logits = np.asarray(logits)
    if logits.ndim != 2 or logits.shape[1] != len(labels):
        raise ValueError(f"logits {logits.shape} do not match {len(labels)} labels")
    function = function_to_apply or default_function(problem_type, len(labels))
    if function.lower() not in FUNCTIONS:
        raise InvalidInput(f"function_to_apply must be one of {FUNCTIONS}, not {function!r}")
    if top_k is not None and top_k < 1:
        raise InvalidInput(f"top_k must be at least 1, not {top_k}")
    scores = _apply(function.lower(), logits)
    # A stable sort on -score keeps label order among ties, as the pipeline's sort does.
    order = np.argsort(-scores, axis=-1, kind="stable")[:, :top_k]
    return [
        [{"label": labels[j], "score": float(s[j])} for j in idx]
        for s, idx in zip(scores, order, strict=True)
    ]
