"""Extractive question answering: (question, context) -> answer spans of the context.

    windowed = preprocess(tokenizer, question, context, max_seq_length=384, stride=128)
    # the batcher runs windowed.sequences; each window's Outputs has start_logits / end_logits (L,)
    answers = postprocess(windowed, outputs, top_k=1)

The service runs the same two steps as a `Job` (see heads.tasks), one per request. The HTTP
API keeps the pipeline's names `max_seq_len` and `doc_stride`; here they are `max_seq_length`
and `stride`, as in the other heads.

Semantics follow transformers' question-answering pipeline (fast tokenizer path), so that
`training.evaluate` and the service score spans the same way:

- windows `[CLS] question [SEP] context-part [SEP]`; consecutive windows share `stride`
  context tokens; the question is never cut;
- per window, tokens outside the context (except [CLS]) are masked, start and end logits get a
  softmax each, a span scores start_prob * end_prob with end >= start and at most
  `max_answer_len` tokens; spans widen to whole words (`align_to_words`); the same answer text
  (ignoring case) found again, in this window or another, adds its score to the first one;
- the null answer scores min over windows of p_start[CLS] * p_end[CLS] and competes only with
  `handle_impossible_answer`.

Differences, on purpose: a list is returned also for top_k=1 (the pipeline returns a bare dict);
only valid spans are returned, so fewer than top_k answers come back when the context has fewer
spans (the pipeline pads with zero-score spans that can be empty or reversed); a question that
leaves no room for context, an empty context, or a stride too large for the room left, is an
InvalidInput (the tokenizer would raise); so is an empty question, as the pipeline refuses it
("`question` cannot be empty"), also when it is only spaces (no tokens to ask with);
`max_question_len` refuses longer questions rather than cut them (the fast pipeline ignores it).
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
    "Job",
    "Window",
    "WindowedContext",
    "decode_spans",
    "default_stride",
    "postprocess",
    "preprocess",
    "span_probs",
]

# The pipeline's mask value: exp(-10000 - max) is exactly 0 in float32.
_MASKED = -10000.0


@dataclass(frozen=True, slots=True)
class Window:
    """One model row; its context tokens sit at row positions [context_start, context_start + n).

    offsets (n, 2): character offsets of those tokens in the context;
    word_spans (n, 2): character span of the word each token belongs to, counting only this
    window's tokens (a word cut by the window edge ends at the edge), as the pipeline aligns.
    """

    sequence: ModelRow
    context_start: int
    offsets: np.ndarray
    word_spans: np.ndarray


@dataclass(frozen=True, slots=True)
class WindowedContext(Windowed):
    """A context and the windows (model rows) that cover it, each beside the question."""

    context: str
    windows: list[Window]


def _word_spans(offsets: np.ndarray, words: np.ndarray) -> np.ndarray:
    """(n, 2) offsets and (n,) non-decreasing word ids -> each token's word span: from its
    word's first token's start to its last token's end. n >= 1: a window holds at least one
    context token (preprocess refuses a question that leaves no room)."""
    n = len(words)
    first = np.empty(n, dtype=bool)  # a token that starts a word (within this window)
    first[0] = True
    np.not_equal(words[1:], words[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    ends = np.append(starts[1:] - 1, n - 1)
    word = np.cumsum(first) - 1  # (n,) index into starts / ends
    spans = np.empty_like(offsets)
    spans[:, 0] = offsets[starts[word], 0]
    spans[:, 1] = offsets[ends[word], 1]
    return spans


def default_stride(max_seq_length: int) -> int:
    """Context tokens shared by consecutive windows when the request names none (the
    pipeline's doc_stride 128, at most half the window)."""
    return min(128, max_seq_length // 2)


def preprocess(
    tokenizer: Tokenizer,
    question: str,
    context: str,
    max_seq_length: int = 384,
    stride: int = 128,
    max_question_len: int | None = None,
) -> WindowedContext:
    """Windows over the context, each `[CLS] question [SEP] part [SEP]` of <= max_seq_length
    tokens; consecutive windows share `stride` context tokens."""
    q, c = encode(tokenizer, question), encode(tokenizer, context)
    return _windowed(tokenizer, q, c, context, max_seq_length, stride, max_question_len)


def _windowed(
    tokenizer: Tokenizer,
    q: Tokens,
    c: Tokens,
    context: str,
    max_seq_length: int,
    stride: int,
    max_question_len: int | None = None,
) -> WindowedContext:
    layout = template(tokenizer).pair
    if len(q) == 0:
        raise InvalidInput("question is empty: it has no tokens to ask with")
    if len(c) == 0:
        raise InvalidInput("context is empty: it has no tokens to answer from")
    if max_question_len is not None and len(q) > max_question_len:
        raise InvalidInput(
            f"question is {len(q)} tokens long, more than max_question_len {max_question_len}"
        )
    room = max_seq_length - len(q) - layout.n_special
    if room < 1:
        raise InvalidInput(
            f"question is too long for max_seq_len {max_seq_length}: its {len(q)} tokens leave "
            "no room for the context"
        )
    if stride < 0:
        raise InvalidInput(f"doc_stride must be >= 0, not {stride}")
    if len(c) > room and stride >= room:
        raise InvalidInput(
            f"doc_stride ({stride}) must be smaller than the {room} context tokens that fit "
            f"in a window beside the question; lower doc_stride or raise max_seq_len"
        )
    out = []
    for start, stop in windows(len(c), room, stride):
        offsets = c.offsets[start:stop]
        out.append(
            Window(
                sequence=row(template(tokenizer), q.ids, c.ids[start:stop]),
                context_start=len(layout.prefix) + len(q) + len(layout.middle),
                offsets=offsets,
                word_spans=_word_spans(offsets, c.words[start:stop]),
            )
        )
    return WindowedContext(context=context, windows=out)


def span_probs(
    start_logits: np.ndarray, end_logits: np.ndarray, allowed: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(L,) logits -> (L,) float32 start and end probabilities, each a softmax over the
    `allowed` positions only (others get probability 0)."""
    start = np.where(allowed, np.asarray(start_logits, dtype=np.float32), np.float32(_MASKED))
    end = np.where(allowed, np.asarray(end_logits, dtype=np.float32), np.float32(_MASKED))
    start = np.exp(start - start.max())
    end = np.exp(end - end.max())
    return start / start.sum(), end / end.sum()


def decode_spans(
    start_probs: np.ndarray,
    end_probs: np.ndarray,
    top_k: int,
    max_answer_len: int,
    undesired: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The `top_k` best token spans, best first: (starts, ends, scores), ends inclusive.

    A span (s, e) scores start_probs[s] * end_probs[e]; it needs s <= e < s + max_answer_len,
    and neither end on an `undesired` position (L,) bool (question, special tokens).
    """
    n = len(start_probs)
    # Only the band s <= e < s + max_answer_len, in row-major order (s, then e): n * 15 pairs
    # instead of the n * n the pipeline's outer product builds.
    width = min(max_answer_len, n)
    s_idx = np.repeat(np.arange(n), width)
    e_idx = s_idx + np.tile(np.arange(width), n)
    inside = e_idx < n
    s_idx, e_idx = s_idx[inside], e_idx[inside]
    keep = ~undesired[s_idx] & ~undesired[e_idx]
    s_idx, e_idx = s_idx[keep], e_idx[keep]
    scores = start_probs[s_idx] * end_probs[e_idx]
    if top_k < len(scores):
        # Keep every span above the k-th best score, then the earliest of those tied with it
        # (argpartition alone keeps any of them). Kept in row-major order, the stable sort
        # then breaks ties as the pipeline's argmax does: the earliest span wins.
        kth = np.partition(scores, len(scores) - top_k)[len(scores) - top_k]
        above = np.flatnonzero(scores > kth)
        part = np.union1d(above, np.flatnonzero(scores == kth)[: top_k - len(above)])
        order = part[np.argsort(-scores[part], kind="stable")]
    else:
        order = np.argsort(-scores, kind="stable")
    return s_idx[order], e_idx[order], scores[order]


def postprocess(
    prepared: WindowedContext,
    outputs: list[Outputs],
    top_k: int = 1,
    max_answer_len: int = 15,
    handle_impossible_answer: bool = False,
    align_to_words: bool = True,
) -> list[dict]:
    """Window outputs -> up to `top_k` answers {"answer", "score", "start", "end"}, best first;
    start / end are character offsets into the context and answer == context[start:end]."""
    if top_k < 1:
        raise InvalidInput(f"top_k must be at least 1, not {top_k}")
    if max_answer_len < 1:
        raise InvalidInput(f"max_answer_len must be at least 1, not {max_answer_len}")
    if len(outputs) != len(prepared.windows):
        raise ValueError(f"{len(outputs)} outputs for {len(prepared.windows)} windows")
    # Word alignment can map several token spans onto one answer, so the pipeline looks past
    # top_k per window; the same margin keeps our scores equal to its scores.
    per_window = top_k * 2 + 10 if align_to_words else top_k
    context = prepared.context
    answers: list[dict] = []
    by_text: dict[str, dict] = {}
    min_null = np.inf
    for window, out in zip(prepared.windows, outputs, strict=True):
        n_row = len(window.sequence)
        c0, c1 = window.context_start, window.context_start + len(window.offsets)
        in_context = np.zeros(n_row, dtype=bool)
        in_context[c0:c1] = True
        allowed = in_context.copy()
        allowed[0] = True  # [CLS] joins the softmax: it carries the "no answer" score
        start, end = span_probs(out["start_logits"], out["end_logits"], allowed)
        min_null = min(min_null, float(start[0] * end[0]))
        starts, ends, scores = decode_spans(start, end, per_window, max_answer_len, ~in_context)
        spans = window.word_spans if align_to_words else window.offsets
        for s, e, score in zip(starts, ends, scores, strict=True):
            a, b = int(spans[s - c0, 0]), int(spans[e - c0, 1])
            key = context[a:b].lower()
            if key in by_text:
                by_text[key]["score"] += float(score)
            else:
                by_text[key] = {"answer": context[a:b], "score": float(score), "start": a, "end": b}
                answers.append(by_text[key])
    if handle_impossible_answer:
        answers.append({"answer": "", "score": min_null, "start": 0, "end": 0})
    return sorted(answers, key=lambda x: x["score"], reverse=True)[:top_k]


@dataclass(frozen=True, kw_only=True)
class Options(TaskOptions):
    """/qa's options, the question-answering pipeline's names: answers per pair, the longest
    answer in tokens, the window (at most the package's) and the tokens consecutive windows
    share (None: default_stride), and whether "no answer" may win."""

    task = "question-answering"

    top_k: int = 1
    max_answer_len: int = 15
    max_seq_len: int = 384
    doc_stride: int | None = None
    handle_impossible_answer: bool = False

    def job(self, package: ModelPackage, inputs: list[Any]) -> Job:
        return Job(package, inputs, self)


class Job:
    """One /qa request for a model's batcher: (question, context) pairs -> windows (rows) ->
    per pair its best span, or None when the context has none; a list of up to top_k spans
    when top_k > 1."""

    truncated = 0

    def __init__(
        self, package: ModelPackage, pairs: list[tuple[str, str]], options: Options = Options()
    ) -> None:
        self.contexts = [context for _, context in pairs]
        self.texts = [text for pair in pairs for text in pair]
        self.max_seq_length = min(options.max_seq_len, package.max_seq_length)
        stride = options.doc_stride
        self.stride = default_stride(self.max_seq_length) if stride is None else stride
        self.top_k, self.max_answer_len = options.top_k, options.max_answer_len
        self.handle_impossible_answer = options.handle_impossible_answer
        self.windowed = 0
        self._contexts: list[WindowedContext] = []

    def rows(self, tokenizer: Tokenizer, encodings: list[Encoding]) -> list[ModelRow]:
        self._contexts = [
            _windowed(
                tokenizer,
                tokens(tokenizer, encodings[2 * i]),
                tokens(tokenizer, encodings[2 * i + 1]),
                context,
                self.max_seq_length,
                self.stride,
            )
            for i, context in enumerate(self.contexts)
        ]
        self.windowed = sum(c.windowed for c in self._contexts)
        return [seq for c in self._contexts for seq in c.sequences]

    def answer(self, outputs: list[Outputs]) -> list[Any]:
        results: list[Any] = []
        at = 0
        for c in self._contexts:
            n = len(c.windows)
            spans = postprocess(
                c,
                outputs[at : at + n],
                self.top_k,
                self.max_answer_len,
                self.handle_impossible_answer,
            )
            at += n
            results.append(spans if self.top_k > 1 else (spans[0] if spans else None))
        return results

    @staticmethod
    def answer_many(jobs: list[Job], outputs: list[list[Outputs]]) -> list[Any]:
        return one_by_one(jobs, outputs)  # nothing to share between jobs
