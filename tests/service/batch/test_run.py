"""A batch run on real tiny packages: bad rows go to the errors file with their row numbers and
cost only themselves; memory holds two parts whatever the input's size; a run continues from
its last part written and writes nothing twice; options no row can satisfy stop the run at
start; an output folder of another run is never mixed with this one."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from service.batch.output import SUCCESS, OutputError, part_name
from service.batch.run import Plan, RunError, run
from service.batch.tasks import TASKS
from service.settings import Settings

pytestmark = pytest.mark.anyio
WORDS = [
    "the",
    "film",
    "was",
    "good",
    "john",
    "lives",
    "in",
    "paris",
    "and",
    "mary",
    "in",
    "rome",
    "terrible",
    "wonderful",
]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, make_package: Callable[..., Path]) -> Path:
    root = tmp_path_factory.mktemp("batch-run") / "models"
    root.mkdir()
    for task in ("embedding", "question-answering"):
        make_package(root, task)
    return root


def sentences(n: int) -> list[str]:
    return [" ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(i % 23)) for i in range(n)]


def plan(source: Path, out: Path, task: str = "embed", part_rows: int = 100, **kw) -> Plan:
    spec = TASKS[task]
    columns = kw.pop("columns", {"text": "text"})
    return Plan(spec, spec.options(kw.pop("options", {})), source, out, columns,
                part_rows=part_rows, progress=False, **kw)  # fmt: skip


def settings(models: Path, **kw) -> Settings:
    return Settings(model_dir=models, intra_op_threads=1, **kw)


async def test_bad_rows_go_to_the_errors_file_with_their_row(models: Path, tmp_path: Path):
    source = tmp_path / "in.jsonl"
    lines = [json.dumps({"text": t}) for t in sentences(12)]
    lines[2] = json.dumps({"text": None})
    lines[4] = json.dumps({"text": 7})
    lines[5] = "{not json"
    lines[7] = '{"text": "lone \\ud800 surrogate"}'
    lines[9] = json.dumps({"text": "long " * 50})  # over max_text_chars (200): the server's 413
    lines[11] = json.dumps({"words": "no text field"})
    source.write_text("\n".join(lines) + "\n")
    summary = await run(
        plan(source, tmp_path / "out", part_rows=5), settings(models, max_text_chars=200)
    )
    errors = [json.loads(x) for x in (tmp_path / "out" / "_errors.jsonl").read_text().splitlines()]
    assert [(e["row"], e["error_type"]) for e in errors] == [
        (2, "validation"), (4, "validation"), (5, "read"), (7, "validation"),
        (9, "payload_too_large"), (11, "read"),
    ]  # fmt: skip
    assert errors[0]["error"] == "text is null"
    assert "lone UTF-16 surrogate" in errors[3]["error"]  # the endpoint's own message
    assert "max_text_chars" in errors[4]["error"]
    assert summary.bad == 6 and summary.rows == 12
    table = pq.read_table(tmp_path / "out")
    missing = [i for i, v in enumerate(table["embedding"].to_pylist()) if v is None]
    assert missing == [2, 4, 5, 7, 9, 11]  # the others answered


async def test_qa_rows_the_task_refuses_are_bad_rows(models: Path, tmp_path: Path) -> None:
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"q": ["who ?", " ", "where ?"], "c": ["john", "paris", ""]}), source)
    p = plan(source, tmp_path / "out", "qa", columns={"question": "q", "context": "c"})
    summary = await run(p, settings(models))
    errors = [json.loads(x) for x in (tmp_path / "out" / "_errors.jsonl").read_text().splitlines()]
    assert [(e["row"], e["error_type"]) for e in errors] == [(1, "validation"), (2, "validation")]
    assert summary.bad == 2
    assert pq.read_table(tmp_path / "out")["answer"].to_pylist()[0]["answer"] == "john"


async def test_memory_holds_two_parts_whatever_the_input(models: Path, tmp_path: Path) -> None:
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": sentences(1_500)}), source, row_group_size=400)
    summary = await run(plan(source, tmp_path / "out", part_rows=100), settings(models))
    parts = sorted((tmp_path / "out").glob("part-*.parquet"))
    assert len(parts) == summary.parts == 15
    assert all(pq.read_metadata(p).num_rows == 100 for p in parts)
    assert summary.peak_parts == 2  # read one while one is answered: never the whole input
    assert pq.read_table(tmp_path / "out")["row"].to_pylist() == list(range(1_500))


async def test_a_stopped_run_continues_and_writes_nothing_twice(models: Path, tmp_path: Path):
    source = tmp_path / "in.jsonl"
    texts = sentences(700)
    lines = [json.dumps({"text": None if i % 97 == 5 else t}) for i, t in enumerate(texts)]
    source.write_text("\n".join(lines) + "\n")
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    await run(plan(source, whole), settings(models))
    await run(plan(source, stopped), settings(models))
    # as a run stopped while part 3 was being written: parts 0-2, and part 3's errors appended
    for i in range(3, 7):
        (stopped / part_name(i)).unlink()
    (stopped / SUCCESS).unlink()
    (stopped / ".part-00003.parquet").write_bytes(b"half a file")
    summary = await run(plan(source, stopped), settings(models))
    assert summary.skipped_parts == 3 and summary.parts == 4
    assert pq.read_table(stopped).equals(pq.read_table(whole))
    assert (stopped / "_errors.jsonl").read_text() == (whole / "_errors.jsonl").read_text()
    again = await run(plan(source, stopped), settings(models))
    assert again.already_complete and again.rows == 0


async def test_an_output_of_another_run_is_refused(models: Path, tmp_path: Path) -> None:
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": sentences(10)}), source)
    await run(plan(source, tmp_path / "out"), settings(models))
    other = plan(source, tmp_path / "out", options={"normalize": False})
    with pytest.raises(OutputError, match="options"):
        await run(other, settings(models))
    summary = await run(
        plan(source, tmp_path / "out", options={"normalize": False}, overwrite=True),
        settings(models),
    )
    assert summary.rows == 10


async def test_options_the_model_cannot_take_stop_the_run(models: Path, tmp_path: Path) -> None:
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": sentences(10)}), source)
    with pytest.raises(RunError, match="dimensions must be between 1 and 32"):
        await run(plan(source, tmp_path / "out", options={"dimensions": 33}), settings(models))
    with pytest.raises(RunError, match="/classify .*no classification model"):  # none loaded
        await run(plan(source, tmp_path / "o2", "classify"), settings(models))
