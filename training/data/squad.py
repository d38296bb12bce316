"""Extractive question answering data: SQuAD v1.1 / v2.0 JSON.

Training rows are the service's own windows (`heads.tasks.qa.preprocess`: `[CLS] question
[SEP] context part [SEP]`, consecutive windows sharing `doc_stride` context tokens), so the
model learns on exactly the rows it is later asked about. The answer's character span is
mapped to token positions through each window's offsets; a window that does not hold the
whole answer, and an unanswerable question (v2.0 `is_impossible`), point at [CLS] (0), as in
BERT's run_squad.py.

    >>> train = read_squad("squad/train-subset-du2017test-v1.1.json")
    >>> rows, skipped = encode_squad(train, tokenizer, max_seq_length=384, doc_stride=128)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from heads.rows import InvalidInput
from heads.tasks import qa
from training.data.records import DataError, existing, require_rows

EXPECTED = (
    'SQuAD JSON {"data": [{"paragraphs": [{"context": ..., "qas": [{"id", "question", '
    '"answers": [{"text", "answer_start"}]}]}]}]}'
)


@dataclass(frozen=True)
class QAExample:
    id: str
    question: str
    context: str
    answers: list[tuple[str, int]]  # (text, character start in context); empty: no answer
    where: str  # "file: data[i].paragraphs[j].qas[k]"


def read_squad(path: str | Path) -> list[QAExample]:
    path = existing(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as e:
        raise DataError(
            f"{path}:{e.lineno}: not valid JSON ({e.msg}); expected {EXPECTED}"
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise DataError(f"{path}: no top-level 'data' list; expected {EXPECTED}")
    examples = []
    for i, article in enumerate(doc["data"]):
        for j, paragraph in enumerate(_get(article, "paragraphs", list, f"{path}: data[{i}]")):
            where_p = f"{path}: data[{i}].paragraphs[{j}]"
            context = _get(paragraph, "context", str, where_p)
            for k, q in enumerate(_get(paragraph, "qas", list, where_p)):
                where = f"{where_p}.qas[{k}]"
                answers = []
                for a in _get(q, "answers", list, where):
                    text = _get(a, "text", str, where + ".answers")
                    start = _get(a, "answer_start", int, where + ".answers")
                    answers.append((text, start))
                if q.get("is_impossible"):
                    answers = []
                examples.append(
                    QAExample(
                        str(_get(q, "id", (str, int), where)),
                        _get(q, "question", str, where),
                        context,
                        answers,
                        where,
                    )
                )
    return require_rows(examples, path, EXPECTED)


def _get(obj: object, key: str, kind: type | tuple[type, ...], where: str):
    if not isinstance(obj, dict) or key not in obj:
        raise DataError(f"{where}: missing {key!r}; expected {EXPECTED}")
    value = obj[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise DataError(f"{where}: {key!r} is {type(value).__name__}; expected {EXPECTED}")
    return value


def prepare(
    e: QAExample, tokenizer: Tokenizer, max_seq_length: int, doc_stride: int
) -> qa.WindowedContext:
    """The service's windows for one example; its refusals (InvalidInput, which the service
    answers with a 422) become a DataError that names the example."""
    try:
        return qa.preprocess(tokenizer, e.question, e.context, max_seq_length, doc_stride)
    except InvalidInput as err:
        raise DataError(f"{e.where}: {err}") from None


def answer_positions(window: qa.Window, start_char: int, end_char: int) -> tuple[int, int]:
    """Row positions (start, end inclusive) of the tokens covering [start_char, end_char), or
    (0, 0) when the window does not hold the whole answer."""
    offsets = window.offsets  # (n, 2) characters of the window's context tokens
    if not len(offsets) or offsets[0, 0] > start_char or offsets[-1, 1] < end_char:
        return 0, 0
    first = int(np.argmax(offsets[:, 1] > start_char))
    last = int(len(offsets) - 1 - np.argmax(offsets[::-1, 0] < end_char))
    if last < first:
        return 0, 0
    return window.context_start + first, window.context_start + last


def encode_squad(
    examples: list[QAExample], tokenizer: Tokenizer, max_seq_length: int, doc_stride: int
) -> tuple[list[dict], int]:
    """Training rows {"sequence", "start_positions", "end_positions"}, one per window, and the
    number of answers skipped because their text is not at answer_start in the context
    (run_squad.py skips those too). Training uses each question's first answer."""
    rows, skipped = [], 0
    for e in examples:
        span = (0, 0)
        if e.answers:
            text, start = e.answers[0]
            if e.context[start : start + len(text)] != text or not text.strip():
                skipped += 1
                continue
            span = (start, start + len(text))
        for window in prepare(e, tokenizer, max_seq_length, doc_stride).windows:
            s, t = answer_positions(window, *span) if e.answers else (0, 0)
            rows.append({"sequence": window.sequence, "start_positions": s, "end_positions": t})
    return rows, skipped
