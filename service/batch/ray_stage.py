"""The engine as a Ray Data stage, for a corpus that outgrows one machine: `Predictor` is a
callable class for `Dataset.map_batches`; Ray starts it once per actor, so each actor loads
the package once, and calls it with batches of rows (Arrow tables).

    import ray
    from service.batch.ray_stage import Predictor

    ds = ray.data.read_parquet("s3://bucket/corpus/")
    ds = ds.map_batches(
        Predictor,
        fn_constructor_kwargs={"task": "embed", "model_dir": "/models", "model": "minilm",
                               "columns": {"text": "sentence"}, "options": {"normalize": True},
                               "settings": {"intra_op_threads": 4}},
        compute=ray.data.ActorPoolStrategy(size=8),  # Ray 2.5x: `concurrency=` is deprecated
        num_cpus=4,  # per actor: its ONNX Runtime threads
        batch_size=1024,
        batch_format="pyarrow",
    )
    ds.write_parquet("s3://bucket/embeddings/")

Each output batch is the input batch plus the answer column (the task's name for it, or
`output_column`), `error` (null, or why the row has no answer: the message the endpoint would
have sent) and `error_type`. The options are the endpoint's body fields, checked by that body;
`settings`, the engine's (service.settings.Settings fields). Leave a CPU per node beside the
actors' (a local Ray: `ray.init(num_cpus=cores + 1)`): Ray Data's read tasks need one of their
own, or they wait for an actor that waits for them.

`run_on_ray` is `python -m service.batch ... --ray`: Ray Data reads the file (its own readers:
a malformed JSON line or CSV record fails the read there), the actors answer, and this process
writes the parts, in input order, with the single-process run's writer: the same folder, the
same errors file, resumable (a resumed run computes the finished parts again but writes
nothing twice). This module is the only one that imports Ray.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa

from service.batch.answer import answer_rows
from service.batch.output import Output
from service.batch.progress import Progress
from service.batch.read import file_format, open_input
from service.batch.run import (
    IN_FLIGHT_ROWS,
    Plan,
    Summary,
    check_loaded,
    describe,
    engine_settings,
    part_table,
    probe,
    release_memory,
)
from service.batch.tasks import TASKS, check_rows, to_arrow
from service.engine import Engine
from service.settings import Settings

ERROR, ERROR_TYPE = "error", "error_type"
# Rows per block the actors get: Ray reads a small file as one block (one actor's work), so
# the read is cut into blocks of this many rows, streaming; a block is one Predictor call.
BLOCK_ROWS = 1024


class Predictor:
    """See the module docstring. `settings`: Settings fields for the engine (threads,
    variant, device...), as `python -m service` takes them."""

    def __init__(
        self,
        task: str,
        model_dir: str | Path,
        model: str | None = None,
        columns: dict[str, str] | None = None,
        options: dict[str, Any] | None = None,
        output_column: str | None = None,
        settings: dict[str, Any] | None = None,
    ) -> None:
        self.task = TASKS[task]
        self.columns = columns or {c.role: c.default for c in self.task.columns if c.default}
        self.plan = Plan(self.task, self.task.options(options or {}), Path(), Path(),
                         self.columns, output_column=output_column, model=model)  # fmt: skip
        release_memory()  # an actor is a process of its own
        base = Settings(**{"model_dir": Path(model_dir), **(settings or {})})
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True, name="engine").start()
        self.engine = Engine(engine_settings(base.engine(), model))
        self._wait(self.engine.start())
        check_loaded(self.engine)
        self.kind = self.task.arrow(self.plan.options, self._wait(probe(self.engine, self.plan)))
        self.chunk = self.engine.settings.max_batch_size
        self.slots = max(1, IN_FLIGHT_ROWS // (1 if self.task.per_row else self.chunk))

    def _wait(self, work: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result()

    def __call__(self, batch: pa.Table) -> pa.Table:
        by_role = {role: batch.column(name).to_pylist() for role, name in self.columns.items()}
        values = [
            dict(zip(by_role, row, strict=True)) for row in zip(*by_role.values(), strict=True)
        ]
        rows, refused = check_rows(self.task, list(values))
        answered = self._wait(self._answer(rows))
        errors = {**refused, **answered.errors}
        messages = [errors.get(i, (None, None)) for i in range(batch.num_rows)]
        answer = to_arrow(self.task, answered.answers, self.kind)
        return (
            batch.append_column(self.plan.answer_column, answer)
            .append_column(ERROR, pa.array([m for m, _ in messages], pa.string()))
            .append_column(ERROR_TYPE, pa.array([t for _, t in messages], pa.string()))
        )

    async def _answer(self, rows: list[Any]) -> Any:
        slots = asyncio.Semaphore(self.slots)
        return await answer_rows(
            self.engine, self.task, self.plan.options, rows, slots, self.plan.model, self.chunk
        )

    def __del__(self) -> None:
        loop = getattr(self, "loop", None)
        if loop is not None and loop.is_running():
            asyncio.run_coroutine_threadsafe(self.engine.stop(), loop)


def _read(ray: Any, plan: Plan) -> Any:
    path, kind = str(plan.input), file_format(plan.input, plan.format)
    columns = list(dict.fromkeys([*plan.columns.values(), *plan.keep]))
    if kind == "parquet":
        return ray.data.read_parquet(path, columns=columns)
    if kind == "jsonl":
        return ray.data.read_json(path, lines=True).select_columns(columns)
    import pyarrow.csv as csv

    if kind == "tsv":  # GLUE's TSV: quotes are text
        parse = csv.ParseOptions(delimiter="\t", quote_char=False)
    else:
        parse = csv.ParseOptions(delimiter=",")
    return ray.data.read_csv(path, parse_options=parse).select_columns(columns)


def run_on_ray(
    plan: Plan, settings: Settings, address: str | None = None, actors: int = 2
) -> Summary:
    """`plan` as a Ray Data job on `address`'s cluster (None: a local Ray), `actors` Predictors,
    each with `intra_op_threads` threads (default: this machine's cores shared out) and, with
    device cuda, a GPU."""
    import ray

    summary = Summary()
    open_input(plan.input, plan.columns, list(plan.keep), plan.format)  # the columns are there
    output = Output(
        plan.output, describe(plan, engine_settings(settings, plan.model)), plan.overwrite
    )
    summary.errors_file = plan.output / "_errors.jsonl"
    summary.skipped_parts = output.done
    if output.complete:
        summary.already_complete = True
        return summary
    ours = address is None and not ray.is_initialized()
    # A local Ray gets one logical CPU beyond the cores: the actors hold every core, and Ray
    # Data's read tasks need a CPU of their own to be scheduled at all (on a cluster, leave one).
    ray.init(
        address=address,
        num_cpus=(os.cpu_count() or 1) + 1 if ours else None,
        ignore_reinit_error=True,
        include_dashboard=False,
        log_to_driver=False,
    )
    try:
        context = ray.data.DataContext.get_current()
        context.execution_options.preserve_order = True  # the parts are written in input order
        context.enable_progress_bars = False  # ours is the progress line
        progress = Progress(None, output.rows_done, enabled=plan.progress)
        started = time.perf_counter()
        batches = _dataset(ray, plan, settings, actors).iter_batches(
            batch_format="pyarrow", batch_size=None
        )
        _write_in_order(batches, plan, output, summary, progress)
        summary.seconds = time.perf_counter() - started
    finally:
        if ours:
            ray.shutdown()
    output.finish(summary.figures())
    if plan.progress:
        progress.close()
    return summary


def _dataset(ray: Any, plan: Plan, settings: Settings, actors: int) -> Any:
    """The input read by Ray Data, then answered by `actors` Predictors."""
    threads = settings.intra_op_threads or max(1, (os.cpu_count() or 1) // actors)
    fields = settings.model_dump(exclude_unset=True) | {"intra_op_threads": threads}
    fields.pop("model_dir", None)
    block = min(plan.part_rows, BLOCK_ROWS)
    return _read(ray, plan).repartition(target_num_rows_per_block=block).map_batches(
        Predictor,
        fn_constructor_kwargs={
            "task": plan.task.name, "model_dir": str(settings.model_dir.resolve()),
            "model": plan.model, "columns": plan.columns, "options": plan.options,
            "output_column": plan.output_column, "settings": fields,
        },
        compute=ray.data.ActorPoolStrategy(size=actors),
        num_cpus=threads,
        num_gpus=1 if settings.device == "cuda" else None,  # --device cuda: a GPU per actor
        batch_size=block,
        batch_format="pyarrow",
    )  # fmt: skip


def _write_in_order(
    batches: Iterable[pa.Table], plan: Plan, output: Output, summary: Summary, progress: Progress
) -> None:
    """The answered batches (in input order) cut into parts and written, from the first part
    not yet written on."""
    first, skip = 0, output.rows_done  # the next part's first row; rows already written
    held: list[pa.Table] = []

    def commit(table: pa.Table) -> None:
        errors = zip(
            table.column(ERROR).to_pylist(), table.column(ERROR_TYPE).to_pylist(), strict=True
        )
        lines = [
            {"row": first + i, "error": message, "error_type": error_type}
            for i, (message, error_type) in enumerate(errors)
            if message is not None
        ]
        kept = {name: table.column(name).combine_chunks() for name in plan.keep}
        answer = table.column(plan.answer_column).combine_chunks()
        output.write(first // plan.part_rows, part_table(plan, first, kept, answer), lines)
        summary.add(table.num_rows, len(lines))
        progress.add(table.num_rows, len(lines))

    for batch in batches:
        if skip:
            cut = min(skip, batch.num_rows)
            batch, skip, first = batch.slice(cut), skip - cut, first + cut
        held.append(batch)
        rows = sum(b.num_rows for b in held)
        while rows >= plan.part_rows:
            table = pa.concat_tables(held)
            commit(table.slice(0, plan.part_rows))
            first += plan.part_rows
            rest = table.slice(plan.part_rows)
            held, rows = [rest], rest.num_rows
    if sum(b.num_rows for b in held):
        commit(pa.concat_tables(held))
