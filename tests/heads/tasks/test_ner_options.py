"""heads.tasks.ner's Job with its options, run as the batcher runs it on tiny exported
token-classification models (tests/families.py), against transformers' token-classification
pipeline on the same folders: a byte-level BPE family, whose subwords are read from the text;
ignore_labels; a stride given by the request."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer

from heads.package import read_package
from heads.rows import load_package_tokenizer, windows
from heads.tasks import ner
from tests.families import family_checkpoint, family_package
from tests.heads.tasks.served import run_job

transformers = pytest.importorskip("transformers")

TEXTS = [
    "Jonathan Whitfield flew from Amsterdam to Sacramento with Unilever colleagues.",
    "The Fédération Internationale met in Zürich;  Anneliese spoke twice.",
    "nothing here",
]


def pipe(family: str, strategy: str) -> Any:
    return transformers.pipeline(
        "token-classification",
        model=str(family_checkpoint(family, "token-classification")),
        aggregation_strategy=strategy,
    )


def assert_same(text: str, ours: list[dict], theirs: list[dict]) -> None:
    keys = ("entity_group", "start", "end")
    assert [[e[k] for k in keys] for e in ours] == [[e[k] for k in keys] for e in theirs], text
    assert [e["score"] for e in ours] == pytest.approx(
        [float(e["score"]) for e in theirs], abs=1e-4
    )
    # ours is text[start:end] by design; the pipeline decodes tokens (" world" for byte-level BPE)
    assert all(e["word"] == text[e["start"] : e["end"]] for e in ours)


@pytest.mark.parametrize("strategy", ["first", "max", "average"])
def test_a_byte_level_bpe_familys_words_are_the_pipelines(strategy: str) -> None:
    """RoBERTa's BPE has no `##`: a word's later tokens are found from the spaces in the text,
    and a word's label comes from its tokens as the strategy says."""
    pkg = read_package(family_package("roberta", "token-classification"))
    ours = run_job(pkg, ner.Job(pkg, TEXTS, ner.Options(aggregation_strategy=strategy)))
    reference = pipe("roberta", strategy)
    for text, answer in zip(TEXTS, ours, strict=True):
        assert_same(text, answer, reference(text))
    # words of several tokens, which only the subword flags join
    tokenizer = load_package_tokenizer(pkg.tokenizer_path)
    assert any(
        len(tokenizer.encode(e["word"], add_special_tokens=False).ids) > 1 for a in ours for e in a
    )


def test_ignore_labels_reach_the_answer() -> None:
    pkg = read_package(family_package("bert", "token-classification"))
    kept = run_job(
        pkg, ner.Job(pkg, TEXTS, ner.Options(aggregation_strategy="simple", ignore_labels=[]))
    )
    reference = pipe("bert", "simple")
    for text, answer in zip(TEXTS, kept, strict=True):
        assert_same(text, answer, reference(text, ignore_labels=[]))
    assert any(e["entity_group"] == "O" for a in kept for e in a)  # "O" is no longer left out
    default = run_job(pkg, ner.Job(pkg, TEXTS, ner.Options(aggregation_strategy="simple")))
    assert all(e["entity_group"] != "O" for a in default for e in a)


@pytest.mark.parametrize("stride", [None, 0, 5])
def test_the_requests_stride_cuts_the_windows(stride: int | None) -> None:
    pkg = read_package(family_package("bert", "token-classification"))
    tokenizer = load_package_tokenizer(pkg.tokenizer_path)
    text = " ".join(TEXTS) * 8  # several windows of the package's max_seq_length
    job = ner.Job(pkg, [text], ner.Options(stride=stride))
    rows = job.rows(tokenizer, tokenizer.encode_batch([text], add_special_tokens=False))
    n = len(tokenizer.encode(text, add_special_tokens=False).ids)
    used = ner.default_stride(pkg.max_seq_length) if stride is None else stride
    assert len(rows) == len(windows(n, pkg.max_seq_length - 2, used)) > 1
    assert job.windowed == 1


@pytest.mark.parametrize("stride", range(14))  # every stride a room of 14 allows
def test_each_token_is_read_from_the_window_with_the_most_context_around_it(
    toy_tokenizer: Tokenizer, stride: int
) -> None:
    """Counted here by brute force: a token's context in a window is its distance to the
    nearer cut (a text edge is no cut), and the earlier window wins a tie."""
    text = " ".join(["the cats sat in new york city"] * 6)  # 48 tokens
    prepared = ner.preprocess(toy_tokenizer, text, max_seq_length=16, stride=stride)
    n = len(prepared.tokens)
    # window k's logits say k: its label probabilities tell which window a token was read from
    outputs = [
        {"logits": np.tile(np.float32([k, 0.0]), (len(w.sequence), 1))}
        for k, w in enumerate(prepared.windows)
    ]
    probs = ner.token_scores(prepared, outputs)
    chosen = np.log(probs[:, 0] / probs[:, 1]).round().astype(int).tolist()
    inf = float("inf")
    want = []
    for p in range(n):
        context = [
            (min(inf if w.start == 0 else p - w.start, inf if w.stop == n else w.stop - 1 - p), -k)
            for k, w in enumerate(prepared.windows)
            if w.start <= p < w.stop
        ]
        want.append(-max(context)[1])
    assert chosen == want
    assert len(set(chosen)) == len(prepared.windows)  # every window gives some tokens


def test_outputs_that_do_not_fit_the_windows_or_labels_are_named(toy_tokenizer: Tokenizer) -> None:
    prepared = ner.preprocess(toy_tokenizer, "the cat sat", max_seq_length=16, stride=0)
    row = {"logits": np.zeros((len(prepared.windows[0].sequence), 3), np.float32)}
    with pytest.raises(ValueError, match=r"^2 outputs for 1 windows$"):
        ner.postprocess(prepared, [row, row], ["O", "B-PER", "I-PER"])
    with pytest.raises(ValueError, match=r"^logits have 3 classes for 2 labels$"):
        ner.postprocess(prepared, [row], ["O", "B-PER"])
