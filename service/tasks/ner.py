"""Token classification (NER): a text -> entities with character offsets into that text.

    prepared = encode_pre(tokenizer, text, max_seq_length=128, stride=32)
    # the batcher runs prepared.sequences; each window's Outputs has `logits` (L, C)
    entities = encode_post(prepared, outputs, labels, aggregation_strategy="simple")

Semantics follow transformers' TokenClassificationPipeline: a softmax per token; strategies
"none" (one entry per token), "simple" (adjacent tokens grouped by B-/I- tag), and "first" /
"average" / "max" (a word's tokens first agree on one label, then words are grouped);
`ignore_labels` defaults to ["O"]. Differences, on purpose:

- `word` is `text[start:end]`, the exact span of the original text; the pipeline decodes the
  tokens instead, which loses the text's own spacing and, with uncased vocabularies, its case
  and accents ("New York-based Café" comes back as "new york - based cafe").
- a token continues a word when WordPiece marks it with `##`. The pipeline tests
  `len(token) != len(text[start:end])`, which means the same except where normalisation changed
  a token's length: a control character or, uncased, a decomposed accent inside a word
  ("a\\x07b" is one token "ab", "cafe\\u0301s" one token "cafes") make the pipeline glue that
  word to the previous one.
- long texts: a text longer than one window is cut into windows sharing `stride` tokens, as
  the pipeline's `stride` does. The pipeline then labels each window on its own and keeps the
  longest of the overlapping entities, which can still cut an entity at a window edge. Here each
  token takes its scores from the window where it sits farthest from a cut edge (the "max
  context" rule of BERT's SQuAD code), and the whole text is aggregated once: no entity is
  duplicated or cut, and a text that fits one window gives what the single window gives.
- `index` (strategy "none") is the token's position in the unwindowed row `[CLS] text [SEP]`.
- the empty or whitespace-only text has no tokens, and no entities.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from service.rows import InvalidInput, Outputs, Sequence, Tokens, encode, row, special_ids, windows

__all__ = ["STRATEGIES", "Prepared", "Window", "encode_post", "encode_pre", "token_scores"]

STRATEGIES = ("none", "simple", "first", "average", "max")


@dataclass(frozen=True, slots=True)
class Window:
    """One model row over text tokens [start, stop).

    offsets (L, 2): character offsets of each row position, (0, 0) on [CLS] / [SEP];
    special (L,) bool: True on [CLS] / [SEP].
    """

    sequence: Sequence
    start: int
    stop: int
    offsets: np.ndarray
    special: np.ndarray


@dataclass(frozen=True, slots=True)
class Prepared:
    text: str
    tokens: Tokens
    windows: list[Window]

    @property
    def sequences(self) -> list[Sequence]:
        return [w.sequence for w in self.windows]

    @property
    def windowed(self) -> bool:
        return len(self.windows) > 1


def encode_pre(tokenizer: Tokenizer, text: str, max_seq_length: int, stride: int) -> Prepared:
    """Cut the text into windows of at most `max_seq_length` tokens with special tokens,
    consecutive windows sharing `stride` tokens (the pipeline's `stride`)."""
    cls_id, sep_id = special_ids(tokenizer)
    room = max_seq_length - 2
    if room < 1:
        raise ValueError(f"max_seq_length ({max_seq_length}) leaves no room for any token")
    tokens = encode(tokenizer, text)
    # The empty text still gets its row `[CLS] [SEP]`, like the pipeline's, so that every
    # request hands the batcher at least one row.
    spans = windows(len(tokens), room, stride)
    out = []
    for start, stop in spans:
        n = stop - start
        offsets = np.zeros((n + 2, 2), dtype=np.int64)
        offsets[1:-1] = tokens.offsets[start:stop]
        special = np.zeros(n + 2, dtype=bool)
        special[[0, -1]] = True
        seq = row(cls_id, sep_id, tokens.ids[start:stop])
        out.append(Window(sequence=seq, start=start, stop=stop, offsets=offsets, special=special))
    return Prepared(text=text, tokens=tokens, windows=out)


def _softmax(logits: np.ndarray) -> np.ndarray:
    # float32, as the pipeline computes it (fp16 graphs are widened first)
    x = np.asarray(logits, dtype=np.float32)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def token_scores(prepared: Prepared, outputs: list[Outputs]) -> np.ndarray:
    """(T, C) label probabilities per text token, each from the window where the token has the
    most context on both sides; a text edge is not a cut, so it counts as unlimited context."""
    if len(outputs) != len(prepared.windows):
        raise ValueError(f"{len(outputs)} outputs for {len(prepared.windows)} windows")
    n_tokens = len(prepared.tokens)
    probs: np.ndarray | None = None
    best = np.full(n_tokens, -1.0)
    for window, out in zip(prepared.windows, outputs, strict=True):
        p = _softmax(out["logits"])[1:-1]  # (n, C): drop [CLS] and [SEP]
        if probs is None:
            probs = np.zeros((n_tokens, p.shape[1]), dtype=np.float32)
        pos = np.arange(window.start, window.stop)
        left = pos - window.start if window.start > 0 else np.full(len(pos), np.inf)
        right = window.stop - 1 - pos if window.stop < n_tokens else np.full(len(pos), np.inf)
        context = np.minimum(left, right)
        take = context > best[pos]  # ties keep the earlier window
        probs[pos[take]] = p[take]
        best[pos[take]] = context[take]
    assert probs is not None  # encode_pre always makes at least one window
    return probs


def _tag(label: str) -> tuple[str, str]:
    """Split "B-PER" into ("B", "PER"); a label without a B-/I- prefix continues like an I- tag."""
    if label.startswith(("B-", "I-")):
        return label[0], label[2:]
    return "I", label


def _group(entities: list[dict], text: str) -> list[dict]:
    """Merge runs of adjacent entities with the same tag; a B- tag starts a new group."""
    groups: list[list[dict]] = []
    for ent in entities:
        bi, tag = _tag(ent["entity"])
        if groups and bi != "B" and tag == _tag(groups[-1][-1]["entity"])[1]:
            groups[-1].append(ent)
        else:
            groups.append([ent])
    out = []
    for g in groups:
        start, end = g[0]["start"], g[-1]["end"]
        out.append(
            {
                "entity_group": _tag(g[0]["entity"])[1],
                "score": float(np.nanmean([e["score"] for e in g])),
                "word": text[start:end],
                "start": start,
                "end": end,
            }
        )
    return out


def _words(tokens: Tokens, probs: np.ndarray, labels: list[str], strategy: str) -> list[dict]:
    """Per word (a token and the `##` tokens after it) one label, by the strategy."""
    starts = [0] + [i for i in range(1, len(tokens)) if not tokens.subword[i]]
    out = []
    for a, b in zip(starts, starts[1:] + [len(tokens)], strict=True):
        if strategy == "first":
            scores = probs[a]
        elif strategy == "max":
            # the token most sure of its own label decides; the first one on ties
            scores = probs[a + int(np.argmax(probs[a:b].max(axis=-1)))]
        else:  # average
            scores = np.nanmean(probs[a:b], axis=0)
        k = int(np.argmax(scores))
        out.append(
            {
                "entity": labels[k],
                "score": float(scores[k]),
                "start": int(tokens.offsets[a, 0]),
                "end": int(tokens.offsets[b - 1, 1]),
            }
        )
    return out


def encode_post(
    prepared: Prepared,
    outputs: list[Outputs],
    labels: list[str],
    aggregation_strategy: str = "simple",
    ignore_labels: list[str] | None = None,
) -> list[dict]:
    """Window outputs -> entities, in text order.

    "none": {"entity", "score", "index", "word", "start", "end"} per token;
    otherwise {"entity_group", "score", "word", "start", "end"} per entity.
    """
    strategy = aggregation_strategy.lower()
    if strategy not in STRATEGIES:
        raise InvalidInput(
            f"aggregation_strategy must be one of {STRATEGIES}, not {aggregation_strategy!r}"
        )
    ignore = {"O"} if ignore_labels is None else set(ignore_labels)
    tokens, text = prepared.tokens, prepared.text
    probs = token_scores(prepared, outputs)
    if probs.shape[1] != len(labels):
        raise ValueError(f"logits have {probs.shape[1]} classes for {len(labels)} labels")
    if len(tokens) == 0:
        return []

    if strategy in ("none", "simple"):
        best = probs.argmax(axis=-1)
        entities = [
            {
                "entity": labels[k],
                "score": float(probs[i, k]),
                "index": i + 1,
                "word": text[s:e],
                "start": int(s),
                "end": int(e),
            }
            for i, (k, (s, e)) in enumerate(zip(best, tokens.offsets, strict=True))
        ]
        if strategy == "none":
            return [ent for ent in entities if ent["entity"] not in ignore]
    else:
        entities = _words(tokens, probs, labels, strategy)
    # Grouping runs over every token, "O" included, and only then are labels ignored: an "O"
    # between two I-PER tokens splits them, as in the pipeline.
    return [g for g in _group(entities, text) if g["entity_group"] not in ignore]
