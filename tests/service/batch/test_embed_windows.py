"""`python -m service.batch embed --windows`: the flag comes from /embed's body field (checked
by that body, as the endpoint checks it), the run embeds a long text by windows as
heads.tasks.embed does (and so as /embed does, tests/service/test_embed_windows_http.py), and a
text that fits is answered as without the flag."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from heads.package import read_package
from heads.tasks import embed
from service.batch.__main__ import main, plan_and_settings
from tests.heads.tasks.served import run_job

LONG = "john lives in paris and mary works in rome " * 15  # 195 tokens: 4 windows of 64
TEXTS = ["the film was good", LONG, ""]
TOL = 1e-5


def test_the_flag_is_the_bodys_field(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["embed", "--input", "x.parquet", "--output", "out"]
    assert plan_and_settings([*base, "--windows"])[0].options["windows"] is True
    assert plan_and_settings([*base, "--no-windows"])[0].options["windows"] is False
    assert plan_and_settings(base)[0].options["windows"] is False  # the body's default
    with pytest.raises(SystemExit):
        plan_and_settings([*base, "--windows", "yes"])
    assert "unrecognized arguments: yes" in capsys.readouterr().err


def test_a_run_with_windows_answers_as_the_heads_job(
    tmp_path: Path, make_package: Callable[..., Path]
) -> None:
    models = tmp_path / "models"
    make_package(models, "embedding")
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": TEXTS}), source)

    def answers(out: str, *flags: str) -> np.ndarray:
        args = ["embed", "--model-dir", str(models), "--input", str(source),
                "--output", str(tmp_path / out), "--quiet", *flags]  # fmt: skip
        assert main(args) == 0
        return np.array(pq.read_table(tmp_path / out)["embedding"].to_pylist())

    by_windows = answers("windows", "--windows")
    package = read_package(models / "minilm")
    want = run_job(package, embed.Job(package, TEXTS, embed.Options(windows=True)))
    np.testing.assert_allclose(by_windows, want, atol=TOL)
    truncated = answers("plain")
    np.testing.assert_allclose(by_windows[[0, 2]], truncated[[0, 2]], atol=TOL)  # they fit
    assert float(by_windows[1] @ truncated[1]) < 1 - 1e-3
