"""Sequence classification data: single texts or pairs with a label.

    GLUE TSV with a header   sentence<TAB>label   or   sentence1<TAB>sentence2<TAB>label
    CSV with a header        text,label           or   text,text_pair,label
    JSON lines               {"text": ..., "label": ...} or {"text", "text_pair", "label"}

Column names: `sentence` or `text` for a single text; `sentence1`/`sentence2` or
`text`/`text_pair` for a pair. Labels are names ("positive") or ids (1); either way they are
kept as strings and mapped to ids by `label_vocabulary`.

    >>> train = read_classification("sst2/train.tsv")
    >>> labels = label_vocabulary(train)              # ['0', '1']
    >>> rows = encode_classification(train, tokenizer, labels, max_seq_length=128)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from heads.rows import encode_texts
from training.data.records import DataError, field, read_records, require_rows

EXPECTED = (
    "columns sentence,label or sentence1,sentence2,label (JSON lines: text,label or "
    "text,text_pair,label)"
)


@dataclass(frozen=True)
class TextExample:
    text: str
    text_pair: str | None
    label: str
    where: str  # "file:line", for error messages


def read_classification(path: str | Path) -> list[TextExample]:
    examples = []
    for where, row in read_records(path, EXPECTED):
        if "sentence1" in row or "text_pair" in row:
            first = field(row, where, "sentence1", "text")
            second = field(row, where, "sentence2", "text_pair")
        else:
            first, second = field(row, where, "sentence", "text"), None
        label = field(row, where, "label").strip()
        if not label:
            raise DataError(f"{where}: empty label; expected {EXPECTED}")
        examples.append(TextExample(first, second, label, where))
    return require_rows(examples, path, EXPECTED)


def reads(path: str | Path) -> str:
    """What a classifier trained on `path` reads: "pairs" when its examples have a second
    text (sentence2, text_pair), else "single" (package.json `reads`)."""
    return "pairs" if any(e.text_pair is not None for e in read_classification(path)) else "single"


def label_vocabulary(examples: list[TextExample], known: list[str] | None = None) -> list[str]:
    """Label names in id order. `known` (the checkpoint's id2label) is kept when the data uses
    its names or its ids (a GLUE TSV's 0/1 against a checkpoint fine-tuned with `--labels
    negative,positive`); otherwise ids are assigned afresh: numerically when every label is an
    integer (so "0"/"1" keep their ids), else alphabetically."""
    seen = {e.label for e in examples}
    if known and (seen <= set(known) or all(_known_id(label, known) for label in seen)):
        return list(known)
    if all(_is_int(label) for label in seen):
        return sorted(seen, key=int)
    return sorted(seen)


def _is_int(text: str) -> bool:
    return text.lstrip("-").isdigit()


def _known_id(label: str, names: list[str]) -> bool:
    """`label` is an id of `names` written as a number, and not itself one of the names."""
    return label not in names and label.isdigit() and int(label) < len(names)


def label_ids(examples: list[TextExample], labels: list[str]) -> list[int]:
    """Map every example's label to its id; a label the model does not know is an error."""
    index = {name: i for i, name in enumerate(labels)}
    index |= {str(i): i for i in range(len(labels)) if str(i) not in index}  # ids as numbers
    for e in examples:
        if e.label not in index:
            raise DataError(
                f"{e.where}: label {e.label!r} was not seen in the training data "
                f"(known labels: {', '.join(labels)})"
            )
    return [index[e.label] for e in examples]


def encode_classification(
    examples: list[TextExample], tokenizer: Tokenizer, labels: list[str], max_seq_length: int
) -> list[dict]:
    """Model rows {"sequence", "labels"}, encoded by the service's own text path so that the
    rows trained on are the rows served (`[CLS] a [SEP] (b [SEP])`, longest-first cut)."""
    ids = label_ids(examples, labels)
    inputs = [e.text if e.text_pair is None else (e.text, e.text_pair) for e in examples]
    sequences = encode_texts(tokenizer, inputs, max_seq_length).sequences
    return [{"sequence": s, "labels": i} for s, i in zip(sequences, ids, strict=True)]
