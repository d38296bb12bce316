"""What each task reads from a row, the engine inputs it makes of rows, and the Arrow type its
answer is written as. The options are the endpoint's own: each task names its request body
(service.schemas), whose fields that are task options (heads.tasks) become the command's flags,
and `options()` validates them with that body, so defaults, bounds and messages are the
server's; `answer()` asks the engine with them as the endpoint does.

| task         | endpoint      | columns (flag: default)                       | answer column (Arrow)     |
|--------------|---------------|-----------------------------------------------|---------------------------|
| classify     | /classify     | --text-column text [--pair-column]            | labels: list<{label, score}> |
| ner          | /ner          | --text-column text                            | entities: list<{entity_group, score, word, start, end}> |
| qa           | /qa           | --question-column question, --context-column context | answer: {answer, score, start, end} (list with top_k > 1) |
| embed        | /embed        | --text-column text                            | embedding: fixed_size_list<float32>[D] |
| embed_all    | /embed_all    | --text-column text                            | token_embeddings: list<fixed_size_list<float32>[D]> (list<{embeddings, tokens}> with --return-tokens) |
| embed_sparse | /embed_sparse | --text-column text                            | sparse: list<{index, value[, token]}> |
| rerank       | /rerank       | --query-column query, --documents-column documents (a text or a list) | ranking: list<{index, score, window}> |
| zero-shot    | /zero-shot    | --text-column text (labels by --candidate-labels) | zero_shot: {sequence, labels, scores} |
| fill-mask    | /fill-mask    | --text-column text                            | fillers: list<list<{score, token, token_str, sequence}>> |

Two shapes differ from the JSON, because a Parquet column has one type: fill-mask keeps one
list per mask (the endpoint answers a text with one mask by that one list: `fillers[0]`), and a
rerank row whose documents cell is one text is ranked as the list of that one document.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from pydantic import ConfigDict, TypeAdapter, ValidationError

from service import schemas
from service.engine import Call, Engine

# What one row holds, by role (text, pair, question, context, query, documents).
Row = dict[str, Any]

_TEXT = TypeAdapter(schemas.Text, config=ConfigDict(strict=True))
_TEXTS = TypeAdapter(list[schemas.Text], config=ConfigDict(strict=True))


@dataclass(frozen=True)
class Column:
    role: str  # the engine input it feeds: text, pair, question, context, query, documents
    default: str | None  # the input column's default name; None: optional, off unless named
    many: bool = False  # a list of texts (rerank's documents) is accepted as well as one text


@dataclass(frozen=True)
class Task:
    name: str  # the command's name of it
    endpoint: str
    request: type[schemas.TaskBody]  # the endpoint's body: the options' types, defaults, checks
    placeholder: dict[str, Any]  # the body's inputs, for validating options alone
    columns: tuple[Column, ...]
    output: str  # the answer column's default name
    inputs: Callable[[list[Row]], list[Any]]  # the engine's inputs for rows
    arrow: Callable[[dict[str, Any], int], pa.DataType]  # (options, embedding size) -> type
    per_row: bool = False  # one engine call per row (rerank: each row has its own query)

    def option_fields(self) -> list[str]:
        """The body's fields that are task options (heads.tasks), less the inputs."""
        return [f for f in self.request.option_fields if f not in self.placeholder]

    def options(self, given: dict[str, Any]) -> dict[str, Any]:
        """The task options for `given` (flag values by field name), checked by the endpoint's
        body (pydantic.ValidationError as the endpoint's 422 would say it), as JSON-plain
        values: what a resumed run compares."""
        body = self.request.model_validate({**self.placeholder, **given})
        options = {f: getattr(body, f) for f in self.option_fields()}
        if "candidate_labels" in options:  # the comma-separated form, split as /zero-shot does
            options["candidate_labels"] = body.options().labels
        return options

    async def answer(
        self,
        engine: Engine,
        rows: list[Row],
        options: dict[str, Any],
        model: str | None = None,
        call: Call | None = None,
    ) -> list[Any]:
        """The engine's answers for `rows`, one per row, with `options` (from `options()`)."""
        given = {"query": rows[0]["query"], **options} if self.per_row else options
        typed = self.request.OPTIONS(**given)
        found = await engine.answer(typed, self.inputs(rows), model=model, call=call)
        return [found] if self.per_row else list(found)  # embed's (N, D) array: a row each


# -- reading a row's inputs ----------------------------------------------------------------


class BadRow(ValueError):
    """A row the endpoint would refuse before it reaches the model (a null, a non-text, a lone
    surrogate); its message is the error file's."""


def checked(task: Task, values: dict[str, Any]) -> Row:
    """The row's inputs by role, checked as the endpoint's body checks a text: BadRow if not."""
    row: Row = {}
    for column in task.columns:
        if column.role not in values:
            continue  # an optional column that is off
        value = values[column.role]
        if value is None:
            raise BadRow(f"{column.role} is null")
        try:
            if column.many and not isinstance(value, str):
                row[column.role] = _TEXTS.validate_python(_as_list(value))
            else:
                row[column.role] = _TEXT.validate_python(value)
        except ValidationError as e:
            raise BadRow(f"{column.role}: {e.errors()[0]['msg']}") from None
    return row


def check_rows(
    task: Task, values: list[dict[str, Any] | None], unread: dict[int, str] | None = None
) -> tuple[list[Row | None], dict[int, tuple[str, str]]]:
    """Each record's checked row (None where it failed) and the failures by position:
    (message, error_type), "read" for the records in `unread`, "validation" for a BadRow."""
    rows: list[Row | None] = []
    errors: dict[int, tuple[str, str]] = {}
    for i, record in enumerate(values):
        if record is None:
            rows.append(None)
            errors[i] = ((unread or {}).get(i, "unreadable"), "read")
            continue
        try:
            rows.append(checked(task, record))
        except BadRow as e:
            rows.append(None)
            errors[i] = (str(e), "validation")
    return rows, errors


def _as_list(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray) else value


def length(row: Row) -> int:
    """Characters in the row's texts: the sort key that groups similar lengths."""
    return sum(len(v) if isinstance(v, str) else sum(map(len, v)) for v in row.values())


# -- the engine inputs ----------------------------------------------------------------------


def _texts(rows: list[Row]) -> list[Any]:
    return [r["text"] for r in rows]


def _classify(rows: list[Row]) -> list[Any]:
    return [(r["text"], r["pair"]) if "pair" in r else r["text"] for r in rows]


def _qa(rows: list[Row]) -> list[Any]:
    return [(r["question"], r["context"]) for r in rows]


def _documents(rows: list[Row]) -> list[Any]:
    [r] = rows  # per_row: each row has its own query
    docs = r["documents"]
    return [docs] if isinstance(docs, str) else docs


# -- the answers' Arrow types ----------------------------------------------------------------

_SCORE = pa.float64()  # the tasks' scores are Python floats (doubles): kept exact
_INT = pa.int64()
_LABEL_SCORE = pa.struct([("label", pa.string()), ("score", _SCORE)])
_SPAN = pa.struct([("answer", pa.string()), ("score", _SCORE), ("start", _INT), ("end", _INT)])
_FILLER = pa.struct(
    [("score", _SCORE), ("token", _INT), ("token_str", pa.string()), ("sequence", pa.string())]
)
_RANK = pa.struct(
    [("index", _INT), ("score", _SCORE), ("window", pa.struct([("start", _INT), ("end", _INT)]))]
)


def _entities(options: dict[str, Any], size: int) -> pa.DataType:
    if options["aggregation_strategy"] == "none":  # one entry per token, its label and index
        head = [("entity", pa.string()), ("score", _SCORE), ("index", _INT)]
    else:
        head = [("entity_group", pa.string()), ("score", _SCORE)]
    return pa.list_(pa.struct([*head, ("word", pa.string()), ("start", _INT), ("end", _INT)]))


def _sparse(options: dict[str, Any], size: int) -> pa.DataType:
    fields = [("index", _INT), ("value", pa.float32())]  # SPLADE weights are float32 values
    return pa.list_(
        pa.struct(fields + ([("token", pa.string())] if options["return_tokens"] else []))
    )


_TOKEN = pa.struct([("id", _INT), ("text", pa.string()), ("special", pa.bool_()),
                    ("start", _INT), ("stop", _INT)])  # fmt: skip


def _token_vectors(options: dict[str, Any], size: int) -> pa.DataType:
    vectors = pa.list_(pa.list_(pa.float32(), size))
    if not options["return_tokens"]:
        return vectors
    return pa.struct([("embeddings", vectors), ("tokens", pa.list_(_TOKEN))])


def _vectors_array(answers: list[np.ndarray | None], size: int) -> pa.Array:
    """Per row its (n, D) float32 vectors (None: a failed row) -> list<fixed_size_list<D>>,
    built from one flat buffer rather than a Python float per value."""
    parts = [np.zeros((0, size), np.float32) if a is None else a for a in answers]
    flat = np.concatenate([np.zeros((0, size), np.float32), *parts]).astype(np.float32).reshape(-1)
    inner = pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), size)
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int32)
    mask = pa.array([a is None for a in answers])
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), inner, mask=mask)


def _fixed(kind: pa.DataType) -> Callable[[dict[str, Any], int], pa.DataType]:
    return lambda options, size: kind


TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        Task("classify", "/classify", schemas.ClassifyRequest, {"inputs": "x"},
             (Column("text", "text"), Column("pair", None)), "labels", _classify,
             _fixed(pa.list_(_LABEL_SCORE))),
        Task("ner", "/ner", schemas.NerRequest, {"inputs": "x"}, (Column("text", "text"),),
             "entities", _texts, _entities),
        Task("qa", "/qa", schemas.QaRequest, {"question": "x", "context": "x"},
             (Column("question", "question"), Column("context", "context")), "answer", _qa,
             lambda options, size: _SPAN if options["top_k"] == 1 else pa.list_(_SPAN)),
        Task("embed", "/embed", schemas.EmbedRequest, {"inputs": "x"},
             (Column("text", "text"),), "embedding", _texts,
             lambda options, size: pa.list_(pa.float32(), size)),
        Task("embed_all", "/embed_all", schemas.EmbedAllRequest, {"inputs": "x"},
             (Column("text", "text"),), "token_embeddings", _texts, _token_vectors),
        Task("embed_sparse", "/embed_sparse", schemas.SparseEmbedRequest,
             {"inputs": "x"}, (Column("text", "text"),), "sparse", _texts,
             _sparse),
        Task("rerank", "/rerank", schemas.RerankRequest, {"query": "x", "texts": ["x"]},
             (Column("query", "query"), Column("documents", "documents", many=True)), "ranking",
             _documents, _fixed(pa.list_(_RANK)), per_row=True),
        Task("zero-shot", "/zero-shot", schemas.ZeroShotRequest, {"inputs": "x"},
             (Column("text", "text"),), "zero_shot", _texts,
             _fixed(pa.struct([("sequence", pa.string()), ("labels", pa.list_(pa.string())),
                               ("scores", pa.list_(_SCORE))]))),
        Task("fill-mask", "/fill-mask", schemas.FillMaskRequest, {"inputs": "x"},
             (Column("text", "text"),), "fillers", _texts,
             _fixed(pa.list_(pa.list_(_FILLER)))),
    )
}  # fmt: skip


def to_arrow(task: Task, answers: list[Any], kind: pa.DataType) -> pa.Array:
    """One Arrow array of `answers` (None where a row failed), of type `kind`."""
    if task.name == "embed":
        size = kind.list_size
        flat = np.zeros((len(answers), size), dtype=np.float32)  # one buffer, no stacked copy
        ok = np.array([a is not None for a in answers], dtype=bool)
        for i, vector in enumerate(answers):
            if vector is not None:
                flat[i] = vector
        values = pa.array(flat.reshape(-1), type=pa.float32())
        return pa.FixedSizeListArray.from_arrays(values, size, mask=pa.array(~ok))
    if task.name == "embed_all":
        if isinstance(kind, pa.StructType):  # with return_tokens: {embeddings, tokens}
            size = kind.field("embeddings").type.value_type.list_size
            vectors = _vectors_array([a and a["embeddings"] for a in answers], size)
            tokens = pa.array([a and a["tokens"] for a in answers], pa.list_(_TOKEN))
            mask = pa.array([a is None for a in answers])
            return pa.StructArray.from_arrays([vectors, tokens], fields=list(kind), mask=mask)
        return _vectors_array(answers, kind.value_type.list_size)
    if task.name == "fill-mask":  # one list per mask (a one-mask text answers the list alone)
        answers = [a if a is None or isinstance(a[0], list) else [a] for a in answers]
    return pa.array(answers, type=kind)
