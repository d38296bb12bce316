"""Token classification (NER) data: sentences of words, one tag per word.

    CoNLL      one token per line, the word in the first column and its tag in the last
               (CoNLL-2003: `word POS chunk NER`); a blank line ends a sentence; -DOCSTART-
               lines are skipped. IOB1 and IOB2 tags are both read and normalised to IOB2.
    JSON lines {"tokens": ["EU", "rejects", ...], "tags": ["B-ORG", "O", ...]}

Only the first word piece of a word carries its tag; the others and [CLS] / [SEP] get -100
(no loss), as in the BERT paper's CoNLL setup (section 5.3). Evaluation reads the prediction
of that first piece as the word's tag.

    >>> train = read_tagged("conll2003/eng.train")
    >>> tags = tag_vocabulary(train)            # ['O', 'B-LOC', 'I-LOC', 'B-MISC', ...]
    >>> rows = encode_tagged(train, tokenizer, tags, max_seq_length=128)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from heads.rows import ModelRow, Template, row, template
from training.data.records import JSONL, DataError, existing, field, read_records, require_rows
from training.metrics import to_iob2

IGNORE = -100  # cross_entropy's ignore_index: positions without a loss
EXPECTED_CONLL = (
    "CoNLL lines `token ... tag` (tag O, B-TYPE or I-TYPE), blank line between sentences"
)
EXPECTED_JSONL = '{"tokens": [...], "tags": [...]} with one tag per token'
TAG = re.compile(r"^(O|[BI]-\S+)$")


@dataclass(frozen=True)
class TaggedSentence:
    words: list[str]
    tags: list[str]  # IOB2
    where: str  # "file:line" of the sentence's first word


def read_tagged(path: str | Path) -> list[TaggedSentence]:
    """CoNLL, or JSON lines when the name ends in .jsonl / .json."""
    path = existing(path)
    if path.suffix.lower() in JSONL:
        return require_rows(_read_jsonl(path), path, EXPECTED_JSONL)
    return require_rows(_read_conll(path), path, EXPECTED_CONLL)


def _check_tags(tags: list[str], where: str, expected: str) -> list[str]:
    for tag in tags:
        if not TAG.match(tag):
            raise DataError(f"{where}: {tag!r} is not a tag; expected {expected}")
    return to_iob2(tags)


def _read_conll(path: Path) -> list[TaggedSentence]:
    sentences: list[TaggedSentence] = []
    words: list[str] = []
    tags: list[str] = []
    start = 0

    def flush() -> None:
        if words:
            where = f"{path}:{start}"
            sentences.append(
                TaggedSentence(list(words), _check_tags(tags, where, EXPECTED_CONLL), where)
            )
            words.clear()
            tags.clear()

    with path.open(encoding="utf-8-sig") as f:
        for line_no, line in enumerate(f, start=1):
            columns = line.split()
            if not columns:
                flush()
                continue
            if columns[0] == "-DOCSTART-":
                flush()
                continue
            if len(columns) < 2:
                raise DataError(
                    f"{path}:{line_no}: one column {line.strip()!r}; expected {EXPECTED_CONLL}"
                )
            if not TAG.match(columns[-1]):
                raise DataError(
                    f"{path}:{line_no}: last column {columns[-1]!r} is not a tag; expected {EXPECTED_CONLL}"
                )
            if not words:
                start = line_no
            words.append(columns[0])
            tags.append(columns[-1])
    flush()
    return sentences


def _read_jsonl(path: Path) -> list[TaggedSentence]:
    sentences = []
    for where, rec in read_records(path, EXPECTED_JSONL):
        words, tags = (
            field(rec, where, "tokens", kind=list),
            field(rec, where, "tags", "ner_tags", kind=list),
        )
        if len(words) != len(tags) or not words:
            raise DataError(
                f"{where}: {len(words)} tokens and {len(tags)} tags; expected {EXPECTED_JSONL}"
            )
        if not all(isinstance(x, str) for x in words + tags):
            raise DataError(f"{where}: tokens and tags must be strings; expected {EXPECTED_JSONL}")
        sentences.append(TaggedSentence(words, _check_tags(tags, where, EXPECTED_JSONL), where))
    return sentences


def tag_vocabulary(sentences: list[TaggedSentence], known: list[str] | None = None) -> list[str]:
    """'O' then B-/I- for every entity type, types sorted. Seeing a type at all gives it both
    tags: a type written only as single-word entities in train still has an I- tag."""
    types = {t[2:] for s in sentences for t in s.tags if t != "O"}
    tags = ["O"] + [f"{p}-{t}" for t in sorted(types) for p in "BI"]
    if known and set(tags) <= set(known):
        return list(known)
    return tags


def check_tags(sentences: list[TaggedSentence], tags: list[str]) -> None:
    """A tag the model does not know (an entity type absent from train) is an error."""
    known = set(tags)
    for s in sentences:
        for tag in s.tags:
            if tag not in known:
                raise DataError(
                    f"{s.where}: tag {tag!r} was not seen in the training data "
                    f"(known tags: {', '.join(tags)})"
                )


def word_pieces(tokenizer: Tokenizer, words: list[str]) -> list[np.ndarray]:
    """Token ids of each word; a word the tokenizer drops entirely becomes [UNK], so that
    every word keeps one position to carry (and be read back as) its tag."""
    enc = tokenizer.encode(words, is_pretokenized=True, add_special_tokens=False)
    pieces: list[list[int]] = [[] for _ in words]
    for token_id, w in zip(enc.ids, enc.word_ids, strict=True):
        if w is not None:
            pieces[w].append(token_id)
    unk = tokenizer.token_to_id("[UNK]")
    return [np.asarray(p or [unk], dtype=np.int64) for p in pieces]


def encode_tagged(
    sentences: list[TaggedSentence], tokenizer: Tokenizer, tags: list[str], max_seq_length: int
) -> list[dict]:
    """Rows {"sequence", "labels" (L,)}, in sentence order. A sentence longer than a row is cut
    at word boundaries into consecutive rows, so every word is trained on and predicted once;
    reading the labelled positions of all rows in order gives back the words in order."""
    check_tags(sentences, tags)
    layout = template(tokenizer)
    tag_id = {t: i for i, t in enumerate(tags)}
    room = max_seq_length - layout.single.n_special
    if room < 1:
        raise ValueError(f"max_seq_length {max_seq_length} leaves no room for a word")
    rows = []
    for s in sentences:
        chunk: list[tuple[np.ndarray, str]] = []
        for pieces, tag in zip(word_pieces(tokenizer, s.words), s.tags, strict=True):
            pieces = pieces[:room]  # a single word longer than a row keeps its first pieces
            if chunk and sum(len(p) for p, _ in chunk) + len(pieces) > room:
                rows.append(_row(chunk, tag_id, layout))
                chunk = []
            chunk.append((pieces, tag))
        rows.append(_row(chunk, tag_id, layout))
    return rows


def _row(chunk: list[tuple[np.ndarray, str]], tag_id: dict[str, int], layout: Template) -> dict:
    ids = np.concatenate([p for p, _ in chunk])
    labels = np.full(len(ids) + layout.single.n_special, IGNORE, dtype=np.int64)
    # after the template's prefix ([CLS], <s>)
    first = len(layout.single.prefix) + np.cumsum([0] + [len(p) for p, _ in chunk[:-1]])
    labels[first] = [tag_id[t] for _, t in chunk]
    sequence: ModelRow = row(layout, ids)
    return {"sequence": sequence, "labels": labels}
