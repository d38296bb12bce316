"""service.batch.answer on a stand-in engine that records what it was asked: rows go to the
engine sorted by length, in calls of CHUNK, and come back in the window's order; a call that
fails on its input is asked again row by row, so only the bad row fails; what no row causes
stops the run; the calls in flight never exceed the slots; no reference cycle keeps a window."""

from __future__ import annotations

import asyncio
import gc
import random
import weakref
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from heads.rows import InvalidInput
from heads.tasks import embed
from service.batch.answer import CHUNK, answer_rows
from service.batch.tasks import TASKS
from service.errors import ModelNotFound, PayloadTooLarge

pytestmark = pytest.mark.anyio


class Recorder:
    """An engine whose embed answers each text with [its length, its position in the call],
    and fails a call holding a text of `bad`."""

    def __init__(self, bad: dict[str, Exception] | None = None, delay: float = 0.0) -> None:
        self.calls: list[list[str]] = []
        self.bad = bad or {}
        self.delay = delay
        self.in_flight = self.most_in_flight = 0

    def call(self, where: str) -> Any:
        return SimpleNamespace(alone=False)

    async def answer(self, options: Any, texts: list[str], model: Any, call: Any) -> np.ndarray:
        assert isinstance(options, embed.Options) and call.alone  # batched alone
        self.calls.append(list(texts))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
            for text in texts:
                if text in self.bad:
                    raise self.bad[text]
            return np.array([[len(t), i] for i, t in enumerate(texts)], dtype=np.float32)
        finally:
            self.in_flight -= 1


def window(n: int, seed: int = 0) -> list[dict[str, Any] | None]:
    rng = random.Random(seed)
    return [{"text": "x" * rng.randint(0, 300)} for _ in range(n)]


async def test_rows_run_sorted_by_length_and_come_back_in_order() -> None:
    rows = window(500)
    engine = Recorder()
    out = await answer_rows(engine, TASKS["embed"], {}, rows, asyncio.Semaphore(4))  # type: ignore[arg-type]
    sent = [len(t) for call in engine.calls for t in call]
    assert sent == sorted(len(r["text"]) for r in rows)  # short rows first, side by side
    assert [len(c) for c in engine.calls] == [CHUNK] * 7 + [500 - 7 * CHUNK]
    assert [int(a[0]) for a in out.answers] == [len(r["text"]) for r in rows]  # input order
    assert out.errors == {}


async def test_a_bad_row_fails_alone_and_the_others_are_answered() -> None:
    rows = window(200)
    rows[17] = {"text": "bad"}
    rows[150] = {"text": "huge"}
    rows[3] = None  # refused before: stays None, never sent
    engine = Recorder({"bad": InvalidInput("no"), "huge": PayloadTooLarge("too long")})
    out = await answer_rows(engine, TASKS["embed"], {}, rows, asyncio.Semaphore(2))  # type: ignore[arg-type]
    assert out.errors == {17: ("no", "validation"), 150: ("too long", "payload_too_large")}
    assert [i for i, a in enumerate(out.answers) if a is None] == [3, 17, 150]
    assert all(
        int(a[0]) == len(rows[i]["text"]) for i, a in enumerate(out.answers) if a is not None
    )  # type: ignore[index]


async def test_what_no_row_causes_stops_the_run() -> None:
    engine = Recorder({"x": ModelNotFound("no model")})
    with pytest.raises(ModelNotFound):
        await answer_rows(engine, TASKS["embed"], {}, [{"text": "x"}] * 100, asyncio.Semaphore(2))  # type: ignore[arg-type]


async def test_calls_in_flight_never_exceed_the_slots() -> None:
    engine = Recorder(delay=0.002)
    slots = asyncio.Semaphore(3)
    await asyncio.gather(
        answer_rows(engine, TASKS["embed"], {}, window(400, 1), slots),  # type: ignore[arg-type]
        answer_rows(engine, TASKS["embed"], {}, window(400, 2), slots),  # type: ignore[arg-type]
    )  # two windows at once, as two parts overlap
    assert engine.most_in_flight == 3


async def test_a_window_is_freed_when_dropped_without_the_cycle_collector() -> None:
    """No reference cycle holds a window's answers: a run frees each part as it is written,
    not at CPython's next full collection (which came every few parts)."""
    gc.disable()
    try:
        out = await answer_rows(Recorder(), TASKS["embed"], {}, window(200), asyncio.Semaphore(2))  # type: ignore[arg-type]
        gone = weakref.ref(out)
        del out
        assert gone() is None
    finally:
        gc.enable()
