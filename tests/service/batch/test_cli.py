"""`python -m service.batch`: --help names every task and each endpoint's options, one line
each; a flag's value is read as its body field's type and checked by that body, with the
endpoint's message; the command's errors are one line, exit 2; only the Ray stage imports Ray,
the command imports neither Ray nor torch, and its Arrow allocates from the system allocator."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from service.batch.__main__ import build_parser, main, plan_and_settings
from service.batch.flags import parse_flag
from service.batch.tasks import TASKS
from service.schemas import ClassifyRequest, EmbedRequest, NerRequest, ZeroShotRequest
from tests.conftest import REPO


def test_help_names_every_task_and_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["--help"])
    assert done.value.code == 0
    shown = capsys.readouterr().out
    for task in TASKS.values():
        assert task.name in shown and f"as POST {task.endpoint}" in shown
    assert "examples" in shown and "python -m service.batch embed --model minilm-embedding" in shown


@pytest.mark.parametrize("task", list(TASKS))
def test_each_task_help_lists_its_endpoint_options(task: str, capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        build_parser().parse_args([task, "--help"])
    shown = capsys.readouterr().out
    for name in TASKS[task].option_fields():
        assert "--" + name.replace("_", "-") in shown
    for flag in ("--input", "--output", "--part-rows", "--model-dir", "--ray", "--device"):
        assert flag in shown
    helps = [line for line in shown.splitlines() if line.startswith("  --")]
    assert all(len(line) <= 110 for line in helps)


def test_flag_values_are_read_as_the_field_type() -> None:
    fields = {**ClassifyRequest.model_fields, **EmbedRequest.model_fields}
    assert parse_flag(fields["top_k"].annotation, "3") == 3
    assert parse_flag(fields["top_k"].annotation, "null") is None
    assert parse_flag(fields["layers"].annotation, "-1,-2") == [-1, -2]
    assert parse_flag(fields["layers"].annotation, "-1") == [-1]
    assert parse_flag(NerRequest.model_fields["ignore_labels"].annotation, "O") == ["O"]
    labels = ZeroShotRequest.model_fields["candidate_labels"].annotation
    assert parse_flag(labels, "sports, politics") == ["sports", "politics"]
    assert parse_flag(labels, "7") == "7"  # a label, not a number


def test_options_are_checked_by_the_endpoint_body(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--input", "x.parquet", "--output", "out"]
    with pytest.raises(SystemExit) as done:
        plan_and_settings(["classify", *base, "--top-k", "0"])
    assert done.value.code == 2
    assert "--top-k: Input should be greater than or equal to 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        plan_and_settings(["ner", *base, "--aggregation-strategy", "best"])
    assert "--aggregation-strategy" in capsys.readouterr().err
    plan, settings, _ = plan_and_settings(
        ["zero-shot", *base, "--candidate-labels", "a, b", "--intra-op-threads", "1"]
    )
    assert plan.options["candidate_labels"] == ["a", "b"]  # split as /zero-shot splits it
    assert plan.options["hypothesis_template"] == "This example is {}."  # the body's default
    assert settings.intra_op_threads == 1


def test_errors_are_one_line_and_exit_2(
    tmp_path: Path, make_package: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    make_package(tmp_path / "models", "embedding")
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"sentence": ["a", "b"]}), source)
    args = ["embed", "--model-dir", str(tmp_path / "models"), "--input", str(source),
            "--output", str(tmp_path / "out"), "--quiet"]  # fmt: skip
    assert main(args) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: ") and "no column ['text']" in error and "\n" not in error
    assert main([*args, "--text-column", "sentence"]) == 0
    assert "wrote 2 rows in 1 parts" in capsys.readouterr().err
    assert main([*args, "--text-column", "sentence", "--dimensions", "3"]) == 2
    assert "holds the output of another run (options differ)" in capsys.readouterr().err


def test_only_the_ray_stage_imports_ray() -> None:
    importers = []
    for folder in ("heads", "service", "training", "demo"):
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = (
                    [a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                )  # fmt: skip
                if any(n == "ray" or n.startswith("ray.") for n in names):
                    importers.append(path.relative_to(REPO).as_posix())
    assert sorted(set(importers)) == ["service/batch/ray_stage.py"]


def test_the_command_imports_neither_ray_nor_torch() -> None:
    code = "import sys, service.batch.__main__; print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    loaded = set(done.stdout.split())
    assert not loaded & {"ray", "torch", "training", "fastapi"}, loaded & {
        "ray",
        "torch",
        "training",
        "fastapi",
    }


def test_the_command_s_arrow_allocates_from_the_system_allocator() -> None:
    """Arrow picks the pool of its C++ code (the Parquet reader's and writer's buffers) once,
    on its import: service.batch sets it first, as `python -m service.batch` imports it."""
    code = (
        "import service.batch.__main__, pyarrow as pa; print(pa.default_memory_pool().backend_name)"
    )
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "system"
