"""POST /zero-shot over HTTP against transformers' zero-shot-classification pipeline on the same
tiny NLI folders (BERT with entailment first, RoBERTa with MNLI's contradiction-first order):
label order and scores, single- and multi-label, one label, other templates, texts longer than
the window; and the bad input."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from service.settings import Settings
from tests.families import family_checkpoint
from tests.service.conftest import Service, serve
from training.export import export_package

pytestmark = pytest.mark.anyio
transformers = pytest.importorskip("transformers")
from tests.heads.tasks.test_zero_shot import LABELS, TEXTS, WINDOW  # noqa: E402
from tests.heads.tasks.test_zero_shot import NLI as FOLDERS  # noqa: E402

NLI = {f"nli-{name}": spec for name, spec in FOLDERS.items()}  # the served names


def folder(name: str) -> Any:
    family, labels = NLI[name]
    return family_checkpoint(family, "classification", labels=labels, seed=1)


@pytest.fixture(scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Service]:
    root = tmp_path_factory.mktemp("zero-shot")
    for name in NLI:
        export_package(folder(name), "classification", root / name, max_seq_length=WINDOW,
                       verbose=False)  # fmt: skip
    plain = family_checkpoint("bert", "classification", labels=["negative", "positive"])
    export_package(plain, "classification", root / "sentiment", verbose=False)
    async with serve(Settings(model_dir=root, intra_op_threads=1)) as s:
        yield s


def pipeline(name: str) -> Any:
    tok = transformers.AutoTokenizer.from_pretrained(folder(name), model_max_length=WINDOW)
    return transformers.pipeline("zero-shot-classification", model=str(folder(name)), tokenizer=tok)


async def post(served: Service, body: dict[str, Any], status: int = 200) -> Any:
    response = await served.client.post("/zero-shot", json=body)
    assert response.status_code == status, response.text
    return response.json()


def assert_same(ours: dict, theirs: dict) -> None:
    assert ours["sequence"] == theirs["sequence"]
    assert ours["labels"] == theirs["labels"]
    assert max(abs(a - b) for a, b in zip(ours["scores"], theirs["scores"], strict=True)) <= 1e-5


@pytest.mark.parametrize("multi_label", [False, True])
@pytest.mark.parametrize("name", list(NLI))
async def test_answers_equal_the_pipeline(served: Service, name: str, multi_label: bool):
    body = {"inputs": TEXTS, "candidate_labels": LABELS, "multi_label": multi_label, "model": name}
    ours = await post(served, body)
    theirs = pipeline(name)(TEXTS, candidate_labels=LABELS, multi_label=multi_label)
    assert len(ours) == len(theirs) == len(TEXTS)
    for a, b in zip(ours, theirs, strict=True):
        assert_same(a, b)


@pytest.mark.parametrize(
    "options",
    [
        {"candidate_labels": ["sports"]},  # one label: scored on its own
        {"candidate_labels": "sports, politics ,money"},  # the comma-separated form
        {"candidate_labels": LABELS, "hypothesis_template": "Das Thema ist {}."},
    ],
)
async def test_options_equal_the_pipeline(served: Service, options: dict):
    ours = await post(served, {"inputs": TEXTS[0], "model": "nli-bert", **options})
    kwargs = {k: v for k, v in options.items()}
    theirs = pipeline("nli-bert")(TEXTS[0], **kwargs)
    assert_same(ours, theirs)  # one string: one object, as the pipeline answers


@pytest.mark.parametrize(
    "body, word",
    [
        ({"inputs": "a", "candidate_labels": ["x"], "model": "sentiment"}, "no entailment label"),
        ({"inputs": "a", "candidate_labels": [], "model": "nli-bert"}, "candidate_labels"),
        ({"inputs": "a", "candidate_labels": " , ", "model": "nli-bert"}, "candidate_labels"),
        (
            {
                "inputs": "a",
                "candidate_labels": ["x"],
                "hypothesis_template": "no slot",
                "model": "nli-bert",
            },  # fmt: skip
            "has no {}",
        ),
        (
            {
                "inputs": "a",
                "candidate_labels": ["x"],
                "hypothesis_template": "{0} {1}",
                "model": "nli-bert",
            },  # fmt: skip
            "cannot be formatted",
        ),
        ({"inputs": "a", "candidate_labels": ["word " * 60], "model": "nli-bert"}, "hypothesis"),
        ({"inputs": [], "candidate_labels": ["x"], "model": "nli-bert"}, "inputs"),
    ],
)
async def test_bad_input_is_a_clear_422(served: Service, body: dict, word: str):
    error = await post(served, body, status=422)
    assert word in error["error"], error
