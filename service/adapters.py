"""Adapter packages in the service (heads.adapters): each is served under its own name, on
the endpoints of its task, through its encoder's batcher and session.

An adapter's `AdapterDoor` stands where a model's batcher stands: a request to the adapter
queues its task's job, wrapped in a HeadJob, on the encoder's batcher; the encoder's batches
mix every adapter's rows (each gathers its own LoRA update in the graph), so fifty adapters
with traffic spread over them still form one model's batches. The door counts its jobs in
flight, so an adapter unloaded or reloaded finishes what it has queued, as a model does; the
encoder's backend keeps its LoRA matrices stacked while it is attached.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from heads.adapters import Adapter
from heads.tasks import Job
from heads.tasks.analyze import HeadJob
from service.job_queue import Timing

if TYPE_CHECKING:
    from service.batcher import Batcher
    from service.runtime import EncoderBackend


class AdapterDoor:
    """An adapter's way into its encoder's batcher (see the module docstring)."""

    def __init__(self, batcher: Batcher, backend: EncoderBackend, adapter: Adapter) -> None:
        self.encoder, self.backend, self.adapter = batcher, backend, adapter
        self.name = adapter.name
        self._in_flight = 0
        backend.attach(adapter)

    def enqueue(
        self, job: Job, deadline: float, timing: Timing | None = None, alone: bool = False
    ) -> asyncio.Future[Any]:
        future = self.encoder.enqueue(HeadJob(job, self.adapter), deadline, timing, alone)
        self._in_flight += 1
        future.add_done_callback(self._done)
        return future

    def _done(self, _: asyncio.Future[Any]) -> None:
        self._in_flight -= 1

    @property
    def alive(self) -> bool:
        return self.encoder.alive

    @property
    def idle(self) -> bool:
        """Every job it queued has its answer (or error)."""
        return self._in_flight == 0

    async def stop(self) -> None:
        """Stop serving this adapter: its encoder serves on, without its LoRA matrices."""
        self.backend.detach(self.adapter)
