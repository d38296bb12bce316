"""Reranking with a cross-encoder: a query and documents -> each document's relevance, best
first. The model is a classification package of a sequence-pair classifier (ms-marco-MiniLM,
bge-reranker...): each document is scored in a row `[CLS] query [SEP] document [SEP]`.

    job = Job(package, "what is a cat?", ["A cat is a small mammal.", "Paris is big."])
    # the batcher runs job.rows(...); each row's Outputs has `logits` (C,)
    ranked = job.answer(outputs)   # [{"index": 0, "score": 0.97}, {"index": 1, "score": 0.02}]

Scores as sentence-transformers' `CrossEncoder.predict`: one label -> sigmoid of its logit
(`raw_scores`: the logit itself); two labels (a relevant / not-relevant classifier) -> the
softmax probability of the second label (`raw_scores`: its logit); other label counts are
refused, as no score means relevance there.

Long documents (beyond the peers, which cut them): with `truncate=False` (the default) a
document that does not fit beside the query is scored by windows of it, each beside the whole
query, consecutive windows sharing `stride` tokens, and the document scores as its best window
("MaxP", Dai & Callan 2019); the answer names that window by character offsets into the
document. `truncate=True` cuts the pair to the model's window instead (longest_first, as the
CrossEncoder's tokenizer call does; `truncation_direction` which end), one row per document.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Encoding, Tokenizer

from heads.package import ModelPackage
from heads.rows import (
    InvalidInput,
    ModelRow,
    Outputs,
    TextInput,
    row,
    template,
    text_rows,
    windows,
)
from heads.tasks import TaskOptions, late_interaction, one_by_one
from heads.tasks.qa import default_stride
from heads.tasks.ranking import Window, ranked

__all__ = ["Job", "scores"]


def scores(logits: np.ndarray, raw: bool) -> np.ndarray:
    """(N, C) logits -> (N,) relevance (see the module docstring); C must be 1 or 2."""
    if logits.shape[1] == 1:
        x = logits[:, 0].astype(np.float64)
        return x if raw else 1 / (1 + np.exp(-x))
    if raw:
        return logits[:, 1].astype(np.float64)
    shifted = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    return e[:, 1] / e.sum(axis=1)


@dataclass(frozen=True, kw_only=True)
class Options(TaskOptions):
    """A rerank request's query and options: raw logits instead of relevance scores, truncate
    a long document instead of scoring it by windows (cut from `truncation_direction`), the
    best `top_n` only, each document's first `max_tokens_per_doc` tokens only (Cohere's), and
    a single-text classifier allowed (service.selection). `max_tokens_per_query`: the
    query's first N tokens only (vLLM's, beside max_tokens_per_doc). `stride`: the document
    tokens consecutive windows share (None: qa.default_stride); no HTTP body sets it. A
    late-interaction (ColBERT) package answers with the same options
    (heads.tasks.late_interaction.Job)."""

    task = "classification"
    use = "rerank"

    query: str
    raw_scores: bool = False
    truncate: bool = False
    truncation_direction: str = "right"
    top_n: int | None = None
    max_tokens_per_doc: int | None = None
    max_tokens_per_query: int | None = None
    allow_single_text: bool = False
    stride: int | None = None

    def job(self, package: ModelPackage, inputs: list[Any]) -> Job | late_interaction.Job:
        if package.task == "late-interaction":
            return late_interaction.Job(package, inputs, self)
        return Job(package, inputs, self)

    def sized(self, inputs: list[Any]) -> dict[str, list[Any]]:
        # a row each, sized as the (query, document) pair it is; the query is never counted
        return {"documents": [(self.query, document) for document in inputs]}


class Job:
    """One /rerank request for a classification package's batcher: the query and documents ->
    per document `{index, score}` (and `window` when the document was windowed), best first,
    at most `top_n`."""

    def __init__(self, package: ModelPackage, documents: list[str], options: Options) -> None:
        query, raw_scores, truncate = options.query, options.raw_scores, options.truncate
        truncation_direction, top_n = options.truncation_direction, options.top_n
        stride, max_tokens_per_doc = options.stride, options.max_tokens_per_doc
        n_labels = len(package.labels or [])
        if n_labels not in (1, 2):
            raise InvalidInput(
                f"model {package.name!r} has {n_labels} labels; a reranker (cross-encoder) "
                "has one relevance score (or two labels, relevant second)"
            )
        if not documents:
            raise InvalidInput("texts is empty; send at least one document")
        self.query, self.documents = query, documents
        self.texts = [query, *documents]
        self.max_seq_length = package.max_seq_length
        self.raw, self.truncate, self.direction = raw_scores, truncate, truncation_direction
        self.top_n, self.stride = top_n, stride
        self.max_tokens_per_doc = max_tokens_per_doc  # Cohere's: a document's first N tokens
        self.max_tokens_per_query = options.max_tokens_per_query  # vLLM's: the query's
        self.truncated = self.windowed = self.tokens = 0
        self.spans: list[Window | None] = []  # per row: its window, None when not windowed
        self.bounds: list[int] = []  # document i's rows are [bounds[i], bounds[i + 1])

    def rows(self, tokenizer: Tokenizer, encodings: list[Encoding]) -> list[ModelRow]:
        layout = template(tokenizer)
        q, docs = encodings[0], encodings[1:]
        if self.max_tokens_per_query is not None and len(q.ids) > self.max_tokens_per_query:
            q.truncate(self.max_tokens_per_query)  # in place: the job's own encoding
        if self.max_tokens_per_doc is not None:
            for d in docs:  # in place: the job's own encodings
                if len(d.ids) > self.max_tokens_per_doc:
                    d.truncate(self.max_tokens_per_doc)
        if self.truncate:
            pairs: list[TextInput] = [(self.query, d) for d in self.documents]
            flat = [e for d in docs for e in (q, d)]
            encoded = text_rows(layout, pairs, flat, self.max_seq_length, True, self.direction)
            self.truncated = encoded.truncated
            self.spans = [None] * len(docs)
            self.bounds = list(range(len(docs) + 1))
            self.tokens = sum(len(r) for r in encoded.sequences)
            return encoded.sequences
        room = self.max_seq_length - layout.pair.n_special - len(q.ids)
        if room < 1:
            raise InvalidInput(
                f"the query is {len(q.ids)} tokens: no room for a document in this model's "
                f"window of {self.max_seq_length}; shorten it or send truncate: true"
            )
        stride = default_stride(room) if self.stride is None else self.stride
        if not 0 <= stride < room:
            raise InvalidInput(f"stride must be below {room}, the document tokens per window")
        sequences: list[ModelRow] = []
        self.spans, self.bounds = [], [0]
        for d in docs:
            spans = windows(len(d.ids), room, stride)
            self.windowed += len(spans) > 1
            for start, stop in spans:
                sequences.append(row(layout, q.ids, d.ids[start:stop]))
                if len(spans) == 1:
                    self.spans.append(None)
                else:
                    chars = d.offsets[start:stop]
                    self.spans.append(Window(chars[0][0], chars[-1][1]))
            self.bounds.append(len(sequences))
        self.tokens = sum(len(r) for r in sequences)
        return sequences

    def answer(self, outputs: list[Outputs]) -> list[dict[str, Any]]:
        relevance = scores(np.stack([out["logits"] for out in outputs]), self.raw)
        return ranked(relevance, self.bounds, self.spans, self.top_n)

    @staticmethod
    def answer_many(jobs: list[Job], outputs: list[list[Outputs]]) -> list[Any]:
        return one_by_one(jobs, outputs)
