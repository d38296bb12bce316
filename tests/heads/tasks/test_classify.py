"""heads.tasks.classify: rows like BertTokenizerFast's, answers like the text-classification
pipeline's."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer

from heads.rows import (
    InvalidInput,
    load_package_tokenizer,
    longest_first,
    prepare_tokenizer,
    template,
)
from heads.tasks import classify
from tests.conftest import EXAMPLES
from tests.heads.tasks.conftest import as_lists, forward, sst2_sentences
from tests.heads.tasks.served import run_rows

# --- preprocess -----------------------------------------------------------------------------


def test_rows_are_the_tokenizers_own_encoding(toy_tokenizer: Tokenizer) -> None:
    inputs: list[Any] = ["the cat sat", ("a dog ran", "new york city"), "", "   "]
    prepared = classify.preprocess(toy_tokenizer, inputs, max_seq_length=64)
    for x, seq in zip(inputs, prepared.sequences, strict=True):
        enc = toy_tokenizer.encode(*x) if isinstance(x, tuple) else toy_tokenizer.encode(x)
        assert seq.input_ids.tolist() == enc.ids
        assert seq.token_type_ids.tolist() == enc.type_ids
        assert seq.input_ids.dtype == seq.token_type_ids.dtype == np.int64
    assert prepared.truncated == 0
    # empty and whitespace-only texts are the empty sequence [CLS] [SEP]
    layout = template(toy_tokenizer).single
    assert as_lists(prepared.sequences[2:]) == [[*layout.prefix, *layout.suffix]] * 2


def test_truncation_is_counted_and_can_be_refused(toy_tokenizer: Tokenizer) -> None:
    long_text = " ".join(["the cat sat on the mat"] * 5)  # 30 tokens
    prepared = classify.preprocess(toy_tokenizer, ["a cat", long_text, (long_text, "a dog")], 16)
    assert [len(s) for s in prepared.sequences] == [4, 16, 16]
    assert prepared.truncated == 2
    with pytest.raises(
        InvalidInput, match=r"inputs\[1\] is 32 tokens long, more than max_seq_length 16"
    ):
        classify.preprocess(toy_tokenizer, ["a cat", long_text], 16, truncate=False)
    # an input that fits exactly is not truncated
    assert classify.preprocess(toy_tokenizer, [long_text], 32, truncate=False).truncated == 0


def test_bad_inputs_and_unsafe_tokenizers_are_refused(toy_tokenizer: Tokenizer) -> None:
    with pytest.raises(InvalidInput, match=r"inputs\[0\]"):
        classify.preprocess(toy_tokenizer, [("a", "b", "c")], 16)  # type: ignore[list-item]
    padded = Tokenizer.from_str(toy_tokenizer.to_str())
    padded.enable_padding(length=32)
    with pytest.raises(ValueError, match="prepare_tokenizer"):
        classify.preprocess(padded, ["a cat"], 16)
    assert len(classify.preprocess(prepare_tokenizer(padded), ["a cat"], 16).sequences[0]) == 4


@pytest.mark.parametrize("budget", [1, 2, 5, 6, 7, 10, 11])
def test_longest_first_keeps_the_budget_fairly(budget: int) -> None:
    for a in range(0, 14):
        for b in range(0, 14):
            ka, kb = longest_first(a, b, budget)
            assert ka <= a and kb <= b
            assert ka + kb == min(a + b, budget) or (a + b > budget and ka + kb == budget)
            if a + b > budget and min(a, b) <= budget // 2:
                assert min(ka, kb) == min(a, b)  # the shorter one is kept whole


@pytest.mark.shared
@pytest.mark.parametrize("max_length", [8, 13, 24, 64])
def test_pairs_truncate_like_transformers(
    tok_uncased: Tokenizer, hf_uncased: Any, shared_data: Path, max_length: int
) -> None:
    sentences = sst2_sentences(shared_data, 80)
    pairs = list(zip(sentences[:40], sentences[40:], strict=True)) + [
        (s, s[:20]) for s in sentences[:20]
    ]
    prepared = classify.preprocess(tok_uncased, pairs, max_length)
    for (a, b), seq in zip(pairs, prepared.sequences, strict=True):
        hf = hf_uncased(a, b, truncation=True, max_length=max_length)
        assert seq.input_ids.tolist() == hf["input_ids"]
        assert seq.token_type_ids.tolist() == hf["token_type_ids"]
    singles = classify.preprocess(tok_uncased, sentences, max_length)
    assert (
        as_lists(singles.sequences)
        == hf_uncased(sentences, truncation=True, max_length=max_length)["input_ids"]
    )


# --- postprocess ----------------------------------------------------------------------------


def test_scores_follow_the_problem_type() -> None:
    logits = np.array([[1.0, 3.0, 2.0], [0.0, 0.0, -1.0]], dtype=np.float32)
    labels = ["a", "b", "c"]
    best = classify.postprocess(logits, labels, "single_label")
    e = np.exp([1.0, 3.0, 2.0])
    assert best[0] == [{"label": "b", "score": pytest.approx(e[1] / e.sum())}]
    # ties keep label order, like the pipeline's stable sort
    assert [
        x["label"] for x in classify.postprocess(logits, labels, "single_label", top_k=None)[1]
    ] == ["a", "b", "c"]
    multi = classify.postprocess(logits, labels, "multi_label", top_k=None)[0]
    assert [x["score"] for x in multi] == pytest.approx(
        1 / (1 + np.exp(-np.array([3.0, 2.0, 1.0])))
    )
    raw = classify.postprocess(logits, labels, "regression", top_k=2)[0]
    assert raw == [{"label": "b", "score": 3.0}, {"label": "c", "score": 2.0}]
    # a lone output that is not a regression gets a sigmoid, not a constant softmax
    assert classify.postprocess(np.zeros((1, 1)), ["yes"], "single_label")[0][0]["score"] == 0.5
    assert classify.postprocess(logits, labels, "single_label", "none", None)[0][0]["score"] == 3.0


def test_sigmoid_is_stable_and_bad_requests_are_input_errors() -> None:
    logits = np.array([[-1000.0, 1000.0]], dtype=np.float32)
    scores = classify.postprocess(logits, ["a", "b"], "multi_label", top_k=None)[0]
    assert [s["score"] for s in scores] == [1.0, 0.0]
    # either sign, and the fractions between -1 and 1: the logistic function itself
    x = [-6.0, -2.5, -0.75, -0.25, 0.0, 0.25, 0.75, 2.5, 6.0]
    scores = classify.postprocess(np.array([x]), list("abcdefghi"), "multi_label", top_k=None)[0]
    assert [s["score"] for s in scores] == pytest.approx(
        [1 / (1 + math.exp(-v)) for v in reversed(x)], rel=1e-12
    )
    with pytest.raises(InvalidInput, match="function_to_apply"):
        classify.postprocess(logits, ["a", "b"], "single_label", "tanh")
    with pytest.raises(InvalidInput, match="top_k"):
        classify.postprocess(logits, ["a", "b"], "single_label", top_k=0)
    with pytest.raises(ValueError, match="labels"):
        classify.postprocess(logits, ["a"], "single_label")


def test_softmax_is_per_row_and_holds_for_large_logits() -> None:
    """Each row is normalised on its own: rows far apart in scale, or logits near float32's
    exp overflow, give the scores of the same logits shifted to zero."""
    base = np.array([2.0, 0.0, -1.0])
    want = np.exp(base) / np.exp(base).sum()  # e^x / sum e^x, with no overflow at this scale
    logits = np.stack([base, base + 800.0, base - 800.0]).astype(np.float32)
    answers = classify.postprocess(logits, ["a", "b", "c"], "single_label", top_k=None)
    for answer in answers:
        assert [x["label"] for x in answer] == ["a", "b", "c"]
        assert [x["score"] for x in answer] == pytest.approx(want, rel=1e-6)


def test_ties_keep_label_order_among_many_labels() -> None:
    """The pipeline sorts with Python's stable sort; numpy's default sort is not stable past
    16 elements, so the order among equal scores is checked on 40 labels."""
    labels = [f"l{j}" for j in range(40)]
    logits = np.zeros((1, 40), dtype=np.float32)
    logits[0, ::7] = 1.0
    answer = classify.postprocess(logits, labels, "single_label", top_k=None)[0]
    want = sorted(range(40), key=lambda j: -logits[0, j])  # Python's sort: stable
    assert [x["label"] for x in answer] == [labels[j] for j in want]


@pytest.mark.parametrize(
    ("problem_type", "num_labels", "function"),
    [
        ("single_label", 2, "softmax"),
        ("single_label", 1, "sigmoid"),  # a softmax over one logit is always 1
        ("multi_label", 3, "sigmoid"),
        ("multi_label", 1, "sigmoid"),
        ("regression", 1, "none"),
        ("regression", 3, "none"),
        # a transformers config's names
        ("single_label_classification", 3, "softmax"),
        ("single_label_classification", 1, "sigmoid"),
        ("multi_label_classification", 2, "sigmoid"),
    ],
)
def test_default_function_is_the_pipelines_rule(
    problem_type: str, num_labels: int, function: str
) -> None:
    """transformers' TextClassificationPipeline.postprocess: regression -> none; multi-label
    or a single output -> sigmoid; otherwise softmax."""
    assert classify.default_function(problem_type, num_labels) == function


def test_an_unknown_problem_type_is_named() -> None:
    with pytest.raises(ValueError, match=r"unknown problem_type 'ordinal'; expected one of \["):
        classify.default_function("ordinal", 3)


# --- parity with transformers' pipeline on real sentences ----------------------------------

CASES = [
    ("single_label", {"num_labels": 2}),
    ("single_label", {"num_labels": 3}),
    ("multi_label", {"num_labels": 3, "problem_type": "multi_label_classification"}),
    ("regression", {"num_labels": 1, "problem_type": "regression"}),
]


@pytest.mark.shared
@pytest.mark.parametrize(("problem_type", "config"), CASES)
def test_same_answers_as_the_pipeline(
    tok_uncased: Tokenizer,
    hf_uncased: Any,
    tiny_model: Any,
    shared_data: Path,
    problem_type: str,
    config: dict,
) -> None:
    from transformers import pipeline

    model = tiny_model(
        "BertForSequenceClassification", hf_uncased.vocab_size, seed=len(problem_type), **config
    )
    labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
    pipe = pipeline("text-classification", model=model, tokenizer=hf_uncased)
    sentences = sst2_sentences(shared_data, 60) + ["", "   ", "Café\u0301 😀 東京 \x07 naïve"]
    pairs = list(zip(sentences[:25], sentences[25:50], strict=True))
    max_len = 24  # short enough that most pairs and some sentences are truncated

    for inputs, hf_inputs in [
        (sentences, sentences),
        (pairs, [{"text": a, "text_pair": b} for a, b in pairs]),
    ]:
        prepared = classify.preprocess(tok_uncased, inputs, max_len)
        hf_ids = [
            hf_uncased(**x, truncation=True, max_length=max_len)["input_ids"]
            if isinstance(x, dict)
            else hf_uncased(x, truncation=True, max_length=max_len)["input_ids"]
            for x in hf_inputs
        ]
        assert as_lists(prepared.sequences) == hf_ids
        assert prepared.truncated > 0
        logits = np.stack([forward(model, s)["logits"] for s in prepared.sequences])
        for top_k in (None, 1):
            ours = classify.postprocess(logits, labels, problem_type, top_k=top_k)
            theirs = pipe(hf_inputs, top_k=top_k, truncation=True, max_length=max_len)
            for o, t in zip(ours, theirs, strict=True):
                assert [x["label"] for x in o] == [x["label"] for x in t]
                assert [x["score"] for x in o] == pytest.approx([x["score"] for x in t], abs=1e-4)
        # an explicit function overrides the default, as in the pipeline
        ours = classify.postprocess(logits, labels, problem_type, "sigmoid", None)
        theirs = pipe(
            hf_inputs, top_k=None, function_to_apply="sigmoid", truncation=True, max_length=max_len
        )
        assert [x["score"] for o in ours for x in o] == pytest.approx(
            [x["score"] for t in theirs for x in t], abs=1e-4
        )


def shipped_sentences() -> list[str]:
    """The dev sentences of examples/data/sentiment and examples/data/topics (30)."""
    with open(EXAMPLES / "sentiment" / "dev.tsv", encoding="utf-8") as f:
        texts = [r["sentence"] for r in csv.DictReader(f, delimiter="\t")]
    with open(EXAMPLES / "topics" / "dev.csv", encoding="utf-8") as f:
        return texts + [r["text"] for r in csv.DictReader(f)]


# (problem type, labels, a function that is not the default): every default function, and a
# lone output that is not a regression
PROBLEMS = [
    ("single_label", ["negative", "positive"], "none"),
    ("single_label", ["yes"], "none"),
    ("multi_label", ["sport", "cooking", "computing"], "softmax"),
    ("regression", ["score"], "sigmoid"),
]


def option_sets(other: str) -> list[dict[str, Any]]:
    """One Job's options each; jobs with the same options are not neighbours, so each must
    find its own rows among the others' (`answer_many` groups jobs by options)."""
    return [{}, {"top_k": None}, {"function_to_apply": other, "top_k": None}, {}, {"top_k": 2}]


@pytest.mark.parametrize(("problem_type", "labels", "other"), PROBLEMS)
def test_jobs_answered_together_answer_as_the_pipeline(
    tmp_path: Path, problem_type: str, labels: list[str], other: str
) -> None:
    """Jobs with different options, their rows run through the exported package in ONNX
    Runtime and answered together (`answer_many`, as the batcher does), each get the
    text-classification pipeline's answer for their own inputs, on the same checkpoint: the
    package's problem type picks the function, top_k is 1 unless asked, function_to_apply
    overrides. Runs on the repository's own text."""
    pytest.importorskip("torch")
    from transformers import pipeline

    from benchmarks.tiny import STANDIN_RANGE, build_tiny_package

    pkg = build_tiny_package(
        tmp_path / "package", "classification", labels=labels, problem_type=problem_type,
        checkpoint_dir=tmp_path / "checkpoint", initializer_range=STANDIN_RANGE,
    )  # fmt: skip
    pipe = pipeline("text-classification", model=str(tmp_path / "checkpoint"), device="cpu")
    texts = shipped_sentences()
    inputs: list[Any] = [*texts, *zip(texts[:5], texts[25:], strict=True)]
    options = option_sets(other)
    jobs = [
        classify.Job(pkg, inputs[i :: len(options)], classify.Options(**o))
        for i, o in enumerate(options)
    ]
    tokenizer = load_package_tokenizer(pkg.tokenizer_path)
    outputs = [
        run_rows(
            pkg, job.rows(tokenizer, tokenizer.encode_batch(job.texts, add_special_tokens=False))
        )
        for job in jobs
    ]
    answers = classify.Job.answer_many(jobs, outputs)
    for job, o, answer in zip(jobs, options, answers, strict=True):
        hf_inputs = [
            x if isinstance(x, str) else {"text": x[0], "text_pair": x[1]} for x in job.inputs
        ]
        theirs = pipe(
            hf_inputs, top_k=o.get("top_k", 1), function_to_apply=o.get("function_to_apply")
        )
        assert len(answer) == len(theirs) == len(job.inputs)
        for ours, want in zip(answer, theirs, strict=True):
            assert [x["label"] for x in ours] == [x["label"] for x in want]
            assert [x["score"] for x in ours] == pytest.approx([x["score"] for x in want], abs=1e-4)
    with pytest.raises(ValueError, match=f"do not match {len(labels)} labels"):
        classify.Job.answer_many(jobs[:1], [[{"logits": np.zeros(len(labels) + 1)}]])


def test_job_options_are_checked_when_it_is_made() -> None:
    """A bad option is refused before any compute (the route's 422)."""
    with pytest.raises(InvalidInput, match="top_k must be at least 1, not 0"):
        classify.Job(_toy_package(), ["a"], classify.Options(top_k=0))
    with pytest.raises(InvalidInput, match="function_to_apply must be one of"):
        classify.Job(_toy_package(), ["a"], classify.Options(function_to_apply="tanh"))


@pytest.mark.parametrize("direction", ["right", "left"])
@pytest.mark.parametrize("max_length", [5, 8, 13])
def test_truncation_direction_cuts_as_tokenizers_does(
    toy_tokenizer: Tokenizer, direction: str, max_length: int
) -> None:
    """`direction` "left" keeps each text's last tokens, as the `tokenizers` truncation with
    direction="left" (TEI's truncation_direction) does, for single texts and longest_first
    pairs alike."""
    texts = ["the film was great and the music was good", "a dull one", "so so so so so so so"]
    pairs = [(texts[0], texts[2]), (texts[1], texts[0]), (texts[2], texts[2])]
    reference = Tokenizer.from_str(toy_tokenizer.to_str())
    reference.enable_truncation(max_length, strategy="longest_first", direction=direction)
    job = classify.Job(
        _toy_package(), [*texts, *pairs], classify.Options(truncation_direction=direction)
    )
    job.max_seq_length = max_length
    flat = [t for x in [*texts, *pairs] for t in ((x,) if isinstance(x, str) else x)]
    rows = job.rows(toy_tokenizer, toy_tokenizer.encode_batch(flat, add_special_tokens=False))
    want = [reference.encode(t).ids for t in texts] + [reference.encode(a, b).ids for a, b in pairs]
    assert [r.input_ids.tolist() for r in rows] == want
    assert job.truncated == sum(
        len(toy_tokenizer.encode(*((x,) if isinstance(x, str) else x)).ids) > max_length
        for x in [*texts, *pairs]
    )


def _toy_package() -> Any:
    """The fields classify.Job reads from a package."""
    from types import SimpleNamespace

    return SimpleNamespace(labels=["a", "b"], problem_type="single_label", max_seq_length=512)
