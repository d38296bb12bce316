"""Rows in, answers out, through the engine: one window of rows (a part of the file, or a Ray
batch) sorted by length, sent as calls of `chunk` rows in that order, answers put back in the
window's order. The engine's batcher then finds rows of like length side by side in its queue,
so little compute goes to padding; a shared semaphore bounds the calls in flight.

Each call's rows are batched with each other only (`alone`), so the answers do not depend
on which calls happened to be queued together. A call that fails on its input (what the endpoint answers with 422, 413 or a backend 503) is
asked again row by row, so that one bad row costs only itself: its message goes to `errors`.
What no row can cure (no such model, the engine shutting down) is raised.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from heads.rows import InvalidInput
from service.batch.tasks import Row, Task, length
from service.engine import Call, Engine
from service.errors import BackendError, DeadlineExceeded, InputError, PayloadTooLarge

# Errors of a row's own making; anything else stops the run.
ROW_ERRORS = (InvalidInput, InputError, PayloadTooLarge, BackendError, DeadlineExceeded)
# Rows per engine call: the server's default max_batch_size, a batch's worth (the run passes
# the engine's own); a bad row sends the rows of its call round again, one by one.
CHUNK = 64


@dataclass
class Answers:
    """A window's answers in its order (None where the row failed), and its failures by
    position: (message, error_type) as the endpoint's error body would say them."""

    answers: list[Any]
    errors: dict[int, tuple[str, str]] = field(default_factory=dict)


def alone(engine: Engine) -> Call:
    """An engine call whose rows are batched with each other only: each chunk's batches, and
    so its answers, depend on the chunk alone, so that a resumed run writes what an
    uninterrupted one would have, bit for bit (int8's per-batch scales included)."""
    call = engine.call("the batch run")
    call.alone = True
    return call


def error_of(exc: BaseException) -> tuple[str, str]:
    if isinstance(exc, InvalidInput):
        return str(exc), "validation"
    return getattr(exc, "message", str(exc)), getattr(exc, "error_type", "internal")


async def answer_call(
    engine: Engine,
    task: Task,
    options: dict[str, Any],
    model: str | None,
    rows: list[Row | None],
    indices: list[int],
    out: Answers,
) -> None:
    """Rows `indices` of `rows` answered in one call, into `out`; if the call fails on its
    input, each row again on its own, so that a bad row costs only itself."""
    # A function of the module, not a closure of answer_rows: a closure that calls itself is a
    # reference cycle (function -> cell -> function), which keeps each part's rows and answers
    # after the part is written, until CPython's next full collection, every ~4 parts. MiniLM
    # int8, 300,000 rows in parts of 10,000: malloc's bytes in use 54-124 MiB from part to part
    # with the closure, 53-66 without; the run's peak RSS 602 -> 523 MiB.
    try:
        batch = [rows[i] for i in indices]
        answers = await task.answer(engine, batch, options, model, alone(engine))  # type: ignore[arg-type]
    except ROW_ERRORS as exc:
        if len(indices) == 1:
            out.errors[indices[0]] = error_of(exc)
            return
        await asyncio.gather(  # find the bad row(s)
            *(answer_call(engine, task, options, model, rows, [i], out) for i in indices)
        )
        return
    for i, a in zip(indices, answers, strict=True):
        out.answers[i] = a


async def answer_rows(
    engine: Engine,
    task: Task,
    options: dict[str, Any],
    rows: list[Row | None],
    slots: asyncio.Semaphore,
    model: str | None = None,
    chunk: int = CHUNK,
) -> Answers:
    """The answers of `rows` (None: a row already refused, which stays None). `slots`: one
    is held per call in flight, shared by every window running at once."""
    out = Answers([None] * len(rows))
    live = sorted((i for i, r in enumerate(rows) if r is not None), key=lambda i: length(rows[i]))  # type: ignore[arg-type]
    size = 1 if task.per_row else chunk

    async def held(indices: list[int]) -> None:
        try:
            await answer_call(engine, task, options, model, rows, indices, out)
        finally:
            slots.release()

    calls = []
    for start in range(0, len(live), size):
        await slots.acquire()  # in sorted order: short rows first, side by side
        calls.append(asyncio.ensure_future(held(live[start : start + size])))
    try:
        await asyncio.gather(*calls)
    finally:
        for c in calls:  # an error stops the run: the others need not finish
            c.cancel()
    return out
