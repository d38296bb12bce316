"""heads.tasks.qa: windows like BertTokenizerFast's `only_second` overflow, answers like the
question-answering pipeline's, over contexts that span many windows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer

from heads.rows import InvalidInput, Outputs, encode
from heads.tasks import qa
from tests.heads.tasks.conftest import (
    as_lists,
    forward,
    hf_windows,
    repo_squad_pairs,
    squad_pairs,
)

CONTEXT = "the cats sat on the mat in new york city. paris is in france."


# --- preprocess -----------------------------------------------------------------------------


def test_windows_hold_the_question_and_overlapping_context(toy_tokenizer: Tokenizer) -> None:
    question, context = "where is paris", " ".join([CONTEXT] * 3)
    prepared = qa.preprocess(toy_tokenizer, question, context, max_seq_length=24, stride=5)
    assert prepared.windowed
    q_ids = encode(toy_tokenizer, question).ids.tolist()
    c = encode(toy_tokenizer, context)
    covered: list[int] = []
    for w in prepared.windows:
        ids, types = w.sequence.input_ids.tolist(), w.sequence.token_type_ids.tolist()
        assert len(ids) <= 24 and w.context_start == len(q_ids) + 2
        assert ids[1 : w.context_start - 1] == q_ids
        assert types == [0] * w.context_start + [1] * (len(ids) - w.context_start)
        first = [a for a, _ in c.offsets.tolist()].index(int(w.offsets[0, 0]))
        assert ids[w.context_start : -1] == c.ids[first : first + len(w.offsets)].tolist()
        covered.append(first)
    room = 24 - len(q_ids) - 3
    assert all(b - a == room - 5 for a, b in zip(covered, covered[1:], strict=False))


def test_word_spans_stop_at_the_window_edge(toy_tokenizer: Tokenizer) -> None:
    prepared = qa.preprocess(toy_tokenizer, "who", "the dogs ran faster", max_seq_length=64)
    w = prepared.windows[0]
    context = prepared.context
    assert [context[a:b] for a, b in w.offsets] == ["the", "dog", "s", "ran", "fast", "er"]
    assert [context[a:b] for a, b in w.word_spans] == [
        "the",
        "dogs",
        "dogs",
        "ran",
        "faster",
        "faster",
    ]
    # "dog" ends one window, "##s" opens the next: each window aligns to its own part
    cut = qa.preprocess(toy_tokenizer, "the", "the dogs ran faster", max_seq_length=6, stride=0)
    assert [[context[a:b] for a, b in w.word_spans] for w in cut.windows] == [
        ["the", "dog"],
        ["s", "ran"],
        ["faster", "faster"],
    ]


@pytest.mark.parametrize("context", ["", "   ", "\n\x07"])
def test_a_context_without_tokens_is_an_input_error(toy_tokenizer: Tokenizer, context: str) -> None:
    with pytest.raises(InvalidInput, match="context is empty"):
        qa.preprocess(toy_tokenizer, "where", context)


@pytest.mark.parametrize("question", ["", "   ", "\n\x07"])
def test_a_question_without_tokens_is_an_input_error(
    toy_tokenizer: Tokenizer, question: str
) -> None:
    # the pipeline refuses the empty question ("`question` cannot be empty") as it does the
    # empty context; one rule for both fields
    with pytest.raises(InvalidInput, match="question is empty"):
        qa.preprocess(toy_tokenizer, question, CONTEXT)


def test_questions_and_strides_that_leave_no_room(toy_tokenizer: Tokenizer) -> None:
    question = " ".join(["is the cat sat"] * 5)  # 20 tokens
    with pytest.raises(
        InvalidInput, match="question is too long for max_seq_len 23: its 20 tokens"
    ):
        qa.preprocess(toy_tokenizer, question, CONTEXT, max_seq_length=23)
    with pytest.raises(
        InvalidInput, match=r"doc_stride \(4\) must be smaller than the 4 context tokens"
    ):
        qa.preprocess(toy_tokenizer, question, CONTEXT, max_seq_length=27, stride=4)
    with pytest.raises(InvalidInput, match="max_question_len 8"):
        qa.preprocess(toy_tokenizer, question, CONTEXT, max_question_len=8)
    # a context that fits needs no stride at all
    assert not qa.preprocess(
        toy_tokenizer, question, "a cat", max_seq_length=27, stride=100
    ).windowed


# --- decode_spans and postprocess on hand-made logits ---------------------------------------


def test_decode_spans_ranks_valid_spans_only() -> None:
    start = np.array([0.0, 0.5, 0.1, 0.35, 0.1], dtype=np.float32)
    end = np.array([0.0, 0.1, 0.6, 0.1, 0.2], dtype=np.float32)
    undesired = np.array([True, False, False, False, False])
    starts, ends, scores = qa.decode_spans(start, end, 3, 15, undesired)
    assert list(zip(starts.tolist(), ends.tolist(), strict=True)) == [(1, 2), (1, 4), (3, 4)]
    assert scores.tolist() == pytest.approx([0.30, 0.10, 0.07])
    # (1, 4) is four tokens long: out with max_answer_len 3; (3, 2) ends before it starts
    starts, ends, _ = qa.decode_spans(start, end, 10, 3, undesired)
    assert (1, 4) not in zip(starts.tolist(), ends.tolist(), strict=True)
    assert all(s <= e for s, e in zip(starts, ends, strict=True))
    assert len(starts) == 4 + 3 + 2  # every valid span, no padding with invalid ones


@pytest.mark.parametrize("seed", range(5))
def test_decode_spans_agrees_with_the_pipelines(seed: int) -> None:
    transformers_qa = pytest.importorskip("transformers.pipelines.question_answering")
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 200))
    start, end = (rng.dirichlet(np.ones(n)).astype(np.float32) for _ in range(2))
    undesired = np.zeros(n, dtype=bool)
    undesired[: rng.integers(1, 15)] = True  # [CLS] and a question
    undesired[-1] = True  # [SEP]
    start[undesired] = end[undesired] = 0.0
    for top_k, max_answer_len in [(1, 15), (7, 15), (20, 3), (5, 40)]:
        ours = qa.decode_spans(start, end, top_k, max_answer_len, undesired)
        theirs = transformers_qa.decode_spans(
            start, end, top_k, max_answer_len, (~undesired).astype(int)
        )
        for a, b in zip(ours, theirs, strict=True):
            assert np.asarray(a).tolist() == pytest.approx(np.asarray(b).tolist())


def _fake(
    prepared: qa.WindowedContext, context: str, start_word: str, end_word: str, cls: float = 0.0
) -> list[Outputs]:
    """One window; high start logit on `start_word`'s token, high end logit on `end_word`'s."""
    (w,) = prepared.windows
    tokens = [context[a:b] for a, b in w.offsets]
    s = np.zeros(len(w.sequence), dtype=np.float32)
    e = np.zeros(len(w.sequence), dtype=np.float32)
    s[w.context_start + tokens.index(start_word)] = 8.0
    e[w.context_start + tokens.index(end_word)] = 8.0
    s[0] = e[0] = cls
    return [{"start_logits": s, "end_logits": e}]


def test_answers_are_context_spans_widened_to_words(toy_tokenizer: Tokenizer) -> None:
    context = "the dogs ran faster than cats"
    prepared = qa.preprocess(toy_tokenizer, "who ran", context)
    outputs = _fake(prepared, context, "s", "ran")  # the span starts inside "dogs"
    best = qa.postprocess(prepared, outputs)
    assert [(a["answer"], a["start"], a["end"]) for a in best] == [("dogs ran", 4, 12)]
    assert best[0]["answer"] == context[best[0]["start"] : best[0]["end"]]
    loose = qa.postprocess(prepared, outputs, align_to_words=False)
    assert loose[0]["answer"] == "s ran"
    # "dog ran" and "s ran" both widen to "dogs ran": one answer, the scores added
    top = qa.postprocess(prepared, outputs, top_k=30)
    assert len({a["answer"] for a in top}) == len(top)
    w = prepared.windows[0]
    allowed = np.zeros(len(w.sequence), dtype=bool)
    allowed[0] = allowed[w.context_start : -1] = True
    p_start, p_end = qa.span_probs(outputs[0]["start_logits"], outputs[0]["end_logits"], allowed)
    dog, s, ran = (w.context_start + i for i in (1, 2, 3))
    assert best[0]["score"] == pytest.approx(
        float(p_start[dog] * p_end[ran] + p_start[s] * p_end[ran])
    )


def test_the_null_answer_competes_only_when_asked(toy_tokenizer: Tokenizer) -> None:
    context = "paris is in france"
    prepared = qa.preprocess(toy_tokenizer, "where", context)
    outputs = _fake(prepared, context, "paris", "paris", cls=12.0)
    assert qa.postprocess(prepared, outputs)[0]["answer"] == "paris"
    null, *rest = qa.postprocess(prepared, outputs, top_k=2, handle_impossible_answer=True)
    assert (null["answer"], null["start"], null["end"]) == ("", 0, 0)
    assert null["score"] > rest[0]["score"]
    with pytest.raises(InvalidInput, match="top_k"):
        qa.postprocess(prepared, outputs, top_k=0)


def _windows_with_spans(
    prepared: qa.WindowedContext, spans: dict[int, tuple[int, int, float]], cls: list[float]
) -> list[Outputs]:
    """Per window flat logits, [CLS] at cls[k], and in window k of `spans` a span (s, e) of
    its context tokens with start and end logits `strength`."""
    outputs = []
    for k, w in enumerate(prepared.windows):
        s = np.zeros(len(w.sequence), dtype=np.float32)
        e = np.zeros(len(w.sequence), dtype=np.float32)
        if k in spans:
            first, last, strength = spans[k]
            s[w.context_start + first] = e[w.context_start + last] = strength
        s[0] = e[0] = cls[k]
        outputs.append({"start_logits": s, "end_logits": e})
    return outputs


def test_the_answer_comes_from_whichever_window_holds_it(toy_tokenizer: Tokenizer) -> None:
    """A context of many windows: the best span is found in each window in turn, the top_k
    ranks spans of different windows together, and the null answer is the least likely one
    over all windows (the pipeline's `min_null_score`)."""
    # 40 different words of two tokens each ("ba" is "b ##a"): every answer text is unique
    context = " ".join(f"{a}{b}" for a in "bcdfghjk" for b in "aeiou")
    prepared = qa.preprocess(toy_tokenizer, "where", context, max_seq_length=24, stride=5)
    n = len(prepared.windows)
    assert n >= 5
    for k, w in enumerate(prepared.windows):
        # a span in the middle of window k (two tokens), where no other window reads
        mid = len(w.offsets) // 2
        outputs = _windows_with_spans(prepared, {k: (mid, mid + 1, 9.0)}, [0.0] * n)
        (best,) = qa.postprocess(prepared, outputs)
        assert (best["start"], best["end"]) == (
            int(w.word_spans[mid, 0]),
            int(w.word_spans[mid + 1, 1]),
        ), f"window {k}"
        assert best["answer"] == context[best["start"] : best["end"]]
    # top_k across windows: the last window's span is surer than the first's
    first, last = prepared.windows[0], prepared.windows[-1]
    outputs = _windows_with_spans(prepared, {0: (1, 1, 7.0), n - 1: (2, 2, 9.0)}, [0.0] * n)
    top = qa.postprocess(prepared, outputs, top_k=2, max_answer_len=1)
    assert [(a["start"], a["end"]) for a in top] == [
        tuple(int(x) for x in last.word_spans[2]),
        tuple(int(x) for x in first.word_spans[1]),
    ]
    assert top[0]["score"] > top[1]["score"]
    # impossible answers: every window but window 2 is sure there is none
    cls = [12.0] * n
    cls[2] = 0.0
    outputs = _windows_with_spans(prepared, {1: (1, 2, 3.0)}, cls)
    answers = qa.postprocess(prepared, outputs, top_k=10_000, handle_impossible_answer=True)
    (null,) = [a for a in answers if a["answer"] == ""]
    w2 = prepared.windows[2]
    allowed = np.zeros(len(w2.sequence), dtype=bool)
    allowed[0] = True
    allowed[w2.context_start : w2.context_start + len(w2.offsets)] = True
    p_start, p_end = qa.span_probs(outputs[2]["start_logits"], outputs[2]["end_logits"], allowed)
    assert null["score"] == pytest.approx(float(p_start[0] * p_end[0]), rel=1e-6)
    assert qa.postprocess(prepared, outputs)[0]["answer"] != ""  # only when asked


def test_a_later_windows_span_of_the_same_text_adds_to_the_first(toy_tokenizer: Tokenizer) -> None:
    """The same answer text found in two windows scores the sum, as in the pipeline."""
    context = " ".join(["the cats sat on the mat in new york city. paris is in france."] * 4)
    prepared = qa.preprocess(toy_tokenizer, "where", context, max_seq_length=24, stride=5)
    words = [[context[a:b] for a, b in w.word_spans] for w in prepared.windows]
    k0 = next(k for k, ws in enumerate(words) if "paris" in ws)
    k1 = next(k for k, ws in enumerate(words) if "paris" in ws and k > k0 + 1)
    i0, i1 = words[k0].index("paris"), words[k1].index("paris")
    n = len(prepared.windows)
    both = _windows_with_spans(prepared, {k0: (i0, i0, 6.0), k1: (i1, i1, 6.0)}, [0.0] * n)
    one = _windows_with_spans(prepared, {k0: (i0, i0, 6.0)}, [0.0] * n)
    (together,) = qa.postprocess(prepared, both)
    (alone,) = qa.postprocess(prepared, one)
    assert together["answer"] == alone["answer"] == "paris"
    assert together["start"] == alone["start"]  # the first one found keeps its place
    assert together["score"] > 1.5 * alone["score"]


# --- parity with transformers' pipeline on SQuAD --------------------------------------------

UNICODE_PAIRS = [
    (
        "Who met Zoë?",
        "José Müller 😀 met Zoë in São Paulo; 東京 was far. Cafe\u0301 naïve\x07 ﬁne.",
    ),
    ("What is 北京?", "北京 is a city in China and 東京 is a city in Japan, both large 🏙 places."),
]


@pytest.mark.shared
@pytest.mark.parametrize(
    ("top_k", "max_answer_len", "handle_impossible_answer"),
    [(1, 15, False), (3, 15, True), (5, 4, False)],
)
def test_same_answers_as_the_pipeline(
    tok_uncased: Tokenizer,
    hf_uncased: Any,
    tiny_model: Any,
    shared_data: Path,
    top_k: int,
    max_answer_len: int,
    handle_impossible_answer: bool,
) -> None:
    from transformers import pipeline

    model = tiny_model("BertForQuestionAnswering", hf_uncased.vocab_size, seed=2)
    pipe = pipeline("question-answering", model=model, tokenizer=hf_uncased)
    kwargs = {"max_seq_len": 64, "doc_stride": 16}  # small windows: most contexts span several
    n_windowed = 0
    for question, context in squad_pairs(shared_data, 50) + UNICODE_PAIRS:
        prepared = qa.preprocess(tok_uncased, question, context, max_seq_length=64, stride=16)
        hf = hf_windows(hf_uncased, question, context, 64, 16)
        assert as_lists(prepared.sequences) == hf["input_ids"]
        assert [s.token_type_ids.tolist() for s in prepared.sequences] == hf["token_type_ids"]
        n_windowed += prepared.windowed
        outputs = [forward(model, s) for s in prepared.sequences]
        ours = qa.postprocess(prepared, outputs, top_k, max_answer_len, handle_impossible_answer)
        theirs = pipe(
            question=question,
            context=context,
            top_k=top_k,
            max_answer_len=max_answer_len,
            handle_impossible_answer=handle_impossible_answer,
            **kwargs,
        )
        theirs = theirs if isinstance(theirs, list) else [theirs]
        assert [(a["start"], a["end"]) for a in ours] == [(a["start"], a["end"]) for a in theirs], (
            question
        )
        assert [a["score"] for a in ours] == pytest.approx([a["score"] for a in theirs], abs=1e-4)
        assert all(a["answer"] == context[a["start"] : a["end"]] for a in ours)
    assert n_windowed >= 40


@pytest.mark.parametrize(
    ("top_k", "max_answer_len", "handle_impossible_answer"),
    [(1, 15, False), (3, 15, True), (5, 4, False)],
)
def test_same_answers_as_the_pipeline_on_shipped_text(
    tok_repo: Tokenizer,
    hf_repo: Any,
    tiny_model: Any,
    top_k: int,
    max_answer_len: int,
    handle_impossible_answer: bool,
) -> None:
    """The fresh-clone twin of the test above: the questions of examples/data/qa and the
    demo's generated paragraphs, most of them several windows long, with a tokenizer trained on
    the repository's text; some answers must come from a window after the first."""
    from transformers import pipeline

    model = tiny_model("BertForQuestionAnswering", len(hf_repo), seed=2)
    pipe = pipeline("question-answering", model=model, tokenizer=hf_repo)
    n_windowed = later = 0
    for question, context in repo_squad_pairs(70) + UNICODE_PAIRS:
        prepared = qa.preprocess(tok_repo, question, context, max_seq_length=64, stride=16)
        hf = hf_windows(hf_repo, question, context, 64, 16)
        assert as_lists(prepared.sequences) == hf["input_ids"]
        n_windowed += prepared.windowed
        outputs = [forward(model, s) for s in prepared.sequences]
        ours = qa.postprocess(prepared, outputs, top_k, max_answer_len, handle_impossible_answer)
        theirs = pipe(
            question=question,
            context=context,
            top_k=top_k,
            max_answer_len=max_answer_len,
            handle_impossible_answer=handle_impossible_answer,
            max_seq_len=64,
            doc_stride=16,
        )
        theirs = theirs if isinstance(theirs, list) else [theirs]
        assert [(a["start"], a["end"]) for a in ours] == [(a["start"], a["end"]) for a in theirs], (
            question
        )
        assert [a["score"] for a in ours] == pytest.approx([a["score"] for a in theirs], abs=1e-4)
        assert all(a["answer"] == context[a["start"] : a["end"]] for a in ours)
        first_window_end = int(prepared.windows[0].offsets[-1, 1])
        later += any(a["start"] >= first_window_end for a in ours)
    assert n_windowed >= 25, n_windowed
    assert later >= 5, later  # answers that only a window after the first holds
