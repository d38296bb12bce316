"""heads.tasks.embed: rows like the classifier's (one truncation rule), vectors normalised
safely and only when asked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer

from heads.rows import InvalidInput
from heads.tasks import classify, embed
from tests.heads.tasks.conftest import as_lists, sst2_sentences


def test_rows_and_truncation_are_the_classifiers(toy_tokenizer: Tokenizer) -> None:
    texts = ["the cat sat", "", " ".join(["the dog ran"] * 10), "東京 😀 e\u0301"]
    ours = embed.preprocess(toy_tokenizer, texts, 16)
    assert as_lists(ours.sequences) == as_lists(
        classify.preprocess(toy_tokenizer, texts, 16).sequences
    )
    assert ours.truncated == 1
    assert as_lists(ours.sequences[:2]) == [toy_tokenizer.encode(t).ids for t in texts[:2]]
    with pytest.raises(
        InvalidInput, match=r"inputs\[2\] is 32 tokens long, more than max_seq_length 16"
    ):
        embed.preprocess(toy_tokenizer, texts, 16, truncate=False)
    with pytest.raises(InvalidInput, match=r"inputs\[0\]: expected a string"):
        embed.preprocess(toy_tokenizer, [("a", "b")], 16)  # type: ignore[list-item]


@pytest.mark.shared
def test_rows_match_transformers(
    tok_uncased: Tokenizer, hf_uncased: Any, shared_data: Path
) -> None:
    texts = sst2_sentences(shared_data, 60)
    prepared = embed.preprocess(tok_uncased, texts, 20)
    assert (
        as_lists(prepared.sequences)
        == hf_uncased(texts, truncation=True, max_length=20)["input_ids"]
    )
    assert prepared.truncated == sum(len(hf_uncased(t)["input_ids"]) > 20 for t in texts) > 0


def test_normalize_gives_unit_vectors_and_keeps_zeros() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(0, 3, (5, 8)).astype(np.float32)
    x[2] = 0.0
    out = embed.postprocess(x, normalize=True)
    assert out.dtype == np.float32 and out.shape == (5, 8)
    norms = np.linalg.norm(out, axis=-1)
    assert norms[[0, 1, 3, 4]] == pytest.approx(1.0, abs=1e-6)
    assert norms[2] == 0.0 and np.isfinite(out).all()
    # direction kept: each row is a positive multiple of its input
    assert np.allclose(out[0] * np.linalg.norm(x[0]), x[0], atol=1e-5)
    assert np.array_equal(embed.postprocess(x, normalize=False), x)


def test_half_precision_inputs_do_not_overflow() -> None:
    x = np.full((1, 1024), 60000.0, dtype=np.float16)  # squares overflow float16
    out = embed.postprocess(x, normalize=True)
    assert out.dtype == np.float32
    assert np.linalg.norm(out) == pytest.approx(1.0, abs=1e-5)


def test_matches_torch_normalize() -> None:
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(1).normal(0, 1, (4, 384)).astype(np.float32)
    expected = torch.nn.functional.normalize(torch.from_numpy(x), dim=-1).numpy()
    assert np.allclose(embed.postprocess(x, normalize=True), expected, atol=1e-6)


def test_dimensions_keep_the_first_values_then_normalise() -> None:
    """Matryoshka `dimensions`: the first D values of each vector, unit length again when the
    vectors are normalised, unchanged otherwise; past the model's size or below 1 refused."""
    from types import SimpleNamespace

    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(3, 8)).astype(np.float32)
    package = SimpleNamespace(
        max_seq_length=16,
        normalize=True,
        sparse=False,
        outputs=[{"name": "embeddings", "shape": ["batch", 8]}],
        pooling="mean",
        prompts={},
        default_prompt_name=None,
    )
    outputs = [{"embeddings": v} for v in vectors]
    job = embed.Job(package, ["a", "b", "c"], embed.Options(dimensions=3))  # type: ignore[arg-type]
    cut = job.answer(outputs)
    want = vectors[:, :3] / np.linalg.norm(vectors[:, :3], axis=1, keepdims=True)
    np.testing.assert_allclose(cut, want, rtol=1e-6)
    raw = embed.Job(package, ["a"] * 3, embed.Options(dimensions=3, normalize=False))  # type: ignore[arg-type]
    np.testing.assert_array_equal(raw.answer(outputs), vectors[:, :3])
    together = embed.Job.answer_many([job, raw], [outputs, outputs])
    np.testing.assert_allclose(together[0], want, rtol=1e-6)
    for bad in (0, 9):
        with pytest.raises(InvalidInput, match="dimensions must be between 1 and 8"):
            embed.Job(package, ["a"], embed.Options(dimensions=bad))  # type: ignore[arg-type]
