"""demo.checks scores each kind of head a demo build makes. Here on tiny random packages of
the two pair heads (a reranker, an NLI model), so that the scoring path itself runs in the
unit suite; the real builds' floors are tests/demo/test_models.py's (CI's e2e stage)."""

from __future__ import annotations

import pytest

from demo.checks import RERANK, ZERO_SHOT, score_package
from tests.families import family_checkpoint

pytest.importorskip("transformers")
from training.export import export_package  # noqa: E402 (needs torch)


@pytest.mark.parametrize(
    ("labels", "items"),
    [(["irrelevant", "relevant"], len(RERANK)), (["entailment", "neutral", "contradiction"],
                                                 len(ZERO_SHOT))],
    ids=["reranker", "nli"],
)  # fmt: skip
def test_a_pair_head_is_scored_on_its_items(tmp_path, labels: list[str], items: int) -> None:
    folder = family_checkpoint("bert", "classification", labels=labels)
    exported = export_package(folder, "classification", tmp_path / "p", max_seq_length=64,
                              verbose=False, reads="pairs")  # fmt: skip
    scores = score_package(exported.path)
    assert list(scores) == ["accuracy"]
    right = scores["accuracy"] * items / 100  # a whole number of items
    assert 0 <= right <= items and abs(right - round(right)) < 1e-9
