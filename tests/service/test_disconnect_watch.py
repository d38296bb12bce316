"""DisconnectWatch: one sweep timer for all waiting requests; a request gets its disconnect
watch only if it is still waiting at the second sweep after it was queued. The sweeps are
called by hand (the period is set out of reach), so the test does not depend on timing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from service.routes import inference
from service.routes.inference import DisconnectWatch

pytestmark = pytest.mark.anyio


class FakeRun:
    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.watched: list[asyncio.Future[Any]] = []

    def watch(self, future: asyncio.Future[Any]) -> None:
        self.watched.append(future)


async def test_only_requests_still_waiting_a_full_period_are_watched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(inference, "WATCH_AFTER", 3600.0)
    loop = asyncio.get_running_loop()
    watches = DisconnectWatch()
    slow, quick = FakeRun(), FakeRun()
    slow_future: asyncio.Future[Any] = loop.create_future()
    watches.add(slow, slow_future)  # type: ignore[arg-type]
    watches.add(quick, loop.create_future())  # type: ignore[arg-type]
    assert watches._timer is not None  # one timer for both
    watches.discard(quick)  # answered before any sweep
    watches._sweep()  # slow has waited less than a period: not yet
    assert slow.watched == [] and quick.watched == []
    watches._sweep()
    assert slow.watched == [slow_future] and quick.watched == []
    watches.discard(slow)
    watches._sweep()
    assert watches._timer is None  # nothing waiting: no timer left running
    late = FakeRun()
    watches.add(late, loop.create_future())  # type: ignore[arg-type]
    assert watches._timer is not None  # re-armed by the next request
    watches._timer.cancel()
