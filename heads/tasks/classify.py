"""Sequence classification (sentiment, NLI, paraphrase): texts or text pairs -> labels.

    encoded = preprocess(tokenizer, ["a fine film", ("a man sleeps", "a person rests")], 128)
    # the batcher runs encoded.sequences; stack each row's `logits` (C,) into (N, C)
    answers = postprocess(logits, labels, "single_label", top_k=None)

The service runs the same two steps as a `Job` (see heads.tasks), one per request.

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

from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Encoding, Tokenizer

from heads.contract import HF_PROBLEM_TYPES, PROBLEM_TYPES
from heads.package import ModelPackage
from heads.rows import (
    EncodedTexts,
    InvalidInput,
    ModelRow,
    Outputs,
    TextInput,
    encode_texts,
    flatten,
    template,
    text_rows,
)
from heads.tasks import TaskOptions

__all__ = ["FUNCTIONS", "Job", "default_function", "postprocess", "preprocess"]

FUNCTIONS = ("softmax", "sigmoid", "none")

# The pipeline's function per problem type (the package's short names, heads.contract).
_DEFAULTS = dict(zip(PROBLEM_TYPES, ("softmax", "sigmoid", "none"), strict=True))


def preprocess(
    tokenizer: Tokenizer, inputs: list[TextInput], max_seq_length: int, truncate: bool = True
) -> EncodedTexts:
    """One row per input: a text, or an (a, b) pair encoded `[CLS] a [SEP] b [SEP]`."""
    return encode_texts(tokenizer, inputs, max_seq_length, truncate)


def default_function(problem_type: str, num_labels: int) -> str:
    """The function the pipeline applies when the request names none."""
    # a transformers config's long name means the same problem type
    problem_type = HF_PROBLEM_TYPES.get(problem_type, problem_type)
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


def postprocess(
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
    function = _function(problem_type, len(labels), function_to_apply, top_k)
    return _ranked(_apply(function, logits), labels, top_k)


def _function(
    problem_type: str, num_labels: int, function_to_apply: str | None, top_k: int | None
) -> str:
    """The scoring function to apply; InvalidInput for an unknown one or top_k < 1."""
    function = function_to_apply or default_function(problem_type, num_labels)
    if function.lower() not in FUNCTIONS:
        raise InvalidInput(f"function_to_apply must be one of {FUNCTIONS}, not {function!r}")
    if top_k is not None and top_k < 1:
        raise InvalidInput(f"top_k must be at least 1, not {top_k}")
    return function.lower()


def _ranked(scores: np.ndarray, labels: list[str], top_k: int | None) -> list[list[dict]]:
    """(N, C) scores -> per row the top_k {"label", "score"}, best first."""
    # A stable sort on -score keeps label order among ties, as the pipeline's sort does.
    order = np.argsort(-scores, axis=-1, kind="stable")[:, :top_k]
    best = np.take_along_axis(scores, order, axis=-1).tolist()  # Python floats in one call
    return [
        [{"label": labels[j], "score": s} for j, s in zip(idx, row, strict=True)]
        for idx, row in zip(order.tolist(), best, strict=True)
    ]


@dataclass(frozen=True, kw_only=True)
class Options(TaskOptions):
    """/classify's options: top_k labels per input (None: all), the scoring function (None:
    the problem type's), and what to do with an input over the window."""

    task = "classification"

    top_k: int | None = 1
    function_to_apply: str | None = None
    truncate: bool = True
    truncation_direction: str = "right"

    def job(self, package: ModelPackage, inputs: list[Any]) -> Job:
        return Job(package, inputs, self)


class Job:
    """One /classify request for a model's batcher: inputs -> one row each -> per input a list
    of {"label", "score"} (`postprocess`)."""

    windowed = 0

    def __init__(
        self,
        package: ModelPackage,
        inputs: list[str] | list[TextInput],
        options: Options = Options(),
    ) -> None:
        self.inputs, self.texts = inputs, flatten(inputs)
        self.direction = options.truncation_direction
        self.labels = package.labels or []
        self.problem_type = package.problem_type or "single_label"
        self.max_seq_length = package.max_seq_length
        self.top_k, self.truncate = options.top_k, options.truncate
        # checked here, so a bad option is a 422 before any compute
        self.function = _function(
            self.problem_type, len(self.labels), options.function_to_apply, options.top_k
        )
        self.truncated = 0

    def rows(self, tokenizer: Tokenizer, encodings: list[Encoding]) -> list[ModelRow]:
        encoded = text_rows(
            template(tokenizer),
            self.inputs,
            encodings,
            self.max_seq_length,
            self.truncate,
            self.direction,
        )
        self.truncated = encoded.truncated
        return encoded.sequences

    def answer(self, outputs: list[Outputs]) -> list[Any]:
        return Job.answer_many([self], [outputs])[0]

    @staticmethod
    def answer_many(jobs: list[Job], outputs: list[list[Outputs]]) -> list[list[Any]]:
        """The answers of several jobs of one model: one scoring and one sort over all their
        rows per (function, top_k), instead of one per job (the batcher's worker thread spends
        most of a small request's post-processing on numpy's per-call overhead)."""
        first = jobs[0]
        logits = np.stack([out["logits"] for outs in outputs for out in outs])  # (N, C)
        if logits.shape[1] != len(first.labels):
            raise ValueError(f"logits {logits.shape} do not match {len(first.labels)} labels")
        bounds = np.cumsum([0] + [len(outs) for outs in outputs]).tolist()
        answers: list[list[Any]] = [[] for _ in jobs]
        by_options: dict[tuple[str, int | None], list[int]] = {}
        for j, job in enumerate(jobs):
            key = (job.function, job.top_k)
            by_options.setdefault(key, []).append(j)
        for (function, top_k), js in by_options.items():
            rows = np.concatenate([np.arange(bounds[j], bounds[j + 1]) for j in js])
            ranked = iter(_ranked(_apply(function, logits[rows]), first.labels, top_k))
            for j in js:
                answers[j] = [next(ranked) for _ in range(bounds[j + 1] - bounds[j])]
        return answers
