"""Token classification (NER): a text -> entities with character offsets into that text.

    windowed = preprocess(tokenizer, text, max_seq_length=128, stride=32)
    # the batcher runs windowed.sequences; each window's Outputs has `logits` (L, C)
    entities = postprocess(windowed, outputs, labels, aggregation_strategy="simple")

The service runs the same two steps as a `Job` (see heads.tasks), one per request.

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
from typing import Any

import numpy as np
from tokenizers import Encoding, Tokenizer

from heads.package import ModelPackage
from heads.rows import (
    InvalidInput,
    ModelRow,
    Outputs,
    Tokens,
    Windowed,
    encode,
    row,
    template,
    tokens,
    windows,
)
from heads.tasks import TaskOptions, one_by_one

__all__ = [
    "STRATEGIES",
    "Job",
    "Window",
    "WindowedText",
    "default_stride",
    "postprocess",
    "preprocess",
    "token_scores",
]

STRATEGIES = ("none", "simple", "first", "average", "max")


@dataclass(frozen=True, slots=True)
class Window:
    """One model row over text tokens [start, stop).

    offsets (L, 2): character offsets of each row position, (0, 0) on [CLS] / [SEP].
    """

    sequence: ModelRow
    start: int
    stop: int
    offsets: np.ndarray


@dataclass(frozen=True, slots=True)
class WindowedText(Windowed):
    """A text, its tokens, and the windows (model rows) that cover them."""

    text: str
    tokens: Tokens
    windows: list[Window]


def default_stride(max_seq_length: int) -> int:
    """Tokens shared by consecutive windows when the request names none: a quarter of the
    window's text tokens."""
    return (max_seq_length - 2) // 4


def check_stride(stride: int, max_seq_length: int) -> None:
    room = max_seq_length - 2
    if not 0 <= stride < room:
        raise InvalidInput(
            f"stride ({stride}) must be smaller than the window's {room} text tokens"
        )


def preprocess(tokenizer: Tokenizer, text: str, max_seq_length: int, stride: int) -> WindowedText:
    """Cut the text into windows of at most `max_seq_length` tokens with special tokens,
    consecutive windows sharing `stride` tokens (the pipeline's `stride`)."""
    return _windowed(tokenizer, text, encode(tokenizer, text), max_seq_length, stride)


def _windowed(
    tokenizer: Tokenizer, text: str, text_tokens: Tokens, max_seq_length: int, stride: int
) -> WindowedText:
    layout = template(tokenizer)
    before, after = len(layout.single.prefix), len(layout.single.suffix)
    room = max_seq_length - before - after
    if room < 1:
        raise ValueError(f"max_seq_length ({max_seq_length}) leaves no room for any token")
    # The empty text still gets its row `[CLS] [SEP]`, like the pipeline's, so that every
    # request hands the batcher at least one row.
    spans = windows(len(text_tokens), room, stride)
    out = []
    for start, stop in spans:
        n = stop - start
        offsets = np.zeros((before + n + after, 2), dtype=np.int64)
        offsets[before : before + n] = text_tokens.offsets[start:stop]
        seq = row(layout, text_tokens.ids[start:stop])
        out.append(Window(sequence=seq, start=start, stop=stop, offsets=offsets))
    return WindowedText(text=text, tokens=text_tokens, windows=out)


def _softmax(logits: np.ndarray) -> np.ndarray:
    # float32, as the pipeline computes it (fp16 graphs are widened first)
    x = np.asarray(logits, dtype=np.float32)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def token_scores(prepared: WindowedText, outputs: list[Outputs]) -> np.ndarray:
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
    assert probs is not None  # preprocess always makes at least one window
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
    """Per word (a token and the subword tokens after it, `Tokens.subword`) one label, by the
    strategy."""
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


def postprocess(
    prepared: WindowedText,
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

    if strategy == "none":
        return _per_token(tokens, probs, labels, text, ignore)
    if strategy == "simple":
        return _simple(tokens, probs, labels, text, ignore)
    # Grouping runs over every token, "O" included, and only then are labels ignored: an "O"
    # between two I-PER tokens splits them, as in the pipeline.
    entities = _words(tokens, probs, labels, strategy)
    return [g for g in _group(entities, text) if g["entity_group"] not in ignore]


def _per_token(
    tokens: Tokens, probs: np.ndarray, labels: list[str], text: str, ignore: set[str]
) -> list[dict]:
    """Strategy "none": one entry per token whose label is not ignored."""
    best = probs.argmax(axis=-1)
    keep = np.flatnonzero(~np.isin(best, [k for k, lab in enumerate(labels) if lab in ignore]))
    scores = probs[keep, best[keep]].tolist()
    offsets = tokens.offsets[keep].tolist()
    return [
        {"entity": labels[k], "score": p, "index": i + 1, "word": text[s:e], "start": s, "end": e}
        for i, k, p, (s, e) in zip(keep.tolist(), best[keep].tolist(), scores, offsets, strict=True)
    ]


def _simple(
    tokens: Tokens, probs: np.ndarray, labels: list[str], text: str, ignore: set[str]
) -> list[dict]:
    """Strategy "simple": `_group` over the tokens' best labels, in arrays. Python loops over
    tokens cost ~190 us per sentence on the service's worker thread; this runs per group."""
    best = probs.argmax(axis=-1)  # (T,)
    scores = probs[np.arange(len(best)), best].astype(np.float64)  # (T,)
    tags = [_tag(label) for label in labels]
    names = sorted({tag for _, tag in tags})
    is_b = np.array([bi == "B" for bi, _ in tags])[best]
    tag_id = np.array([names.index(tag) for _, tag in tags])[best]
    # a group starts at the first token, at a B- tag, and where the tag changes
    first = np.flatnonzero(np.r_[True, is_b[1:] | (tag_id[1:] != tag_id[:-1])])
    last = np.r_[first[1:], len(best)] - 1
    out = []
    for a, b, t in zip(first.tolist(), last.tolist(), tag_id[first].tolist(), strict=True):
        if names[t] in ignore:
            continue
        start, end = int(tokens.offsets[a, 0]), int(tokens.offsets[b, 1])
        group = scores[a : b + 1]
        # np.nanmean as `_group` computes it; a sum of fewer than 8 terms is the same in any
        # numpy reduction, so short groups skip its per-call overhead.
        score = float(np.nanmean(group)) if len(group) >= 8 or np.isnan(group).any() else None
        if score is None:
            score = sum(group.tolist()) / len(group)
        out.append(
            {
                "entity_group": names[t],
                "score": score,
                "word": text[start:end],
                "start": start,
                "end": end,
            }
        )
    return out


@dataclass(frozen=True, kw_only=True)
class Options(TaskOptions):
    """/ner's options, the token-classification pipeline's names: how tokens are grouped
    into entities, which labels are left out (None: "O"), and the tokens consecutive windows
    of a long text share (None: default_stride)."""

    task = "token-classification"

    aggregation_strategy: str = "simple"
    ignore_labels: list[str] | None = None
    stride: int | None = None

    def job(self, package: ModelPackage, inputs: list[Any]) -> Job:
        return Job(package, inputs, self)


class Job:
    """One /ner request for a model's batcher: texts -> windows (rows) -> per text a list of
    entities (`postprocess`)."""

    truncated = 0

    def __init__(
        self, package: ModelPackage, texts: list[str], options: Options = Options()
    ) -> None:
        self.texts = texts
        self.labels = package.labels or []
        self.max_seq_length = package.max_seq_length
        stride = options.stride
        self.stride = default_stride(self.max_seq_length) if stride is None else stride
        check_stride(self.stride, self.max_seq_length)  # a 422 before any compute
        self.strategy, self.ignore_labels = options.aggregation_strategy, options.ignore_labels
        self.windowed = 0
        self._texts: list[WindowedText] = []

    def rows(self, tokenizer: Tokenizer, encodings: list[Encoding]) -> list[ModelRow]:
        self._texts = [
            _windowed(
                tokenizer, text, tokens(tokenizer, enc, text), self.max_seq_length, self.stride
            )
            for text, enc in zip(self.texts, encodings, strict=True)
        ]
        self.windowed = sum(t.windowed for t in self._texts)
        return [seq for t in self._texts for seq in t.sequences]

    def answer(self, outputs: list[Outputs]) -> list[list[dict]]:
        results, at = [], 0
        for t in self._texts:
            n = len(t.windows)
            entities = postprocess(
                t, outputs[at : at + n], self.labels, self.strategy, self.ignore_labels
            )
            results.append(entities)
            at += n
        return results

    @staticmethod
    def answer_many(jobs: list[Job], outputs: list[list[Outputs]]) -> list[Any]:
        return one_by_one(jobs, outputs)  # nothing to share between jobs
