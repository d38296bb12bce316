"""One tiny package per task a client library calls: what the client-compatibility tests
(tests/clients/) and the HTTP shape tests (tests/service/test_client_shapes.py) serve.

Each is a `tests.families` BERT exported by the real training.export: a sentiment classifier,
an NER and a QA model, a dense embedding model, a fill-mask model, a reranker (one relevance
label, reads pairs) and an NLI model (reads pairs, entailment label). With several
classification models loaded, `DEFAULTS` says which answers a request that names none."""

from __future__ import annotations

from pathlib import Path

from tests.families import family_checkpoint, family_package
from training.export import export_package

WINDOW = 48  # tokens per row: long texts are windowed
# --default-model: /classify has three classification models to choose from
DEFAULTS = {"classification": "sentiment"}


def build_model_dir(root: Path) -> Path:
    """root/<name>/ for each package; root returned."""
    root.mkdir(parents=True, exist_ok=True)
    for name, task in (
        ("ner", "token-classification"),
        ("qa", "question-answering"),
        ("embedder", "embedding"),
        ("filler", "fill-mask"),
    ):
        (root / name).symlink_to(family_package("bert", task))
    for name, labels, reads in (
        ("sentiment", ["negative", "positive"], None),
        ("reranker", ["score"], "pairs"),
        ("nli", ["entailment", "neutral", "contradiction"], "pairs"),
    ):
        checkpoint = family_checkpoint("bert", "classification", labels=labels, seed=1)
        export_package(checkpoint, "classification", root / name, max_seq_length=WINDOW,
                       verbose=False, reads=reads)  # fmt: skip
    return root
