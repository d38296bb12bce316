"""The resume check, for real: `python -m service.batch` killed with SIGKILL half-way through
(no chance to clean up), then the same command again: it continues from the last part written,
and the folder is identical to an uninterrupted run's, every part and the errors file, bit for
bit (each engine call's rows are batched alone, so no answer depends on timing)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from service.batch.output import ERRORS, SUCCESS
from tests.conftest import REPO
from tests.service.batch.test_run import WORDS

pytestmark = pytest.mark.slow  # three runs of the command: ~30 s on 2 busy cores

ROWS, PART_ROWS = 6_000, 150  # 40 parts


def command(models: Path, source: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "service.batch", "embed", "--model-dir", str(models),
            "--input", str(source), "--output", str(out), "--part-rows", str(PART_ROWS),
            "--intra-op-threads", "1", "--quiet"]  # fmt: skip


def test_killed_at_half_then_resumed_equals_an_uninterrupted_run(
    tmp_path: Path, make_package: Callable[..., Path]
) -> None:
    models = tmp_path / "models"
    make_package(models, "embedding")
    source = tmp_path / "in.parquet"
    texts = [" ".join(WORDS[(i * 5 + k) % len(WORDS)] for k in range(i % 31)) for i in range(ROWS)]
    pq.write_table(pa.table({"text": [None if i % 401 == 7 else t for i, t in enumerate(texts)]}),
                   source, row_group_size=1_000)  # fmt: skip
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    subprocess.run(command(models, source, whole), cwd=REPO, check=True, timeout=300)

    run = subprocess.Popen(command(models, source, resumed), cwd=REPO)
    deadline = time.monotonic() + 300
    while len(list(resumed.glob("part-*.parquet"))) < 20 and time.monotonic() < deadline:
        assert run.poll() is None, "the run ended before it was half done"
        time.sleep(0.005)
    os.kill(run.pid, signal.SIGKILL)
    assert run.wait(30) == -signal.SIGKILL
    written = len(list(resumed.glob("part-*.parquet")))
    assert 20 <= written < 40 and not (resumed / SUCCESS).exists()

    again = subprocess.run(command(models, source, resumed), cwd=REPO, capture_output=True,
                           text=True, timeout=300)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert f"after {written} parts of an earlier run" in again.stderr
    assert sorted(p.name for p in resumed.iterdir()) == sorted(p.name for p in whole.iterdir())
    for part in sorted(whole.glob("part-*.parquet")):
        assert pq.read_table(part).equals(pq.read_table(resumed / part.name)), part.name
    assert (resumed / ERRORS).read_bytes() == (whole / ERRORS).read_bytes()  # each bad row once
    assert len((whole / ERRORS).read_text().splitlines()) == 15
