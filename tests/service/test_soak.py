"""A short soak (slow: `pytest -m slow tests/service/test_soak.py`): benchmarks/soak.py on the
tiny packages, 3,000 mixed requests over every endpoint against `python -m service`. The full
run (10,000 requests and more) is `python -m benchmarks.soak --tiny`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import soak


@pytest.mark.slow
def test_a_short_soak_grows_nothing(tmp_path: Path) -> None:
    code = soak.main(
        [
            "--tiny",
            "--requests",
            "3000",
            "--slice",
            "500",
            "--concurrency",
            "8",
            "--out",
            str(tmp_path),
        ]
    )
    report = json.loads((tmp_path / "soak.json").read_text())
    assert code == 0, report["verdict"]
    assert sum(s["requests"] for s in report["slices"]) == 3000
