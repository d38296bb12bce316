"""Late interaction (ColBERT): a vector per token, and a query's relevance to a document as
MaxSim, the sum over the query's vectors of each one's best cosine with the document's.

    spec = Spec.of(package)                        # package.json's `late_interaction` block
    row = query_row(spec, layout, encoding.ids)    # or document_row(...)
    # the batcher runs the rows; each row's Outputs has `token_embeddings` (L, D)
    q = vectors(spec, row, out["token_embeddings"], is_query=True)    # (n, D), unit length
    score = maxsim(q, d)

A ColBERT package (training.export --task late-interaction of a PyLate or colbert-ai folder)
answers rows built as PyLate 1.0.0 (`ColBERT.tokenize`) and colbert-ai 0.2.22
(`QueryTokenizer` / `DocTokenizer`) build them:

- a marker token right after the first special token: `[CLS] [Q] query [SEP]` (the query
  prefix) and `[CLS] [D] document [SEP]` (the document prefix), counted in the lengths;
- a query is cut to `query_length` tokens and, with query expansion, filled up to it with the
  mask token ([MASK]), which the attention mask leaves out unless the package attends to them
  (`attend_to_expansion_tokens`); all `query_length` vectors answer, the expansion's included:
  they are how ColBERT weighs a short query's missing terms;
- a document is cut to `document_length` tokens (or, for rerank, scored by windows of that
  length: `Job`), and its vectors are those of its tokens less the skiplist's (punctuation).

The graph answers the projection (Linear H -> D) of every token, unnormalised; each vector is
L2-normalised here, as both libraries do in their models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Encoding, Tokenizer

from heads.contract import TOKEN_EMBEDDINGS
from heads.package import ModelPackage
from heads.rows import InvalidInput, ModelRow, Outputs, Template, row, template, windows
from heads.tasks import one_by_one
from heads.tasks.embed import EPS
from heads.tasks.ranking import Window, ranked

__all__ = [
    "Job",
    "Spec",
    "document_row",
    "maxsim",
    "normalize_tokens",
    "query_row",
    "vectors",
]


@dataclass(frozen=True)
class Spec:
    """How a late-interaction package builds its rows (package.json `late_interaction`)."""

    query_prefix_id: int | None
    document_prefix_id: int | None
    query_length: int
    document_length: int
    query_expansion: bool
    attend_to_expansion_tokens: bool
    mask_id: int
    skiplist_ids: frozenset[int]

    @classmethod
    def of(cls, package: ModelPackage) -> Spec:
        block = package.late_interaction
        if package.task != "late-interaction" or block is None:
            raise InvalidInput(
                f"model {package.name!r} is a {package.task} model, not a late-interaction "
                "(ColBERT) one"
            )
        return cls(
            query_prefix_id=block.get("query_prefix_id"),
            document_prefix_id=block.get("document_prefix_id"),
            query_length=int(block["query_length"]),
            document_length=int(block["document_length"]),
            query_expansion=bool(block.get("query_expansion", True)),
            attend_to_expansion_tokens=bool(block.get("attend_to_expansion_tokens", False)),
            mask_id=int(block["mask_id"]),
            skiplist_ids=frozenset(int(i) for i in block.get("skiplist_ids", [])),
        )

    def room(self, layout: Template, is_query: bool) -> int:
        """The text tokens a row holds: its length less the special tokens and the marker."""
        length, prefix = (
            (self.query_length, self.query_prefix_id)
            if is_query
            else (self.document_length, self.document_prefix_id)
        )
        return length - layout.single.n_special - (prefix is not None)


def _marked(spec: Spec, layout: Template, ids: list[int] | np.ndarray, is_query: bool) -> ModelRow:
    """`[CLS] marker ids [SEP]`: the family's row with the marker after its first token."""
    plain = row(layout, ids)
    marker = spec.query_prefix_id if is_query else spec.document_prefix_id
    if marker is None:
        return plain
    at = min(1, len(layout.single.prefix))  # after [CLS] / <s>; first when the row has none
    input_ids = np.insert(plain.input_ids, at, marker)
    token_type_ids = np.insert(plain.token_type_ids, at, layout.single.a_type)
    return ModelRow(input_ids=input_ids, token_type_ids=token_type_ids)


def query_row(spec: Spec, layout: Template, ids: list[int] | np.ndarray) -> ModelRow:
    """A query's row: marked, cut to query_length, then expanded with the mask token up to it
    (attended only with attend_to_expansion_tokens)."""
    marked = _marked(spec, layout, list(ids)[: max(0, spec.room(layout, True))], True)
    missing = spec.query_length - len(marked)
    if not spec.query_expansion or missing <= 0:
        return marked
    input_ids = np.concatenate([marked.input_ids, np.full(missing, spec.mask_id, np.int64)])
    token_type_ids = np.concatenate([marked.token_type_ids, np.zeros(missing, np.int64)])
    attended = None if spec.attend_to_expansion_tokens else len(marked)
    return ModelRow(input_ids=input_ids, token_type_ids=token_type_ids, attended=attended)


def document_row(spec: Spec, layout: Template, ids: list[int] | np.ndarray) -> ModelRow:
    """A document's row (or a window's): marked; `ids` must fit (`Spec.room`)."""
    return _marked(spec, layout, ids, False)


def normalize_tokens(x: np.ndarray) -> np.ndarray:
    """(n, D) -> each row L2-normalised (norms in float64; a zero row stays zero)."""
    norms = np.linalg.norm(x.astype(np.float64), axis=-1, keepdims=True)
    return (x / np.maximum(norms, EPS)).astype(np.float32)


def kept(spec: Spec, model_row: ModelRow, is_query: bool) -> np.ndarray:
    """(L,) bool: the row's positions whose vectors answer: all of a query's, a document's
    tokens less the skiplist's."""
    if is_query or not spec.skiplist_ids:
        return np.ones(len(model_row), dtype=bool)
    return ~np.isin(model_row.input_ids, np.fromiter(spec.skiplist_ids, np.int64))


def vectors(spec: Spec, model_row: ModelRow, states: np.ndarray, is_query: bool) -> np.ndarray:
    """A row's token_embeddings (L, D) -> its answering vectors (n, D), unit length."""
    return normalize_tokens(states[kept(spec, model_row, is_query)])


def maxsim(query: np.ndarray, document: np.ndarray) -> float:
    """ColBERT's score: for each query vector its best dot product with a document vector,
    summed (PyLate's colbert_scores; colbert-ai's colbert_score). Unit vectors: cosines."""
    if len(document) == 0:
        return 0.0
    return float((query.astype(np.float64) @ document.astype(np.float64).T).max(axis=1).sum())


class Job:
    """One /rerank request for a late-interaction package: the query's row and each
    document's (windows of document_length when it is longer and `truncate` is off, scored as
    its best window, as the cross-encoder's MaxP) -> `{index, score}` best first, at most
    `top_n`. score: MaxSim divided by the query's vector count (the mean best cosine, in
    [-1, 1]: comparable across queries); `raw_scores`: MaxSim itself, PyLate's `rank` score."""

    wants = (TOKEN_EMBEDDINGS,)

    def __init__(self, package: ModelPackage, documents: list[str], options: Any) -> None:
        self.spec = Spec.of(package)
        if not documents:
            raise InvalidInput("texts is empty; send at least one document")
        self.texts = [options.query, *documents]
        self.raw, self.truncate, self.top_n = options.raw_scores, options.truncate, options.top_n
        self.direction = options.truncation_direction
        self.max_tokens_per_doc = options.max_tokens_per_doc
        self.max_tokens_per_query = options.max_tokens_per_query
        self.stride = options.stride
        self.truncated = self.windowed = self.tokens = 0
        self.rows_: list[ModelRow] = []
        self.spans: list[Window | None] = []  # per document row: its window, when windowed
        self.bounds: list[int] = []  # document i's rows are [bounds[i], bounds[i + 1]) + 1

    def rows(self, tokenizer: Tokenizer, encodings: list[Encoding]) -> list[ModelRow]:
        layout, spec = template(tokenizer), self.spec
        q, docs = encodings[0], encodings[1:]
        query_ids = q.ids[: self.max_tokens_per_query]
        room = spec.room(layout, False)
        stride = room // 4 if self.stride is None else self.stride  # a quarter of the window
        if not 0 <= stride < room:
            raise InvalidInput(f"stride must be below {room}, the document tokens per window")
        made = [query_row(spec, layout, query_ids)]
        self.truncated = int(len(query_ids) > spec.room(layout, True))
        self.bounds = [0]
        for d in docs:
            ids, offsets = d.ids[: self.max_tokens_per_doc], d.offsets
            if self.truncate and len(ids) > room:
                self.truncated += 1
                keep = slice(0, room) if self.direction == "right" else slice(len(ids) - room, None)
                made.append(document_row(spec, layout, ids[keep]))
                self.spans.append(None)
            else:
                spans = windows(len(ids), room, stride)
                self.windowed += len(spans) > 1
                for start, stop in spans:
                    made.append(document_row(spec, layout, ids[start:stop]))
                    self.spans.append(
                        None if len(spans) == 1 else Window(offsets[start][0], offsets[stop - 1][1])
                    )
            self.bounds.append(len(made) - 1)
        self.rows_ = made
        self.tokens = sum(len(r) for r in made)
        return made

    def answer(self, outputs: list[Outputs]) -> list[dict[str, Any]]:
        spec = self.spec
        query = vectors(spec, self.rows_[0], outputs[0][TOKEN_EMBEDDINGS], True)
        scores = [
            maxsim(query, vectors(spec, r, out[TOKEN_EMBEDDINGS], False))
            for r, out in zip(self.rows_[1:], outputs[1:], strict=True)
        ]
        if not self.raw:  # the mean best cosine: MaxSim over the query's vector count
            scores = [score / len(query) for score in scores]
        return ranked(scores, self.bounds, self.spans, self.top_n)

    @staticmethod
    def answer_many(jobs: list[Job], outputs: list[list[Outputs]]) -> list[Any]:
        return one_by_one(jobs, outputs)
