"""One task's training data, read and encoded into model rows: the reader and encoder per task.

    rows, labels, n = training_rows("classification", "sst2/train.tsv", tokenizer, 128)

Rows are dicts {"sequence": heads.rows.ModelRow, ...targets} for training.data.batch.collate;
labels are the data's label names in id order (classification, token classification; else
None), `known` (a checkpoint's id2label) kept when the data uses its names.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from training.data.classification import (
    encode_classification,
    label_vocabulary,
    read_classification,
)
from training.data.pairs import encode_pairs, read_pairs, training_pairs
from training.data.records import DataError
from training.data.squad import encode_squad, read_squad
from training.data.token_classification import encode_tagged, read_tagged, tag_vocabulary


def training_rows(
    task: str,
    path: str | Path,
    tokenizer: Any,
    max_seq_length: int,
    *,
    known: list[str] | None = None,
    doc_stride: int = 128,
    limit: int | None = None,
    log: Callable[[str], None] = print,
) -> tuple[list[dict], list[str] | None, int]:
    """(rows, labels, examples read) for `task` from the first `limit` examples of `path`."""
    labels = None
    if task == "classification":
        examples = read_classification(path)[:limit]
        labels = label_vocabulary(examples, known)
        rows = encode_classification(examples, tokenizer, labels, max_seq_length)
        n = len(examples)
    elif task == "token-classification":
        sentences = read_tagged(path)[:limit]
        labels = tag_vocabulary(sentences, known)
        rows = encode_tagged(sentences, tokenizer, labels, max_seq_length)
        n = len(sentences)
    elif task == "question-answering":
        questions = read_squad(path)[:limit]
        rows, skipped = encode_squad(questions, tokenizer, max_seq_length, doc_stride)
        if skipped:
            log(f"skipped {skipped} answers whose text is not at answer_start")
        n = len(questions)
    else:
        pairs = read_pairs(path)[:limit]
        positives = training_pairs(pairs)
        if len(positives) < len(pairs):
            log(f"{len(positives):,} of {len(pairs):,} scored pairs have score >= 4: positives")
        rows = encode_pairs(positives, tokenizer, max_seq_length)
        n = len(positives)
    if not rows:
        raise DataError(f"{path}: no training rows left after encoding")
    return rows, labels, n
