"""One batch run in this process: the input read part by part, each part's rows answered by the
engine (sorted by length within the part, service.batch.answer), each part written in input
order once its last row is answered (service.batch.output). The next part is read while one
is answered, and a part is answered while the one before it is finished and written: memory
holds two parts at most, whatever the input's size.

    plan = Plan(TASKS["embed"], {}, Path("in.parquet"), Path("out"), {"text": "text"})
    summary = asyncio.run(run(plan, EngineSettings(model_dir=Path("models"))))
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from heads.contract import MANIFEST
from service.batch.answer import ROW_ERRORS, answer_rows, error_of
from service.batch.output import Output
from service.batch.progress import Progress
from service.batch.read import Part, open_input
from service.batch.tasks import Row, Task, check_rows, to_arrow
from service.engine import Engine
from service.errors import ServiceError
from service.malloc import keep_large_blocks_mapped
from service.settings import EngineSettings

# Rows in engine calls at once: enough that the batcher's window (4 x max_batch_size rows)
# stays full while the next rows are tokenized; each call holds one slot.
IN_FLIGHT_ROWS = 1024
PARTS_IN_FLIGHT = 2  # parts being answered or written; the next is read meanwhile


class RunError(RuntimeError):
    """The run cannot go on (a package did not load, the options do not fit the model)."""


@dataclass(frozen=True)
class Plan:
    """What to run: the task and its options (Task.options), the files, which input column
    feeds each role (text, pair, question, context, query, documents), the columns to keep."""

    task: Task
    options: dict[str, Any]
    input: Path
    output: Path
    columns: dict[str, str]
    keep: tuple[str, ...] = ()
    output_column: str | None = None
    part_rows: int = 10_000
    format: str | None = None
    model: str | None = None  # which package (model_dir/NAME); None: the server's choice
    overwrite: bool = False
    progress: bool = True

    @property
    def answer_column(self) -> str:
        return self.output_column or self.task.output


@dataclass
class Summary:
    rows: int = 0  # rows written by this run
    bad: int = 0  # of which bad (in _errors.jsonl)
    parts: int = 0  # parts written by this run
    skipped_parts: int = 0  # parts an earlier run had written
    seconds: float = 0.0
    peak_parts: int = 0  # parts held in memory at once (read, answered, not yet written)
    already_complete: bool = False
    errors_file: Path | None = None
    # when the first part was written, and the rows by then: the steady rate leaves out the
    # start (the model's load, a Ray cluster's actors) and the first part's wait
    first: tuple[float, float, int] | None = None  # (perf_counter, process_time, rows)
    ended: tuple[float, float] = (0.0, 0.0)

    def add(self, rows: int, bad: int) -> None:
        """A part written."""
        self.rows += rows
        self.bad += bad
        self.parts += 1
        self.ended = (time.perf_counter(), time.process_time())
        if self.first is None:
            self.first = (*self.ended, self.rows)

    @property
    def steady_rate(self) -> float | None:
        """Rows per second after the first part (None with one part)."""
        if self.first is None or self.ended[0] <= self.first[0]:
            return None
        return (self.rows - self.first[2]) / (self.ended[0] - self.first[0])

    @property
    def steady_cpu_per_row(self) -> float | None:
        """CPU seconds of this process (all its threads) per row after the first part."""
        if self.first is None or self.rows <= self.first[2]:
            return None
        return (self.ended[1] - self.first[1]) / (self.rows - self.first[2])

    def figures(self) -> dict[str, Any]:
        """What the run did, as _SUCCESS records it (this invocation's, on a resumed run)."""
        return {
            "rows": self.rows,
            "bad": self.bad,
            "parts": self.parts,
            "skipped_parts": self.skipped_parts,
            "seconds": round(self.seconds, 3),
            "rows_per_s": round(self.rows / self.seconds, 1) if self.seconds else None,
            "steady_rows_per_s": round(self.steady_rate, 1) if self.steady_rate else None,
            "steady_cpu_ms_per_row": round(1000 * cpu, 3)
            if (cpu := self.steady_cpu_per_row)
            else None,
        }

    def line(self) -> str:
        if self.already_complete:
            return "nothing to do: this output is complete (pass --overwrite to run it again)"
        rate = self.rows / self.seconds if self.seconds else 0.0
        text = f"wrote {self.rows:,} rows in {self.parts} parts ({rate:,.0f} rows/s"
        text += f", {self.steady_rate:,.0f} after the first part)" if self.steady_rate else ")"
        if self.skipped_parts:
            text += f", after {self.skipped_parts} parts of an earlier run"
        if self.bad:
            text += f"; {self.bad:,} bad rows in {self.errors_file}"
        return text


def release_memory() -> None:
    """Freed memory goes back to the system, so that a run's memory stays flat over its parts:
    the buffers of Arrow's Python calls from the system allocator (its default, mimalloc, kept
    ~2 MiB more a part: 300k rows, tiny model, 341 -> 391 MiB and growing; with it, 254 -> 287
    MiB, flat from the tenth part; its C++ code's: service/batch/__init__.py), and glibc's large
    blocks mapped apart, as the server does (service.malloc). Once per process, before
    anything is read."""
    pa.set_memory_pool(pa.system_memory_pool())
    keep_large_blocks_mapped()


def engine_settings(settings: EngineSettings, model: str | None) -> EngineSettings:
    """The server's settings for an offline run: only package `model` loaded when named (a
    folder of model_dir), no request timeout or admission limit that a queue of a whole part
    would meet. Limits on inputs (max_text_chars) stay the server's: the same rows fail."""
    update: dict[str, Any] = {
        "request_timeout": max(settings.request_timeout, 7 * 24 * 3600.0),
        "max_concurrent_requests": max(settings.max_concurrent_requests, IN_FLIGHT_ROWS + 64),
        "max_client_batch_size": max(settings.max_client_batch_size, settings.max_batch_size),
        "model_control": "none",
    }
    if model is not None and (settings.model_dir / model / MANIFEST).is_file():
        update |= {"model_dir": settings.model_dir / model, "model_name": model}
    return settings.model_copy(update=update)


def models_of(settings: EngineSettings) -> dict[str, str]:
    """Each package the run loads: the start of its package.json's sha256 (which holds every
    file's), so that a resumed run knows it answers with the same model."""
    root = settings.model_dir
    folders = (
        [root]
        if (root / MANIFEST).is_file()
        else sorted(p.parent for p in root.glob(f"*/{MANIFEST}"))
    )
    return {
        (settings.model_name if f == root and settings.model_name else f.name): hashlib.sha256(
            (f / MANIFEST).read_bytes()
        ).hexdigest()[:12]
        for f in folders
    }


def describe(plan: Plan, settings: EngineSettings) -> dict[str, Any]:
    """What makes a resumed run the same run (service.batch.output): a JSON-plain dict."""
    stat = plan.input.stat()
    run = {
        "task": plan.task.name,
        "options": plan.options,
        "columns": plan.columns,
        "keep": list(plan.keep),
        "output_column": plan.answer_column,
        "part_rows": plan.part_rows,
        "input": {
            "path": str(plan.input.resolve()),
            "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns,
        },
        "models": models_of(settings),
        "model": plan.model,
        "variant": settings.variant,
        "device": settings.device,
    }
    return json.loads(json.dumps(run))  # tuples as lists: equal to what the file reads back


def check_loaded(engine: Engine) -> None:
    entries = engine.registry.entries
    if not entries:
        raise RunError(f"no model package in {engine.settings.model_dir}")
    failed = [f"{e.name}: {e.error}" for e in entries if e.state == "failed"]
    if failed:
        raise RunError("a package did not load: " + "; ".join(failed))


async def probe(engine: Engine, plan: Plan) -> int:
    """Answer one made-up row before the file's, so that what no row can cure (options the
    model does not take, a model that does not do the task) stops the run instead of failing
    every row; returns the embedding size (embed, embed_all: its vectors' fixed size), else 0."""
    row: Row = {role: "a" for role in plan.columns}
    if "documents" in row:
        row["documents"] = ["a"]
    if plan.task.name == "fill-mask":
        masks = [e.model.package.mask_token for e in engine.registry.entries
                 if e.model is not None and e.name == (plan.model or e.name)]  # fmt: skip
        row["text"] = next((m for m in masks if m), "a")
    try:
        [answer] = await plan.task.answer(engine, [row], plan.options, plan.model)
    except (*ROW_ERRORS, ServiceError) as e:  # not this text's fault: the options' or the model's
        raise RunError(f"{plan.task.endpoint} with these options: {error_of(e)[0]}") from None
    if plan.task.name == "embed_all":  # (tokens, D), or with return_tokens {"embeddings", ...}
        vectors = answer["embeddings"] if isinstance(answer, dict) else answer
        return int(vectors.shape[-1])
    return len(answer) if plan.task.name == "embed" else 0


def part_table(plan: Plan, first: int, keep: dict[str, pa.Array], answer: pa.Array) -> pa.Table:
    """A part as written: `row` (the input's row number), the kept columns, the answer."""
    rows = pa.array(range(first, first + len(answer)), pa.int64())
    return pa.table({"row": rows, **keep, plan.answer_column: answer})


async def run(plan: Plan, settings: EngineSettings) -> Summary:
    """Run `plan` with the engine `settings` give (see the module docstring)."""
    summary = Summary()
    reader = open_input(plan.input, plan.columns, list(plan.keep), plan.format)
    settings = engine_settings(settings, plan.model)
    output = Output(plan.output, describe(plan, settings), plan.overwrite)
    summary.errors_file = plan.output / "_errors.jsonl"
    summary.skipped_parts = output.done
    if output.complete:
        summary.already_complete = True
        return summary
    async with Engine(settings) as engine:
        check_loaded(engine)
        kind = plan.task.arrow(plan.options, await probe(engine, plan))
        progress = Progress(reader.total, output.rows_done, reader.fraction, enabled=plan.progress)
        chunk = settings.max_batch_size
        slots = asyncio.Semaphore(max(1, IN_FLIGHT_ROWS // (1 if plan.task.per_row else chunk)))
        started = time.perf_counter()
        parts = reader.parts(plan.part_rows, output.done)
        Checked = tuple[Part, list[Row | None], dict[int, tuple[str, str]]]
        pending: deque[tuple[Part, dict[int, tuple[str, str]], asyncio.Task[Any]]] = deque()

        def read_next() -> Checked | None:  # in a thread: reading and checking overlap the model
            part = next(parts, None)
            return (
                None if part is None else (part, *check_rows(plan.task, part.values, part.errors))
            )

        def write(part: Part, answers: list[Any], errors: dict[int, tuple[str, str]]) -> pa.Table:
            table = part_table(plan, part.first, part.keep, to_arrow(plan.task, answers, kind))
            lines = [
                {"row": part.first + i, "error": message, "error_type": error_type}
                for i, (message, error_type) in sorted(errors.items())
            ]
            output.write(part.index, table, lines)
            return table

        async def commit() -> None:
            part, refused, answering = pending.popleft()
            answered = await answering
            errors = {**refused, **answered.errors}
            table = await asyncio.to_thread(write, part, answered.answers, errors)  # off the loop
            summary.add(table.num_rows, len(errors))
            progress.add(table.num_rows, len(errors))

        try:
            while True:
                summary.peak_parts = max(summary.peak_parts, len(pending) + 1)  # + the one read
                checked = await asyncio.to_thread(read_next)
                if checked is None:
                    break
                part, rows, refused = checked
                answering = asyncio.ensure_future(
                    answer_rows(engine, plan.task, plan.options, rows, slots, plan.model, chunk)
                )
                pending.append((part, refused, answering))
                if len(pending) >= PARTS_IN_FLIGHT:
                    await commit()
            while pending:
                await commit()
        finally:
            for _, _, answering in pending:
                answering.cancel()
            parts.close()
        summary.seconds = time.perf_counter() - started
        output.finish(summary.figures())
        if plan.progress:
            progress.close()
    return summary
