"""heads.tasks.qa at its edges: each limit just inside and just outside (question length, the
room a window leaves, the stride), the messages word for word, span ranking with ties and with
every span asked for, large logits, and a Job's options reaching its answer (run as the batcher
runs it on a tiny exported QA model)."""

from __future__ import annotations

import copy
import inspect
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer

from heads.package import ModelPackage, read_package
from heads.tasks import qa
from tests.families import family_checkpoint, family_package
from tests.heads.tasks.conftest import as_lists, forward, hf_windows, refused, repo_squad_pairs
from tests.heads.tasks.served import run_job

QUESTION = "where is the cat"
CONTEXT = "the cats sat on the mat in new york city. paris is in france."


def n_tokens(tokenizer: Tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False).ids)


def test_an_empty_question_or_context_is_named(toy_tokenizer: Tokenizer) -> None:
    with refused("question is empty: it has no tokens to ask with"):
        qa.preprocess(toy_tokenizer, " ", CONTEXT)
    with refused("context is empty: it has no tokens to answer from"):
        qa.preprocess(toy_tokenizer, QUESTION, " ")


def test_each_limit_just_inside_and_just_outside(toy_tokenizer: Tokenizer) -> None:
    n = n_tokens(toy_tokenizer, QUESTION)
    qa.preprocess(toy_tokenizer, QUESTION, CONTEXT, max_question_len=n)
    with refused(f"question is {n} tokens long, more than max_question_len {n - 1}"):
        qa.preprocess(toy_tokenizer, QUESTION, CONTEXT, max_question_len=n - 1)
    # a room of one context token: one window per token
    one = qa.preprocess(toy_tokenizer, QUESTION, "a cat", max_seq_length=n + 4, stride=0)
    assert [len(w.offsets) for w in one.windows] == [1] * n_tokens(toy_tokenizer, "a cat")
    with refused(
        f"question is too long for max_seq_len {n + 3}: its {n} tokens leave no room for the "
        "context"
    ):
        qa.preprocess(toy_tokenizer, QUESTION, "a cat", max_seq_length=n + 3)
    with refused("doc_stride must be >= 0, not -1"):
        qa.preprocess(toy_tokenizer, QUESTION, "a cat", stride=-1)
    # a context exactly as long as the room fits one window: no stride is needed
    c = n_tokens(toy_tokenizer, "a cat sat")
    fits = qa.preprocess(toy_tokenizer, QUESTION, "a cat sat", max_seq_length=n + 3 + c, stride=c)
    assert not fits.windowed
    with refused(
        f"doc_stride ({c - 1}) must be smaller than the {c - 1} context tokens that fit in a "
        "window beside the question; lower doc_stride or raise max_seq_len"
    ):
        qa.preprocess(toy_tokenizer, QUESTION, "a cat sat", max_seq_length=n + 2 + c, stride=c - 1)


def test_the_default_stride_is_the_pipelines_at_most_half_the_window() -> None:
    assert [qa.default_stride(n) for n in (1000, 257, 256, 100, 3)] == [128, 128, 128, 50, 1]


def test_spans_rank_best_first_whether_all_or_some_are_asked_for() -> None:
    rng = np.random.default_rng(0)
    start, end = rng.random(6).astype(np.float32), rng.random(6).astype(np.float32)
    none = np.zeros(6, dtype=bool)
    starts, ends, scores = qa.decode_spans(start, end, 100, 15, none)  # every span: 21
    assert len(scores) == 21 and np.all(np.diff(scores) <= 0)
    want = sorted(((float(start[s] * end[e]), s, e) for s in range(6) for e in range(s, 6)),
                  key=lambda x: -x[0])  # fmt: skip
    assert list(zip(starts.tolist(), ends.tolist(), strict=True)) == [(s, e) for _, s, e in want]
    for k in (1, 5, 20):  # fewer than all: the same first k
        s, e, _ = qa.decode_spans(start, end, k, 15, none)
        assert list(zip(s.tolist(), e.tolist(), strict=True)) == [(s, e) for _, s, e in want[:k]]


@pytest.mark.parametrize("top_k", [30, 1000])
def test_equal_scores_keep_the_earliest_span_first(top_k: int) -> None:
    """Ties are broken as the pipeline's argmax breaks them: by start, then end."""
    ones = np.ones(12, dtype=np.float32)
    starts, ends, _ = qa.decode_spans(ones, ones, top_k, 15, np.zeros(12, dtype=bool))
    spans = [(s, e) for s in range(12) for e in range(s, 12)]
    assert list(zip(starts.tolist(), ends.tolist(), strict=True)) == spans[:top_k]


@pytest.mark.parametrize("top_k", [50, 200, 10_000])  # inside the best class, across, all
def test_many_equal_scores_among_others_keep_the_earliest_first(top_k: int) -> None:
    """Hundreds of spans in three score classes: an unstable sort (numpy's default introsort
    past 16 elements) would mix the spans within a class, and a plain argpartition would keep
    any of the spans tied with the k-th best, not the earliest."""
    probs = np.float32([0.5, 0.25, 0.25, 0.5] * 10)  # 40 tokens, 2 values: ties everywhere
    starts, ends, scores = qa.decode_spans(probs, probs, top_k, 15, np.zeros(40, dtype=bool))
    spans = [(s, e) for s in range(40) for e in range(s, min(s + 15, 40))]
    want = sorted(spans, key=lambda se: -float(probs[se[0]] * probs[se[1]]))  # stable
    assert list(zip(starts.tolist(), ends.tolist(), strict=True)) == want[:top_k]
    assert scores.tolist() == [float(probs[s] * probs[e]) for s, e in want[:top_k]]


def test_large_logits_give_finite_probabilities() -> None:
    logits = np.array([100.0, 90.0, 80.0, -5.0], dtype=np.float32)
    allowed = np.array([True, True, True, False])
    start, end = qa.span_probs(logits, logits[::-1].copy(), allowed)
    x = np.exp(np.float64([0.0, -10.0, -20.0]))
    np.testing.assert_allclose(start[:3], x / x.sum(), rtol=1e-6)
    assert start[3] == 0.0 and np.isfinite(end).all() and end.sum() == pytest.approx(1.0)


def test_postprocess_refuses_what_it_cannot_answer(toy_tokenizer: Tokenizer) -> None:
    prepared = qa.preprocess(toy_tokenizer, QUESTION, CONTEXT)
    with refused("max_answer_len must be at least 1, not 0"):
        qa.postprocess(prepared, [], max_answer_len=0)
    with pytest.raises(ValueError, match=r"^0 outputs for 1 windows$"):
        qa.postprocess(prepared, [])


@pytest.fixture(scope="module")
def squad() -> ModelPackage:
    return read_package(family_package("bert", "question-answering"))


def test_a_jobs_options_reach_its_answer(squad: ModelPackage) -> None:
    # every option given, so a changed default cannot pass for the option's effect
    given = {"top_k": 1, "max_answer_len": 15, "max_seq_len": 384, "doc_stride": None,
             "handle_impossible_answer": False}  # fmt: skip

    def job(pairs: list[tuple[str, str]], **changes: Any) -> qa.Job:
        return qa.Job(squad, pairs, qa.Options(**{**given, **changes}))

    pairs = [(QUESTION, CONTEXT), ("who", "anna flew to lisbon in may")]
    [best, other] = run_job(squad, job(pairs))
    assert isinstance(best, dict) and best["answer"] == CONTEXT[best["start"] : best["end"]]
    assert isinstance(other, dict)
    two = run_job(squad, job(pairs[:1], top_k=2))
    assert [len(a) for a in two] == [2] and two[0][0]["score"] >= two[0][1]["score"]
    # (the first of two need not be the best of one: with top_k 2 more spans per window are
    # looked at, and spans that widen to the same words add up, as in the pipeline)
    [plain] = run_job(squad, job(pairs[:1], top_k=500))
    [null] = run_job(squad, job(pairs[:1], top_k=500, handle_impossible_answer=True))
    assert "" not in [a["answer"] for a in plain] and "" in [a["answer"] for a in null]
    # max_answer_len 1: one-word answers only; a stride given is the stride used
    short = run_job(squad, job(pairs[:1], top_k=500, max_answer_len=1))[0]
    assert all(" " not in a["answer"] for a in short) and len(short) < len(plain)
    rows = {}
    for stride in (0, 6):
        windowed = job(pairs[:1], max_seq_len=16, doc_stride=stride)
        run_job(squad, windowed)
        rows[stride] = sum(len(c.windows) for c in windowed._contexts)
        assert windowed.stride == stride and windowed.windowed == 1
    assert rows[6] > rows[0] > 1  # windows that share 6 tokens: more of them


def test_with_no_options_the_windows_and_answers_are_the_pipelines(
    tok_repo: Tokenizer, hf_repo: Any, tiny_model: Any
) -> None:
    """Nothing given: windows of the pipeline's 384 tokens sharing 128, and its answer rules
    (one answer, 15 tokens at most, no null answer, widened to words)."""
    pytest.importorskip("transformers")
    from transformers import pipeline
    from transformers.pipelines.question_answering import QuestionAnsweringPipeline

    defaults = inspect.signature(QuestionAnsweringPipeline.postprocess).parameters
    for ours in (inspect.signature(qa.postprocess), inspect.signature(qa.Options)):
        for name in ("top_k", "max_answer_len", "handle_impossible_answer"):
            assert ours.parameters[name].default == defaults[name].default, name
    assert inspect.signature(qa.postprocess).parameters["align_to_words"].default is True

    model = tiny_model("BertForQuestionAnswering", len(hf_repo), seed=2)
    hf_512 = copy.deepcopy(hf_repo)
    hf_512.model_max_length = 512  # as BERT's own: the pipeline's 384 applies, not 128
    pipe = pipeline("question-answering", model=model, tokenizer=hf_512)
    pairs = repo_squad_pairs(40)
    context = " ".join(c for _, c in pairs)  # several 384-token windows
    for question, _ in pairs[:4]:
        prepared = qa.preprocess(tok_repo, question, context)
        hf = hf_windows(hf_repo, question, context, 384, 128)
        assert as_lists(prepared.sequences) == hf["input_ids"]
        assert prepared.windowed
        ours = qa.postprocess(prepared, [forward(model, s) for s in prepared.sequences])
        theirs = pipe(question=question, context=context)
        assert [(a["start"], a["end"]) for a in ours] == [(theirs["start"], theirs["end"])]
        assert ours[0]["score"] == pytest.approx(theirs["score"], abs=1e-4)


def test_a_job_with_no_options_answers_as_the_pipeline_with_none(squad: ModelPackage) -> None:
    """The Job's defaults, run: one answer (not a list), 15 tokens at most, no null answer,
    windows of the package's max_seq_length sharing half (the pipeline caps both by the
    tokenizer's model_max_length, the package's window)."""
    pytest.importorskip("transformers")
    from transformers import pipeline

    pipe = pipeline(
        "question-answering", model=str(family_checkpoint("bert", "question-answering"))
    )
    assert pipe.tokenizer.model_max_length == squad.max_seq_length
    found = repo_squad_pairs(30)
    contexts = [" ".join(c for _, c in found[k : k + 3]) for k in range(len(found))]
    pairs = [(q, c) for (q, _), c in zip(found, contexts, strict=True)]  # windows of 128
    job = qa.Job(squad, pairs)
    ours = run_job(squad, job)
    assert job.windowed >= 10  # most contexts are several windows long
    for (question, context), answer in zip(pairs, ours, strict=True):
        theirs = pipe(question=question, context=context)
        assert isinstance(answer, dict), answer
        assert (answer["start"], answer["end"]) == (theirs["start"], theirs["end"]), question
        assert answer["score"] == pytest.approx(theirs["score"], abs=1e-4)


@pytest.mark.parametrize("top_k", [1, 3])
def test_without_word_alignment_the_answers_are_the_pipelines(
    tok_repo: Tokenizer, hf_repo: Any, tiny_model: Any, top_k: int
) -> None:
    """align_to_words=False: token spans as they are, top_k per window (no margin), and the
    same text from two windows still adds up, as in the pipeline."""
    pytest.importorskip("transformers")
    from transformers import pipeline

    model = tiny_model("BertForQuestionAnswering", len(hf_repo), seed=2)
    pipe = pipeline("question-answering", model=model, tokenizer=hf_repo)
    compared = 0
    for question, context in repo_squad_pairs(40):
        prepared = qa.preprocess(tok_repo, question, context, max_seq_length=48, stride=24)
        outputs = [forward(model, s) for s in prepared.sequences]
        ours = qa.postprocess(prepared, outputs, top_k, align_to_words=False)
        theirs = pipe(question=question, context=context, top_k=top_k, align_to_words=False,
                      max_seq_len=48, doc_stride=24)  # fmt: skip
        theirs = theirs if isinstance(theirs, list) else [theirs]
        assert [(a["start"], a["end"]) for a in ours] == [(a["start"], a["end"]) for a in theirs]
        assert [a["score"] for a in ours] == pytest.approx([a["score"] for a in theirs], abs=1e-4)
        compared += prepared.windowed
    assert compared >= 20
