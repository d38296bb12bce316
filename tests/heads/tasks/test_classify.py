"""heads.tasks.classify: rows like BertTokenizerFast's, answers like the text-classification
pipeline's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer

from heads.rows import InvalidInput, longest_first, prepare_tokenizer, template
from heads.tasks import classify
from tests.heads.tasks.conftest import as_lists, forward, sst2_sentences

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
    with pytest.raises(InvalidInput, match="function_to_apply"):
        classify.postprocess(logits, ["a", "b"], "single_label", "tanh")
    with pytest.raises(InvalidInput, match="top_k"):
        classify.postprocess(logits, ["a", "b"], "single_label", top_k=0)
    with pytest.raises(ValueError, match="labels"):
        classify.postprocess(logits, ["a"], "single_label")


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
    job = classify.Job(_toy_package(), [*texts, *pairs], truncation_direction=direction)
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
