"""Sentence-pair data for the embedding head.

    training pairs   JSON lines {"anchor": ..., "positive": ...}: row i's positive is the
                     match for anchor i, every other row's positive in the batch a negative
                     (in-batch negatives, `training.model.contrastive_loss`)
    scored pairs     JSON lines {"sentence1", "sentence2", "score"}, or the STS-B TSV (GLUE
                     release: a 10-column header with sentence1, sentence2, score; read with
                     no quote processing, since its sentences contain unbalanced `"`)

Scored pairs evaluate (Spearman correlation of the cosine similarity with the gold score).
Given as training data, the pairs scored >= 4 on STS-B's 0-5 scale ("the two sentences are
mostly equivalent" and above, per the STS annotation guidelines) become (anchor, positive)
pairs: in-batch negatives need pairs that mean the same thing, and nothing lower does.
On STS-B train that keeps 1,406 of 5,749 pairs.

    >>> pairs = training_pairs(read_pairs("stsb/train.tsv"))
    >>> rows = encode_pairs(pairs, tokenizer, max_seq_length=128)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from heads.rows import TextInput, encode_texts
from training.data.records import DataError, field, read_records, require_rows

EXPECTED = (
    'JSON lines {"anchor", "positive"} (training) or {"sentence1", "sentence2", "score"}, '
    "or a TSV with sentence1, sentence2 and score columns (STS-B)"
)
POSITIVE_SCORE = 4.0  # STS-B 0-5 scale: 4 = "mostly equivalent"


@dataclass(frozen=True)
class TextPair:
    anchor: str
    positive: str
    where: str


@dataclass(frozen=True)
class ScoredPair:
    sentence1: str
    sentence2: str
    score: float
    where: str


def read_pairs(path: str | Path) -> list[TextPair] | list[ScoredPair]:
    """Either kind, by the first row's keys; every row must be of the same kind."""
    pairs: list = []
    kind = None
    for where, row in read_records(path, EXPECTED):
        this = TextPair if "anchor" in row else ScoredPair
        if kind is not None and this is not kind:
            raise DataError(f"{where}: mixes anchor/positive and scored rows; expected {EXPECTED}")
        kind = this
        if this is TextPair:
            pairs.append(
                TextPair(field(row, where, "anchor"), field(row, where, "positive"), where)
            )
            continue
        raw = field(row, where, "score", kind=object)
        try:
            score = float(raw)
        except (TypeError, ValueError):
            raise DataError(
                f"{where}: score {raw!r} is not a number; expected {EXPECTED}"
            ) from None
        pairs.append(
            ScoredPair(field(row, where, "sentence1"), field(row, where, "sentence2"), score, where)
        )
    return require_rows(pairs, path, EXPECTED)


def training_pairs(pairs: list[TextPair] | list[ScoredPair]) -> list[TextPair]:
    """Anchor/positive pairs as they are; scored pairs keep those scored >= 4 (see above)."""
    out = [
        p if isinstance(p, TextPair) else TextPair(p.sentence1, p.sentence2, p.where)
        for p in pairs
        if isinstance(p, TextPair) or p.score >= POSITIVE_SCORE
    ]
    if not out:
        raise DataError(
            f"{pairs[0].where.rsplit(':', 1)[0]}: no pair scored >= {POSITIVE_SCORE} to train on"
        )
    return out


def encode_pairs(pairs: list[TextPair], tokenizer: Tokenizer, max_seq_length: int) -> list[dict]:
    """Rows {"sequence": anchor, "pair": positive}: the collate function puts all anchors and
    then all positives in one padded batch of 2B rows, so one forward pass embeds both."""
    texts: list[TextInput] = [t for p in pairs for t in (p.anchor, p.positive)]
    seqs = encode_texts(tokenizer, texts, max_seq_length).sequences
    return [{"sequence": a, "pair": b} for a, b in zip(seqs[0::2], seqs[1::2], strict=True)]
