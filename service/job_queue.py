"""The queue policy of one model: what waits, what is dropped, and what runs next.

`JobQueue` holds no thread and runs nothing: the batcher's worker (service.batcher) asks it for
new jobs, hands it their rows, and asks it for the next batch. What it decides:

- admission (`Admission`): at most max_concurrent_requests in flight, the next one refused
  with 429 at once;
- deadlines: each job's timer fails it with DeadlineExceeded when request_timeout passes;
- disconnects: a job whose future is cancelled (the client went away) is dropped, and its rows
  still queued never run;
- the next batch (`next_batch`, `grow_batch`): a window of the oldest live rows, sorted by
  length, grown around the oldest under the token budget.

The queue depth gauge reads a counter at scrape time: no metric write per request.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from heads.rows import ModelRow, Outputs
from heads.tasks import Job
from service.errors import DeadlineExceeded, NotReady, Overloaded
from service.metrics import ModelMetrics

__all__ = ["Admission", "JobQueue", "Queued", "grow_batch", "next_batch"]

# How many queued rows the batch builder looks at, in units of max_batch_size: enough choice to
# group similar lengths, small enough that sorting it costs nothing next to a forward pass.
WINDOW_FACTOR = 4


class Admission:
    """At most `limit` requests in flight; the next one is refused with 429 at once rather than
    queued without bound (a queue that only grows turns every request into a timeout)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def acquire(self) -> None:
        if self.in_flight >= self.limit:
            raise Overloaded(
                f"{self.in_flight} requests in flight (max_concurrent_requests); retry later",
                retry_after=1.0,
            )
        self.in_flight += 1
        self._idle.clear()

    def release(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no request is in flight; False if `timeout` seconds passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True


def grow_batch(
    lengths: list[int],
    seed: int,
    max_tokens: int,
    max_size: int,
    pad_limit: int | None = None,
) -> tuple[int, int]:
    """Indices [lo, hi) of sorted `lengths` that form the batch containing `seed`.

    Shorter neighbours first (they do not raise the padded length), then longer ones, while
    size x longest <= max_tokens and size <= max_size. With `pad_limit`, a row joins only if
    it adds at most that many padded tokens (a shorter row: its own padding; a longer row: the
    padding it adds to the rows already in). The seed alone always fits.
    """
    lo, hi = seed, seed + 1

    def fits(size: int, longest: int) -> bool:
        return size <= max_size and size * longest <= max_tokens

    while True:
        longest = lengths[hi - 1]
        if (
            lo > 0
            and fits(hi - lo + 1, longest)
            and (pad_limit is None or longest - lengths[lo - 1] <= pad_limit)
        ):
            lo -= 1
        elif (
            hi < len(lengths)
            and fits(hi - lo + 1, lengths[hi])
            and (pad_limit is None or (hi - lo) * (lengths[hi] - longest) <= pad_limit)
        ):
            hi += 1
        else:
            return lo, hi


def next_batch(
    lengths: list[int], max_tokens: int, max_size: int, pad_limit: int | None = None
) -> list[int]:
    """Indices of the rows (`lengths` in arrival order, the oldest first) that form the next
    batch, shortest first: the rows sorted by length (stable, so ties keep FIFO order) and a
    batch grown around the oldest by `grow_batch`, so no row starves."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    sorted_lengths = [lengths[k] for k in order]
    lo, hi = grow_batch(sorted_lengths, order.index(0), max_tokens, max_size, pad_limit)
    return order[lo:hi]


@dataclass
class Timing:
    """Where one job's time went, in seconds (the answer's x-*-time headers): waiting for its
    first batch (its tokenization left out), its texts' tokenization, and the inference of
    the batches its rows ran in."""

    queue: float = 0.0
    tokenization: float = 0.0
    inference: float = 0.0
    # The batches its rows ran in (traces' inference span): how many, and their rows and
    # padded tokens (rows x longest), the other jobs' rows included.
    batches: int = 0
    batch_rows: int = 0
    batch_tokens: int = 0


@dataclass(eq=False)
class Queued:
    """One job in the queue, and what became of its rows."""

    job: Job
    deadline: float  # loop.time() clock
    enqueued: float  # loop.time() clock: max_wait's
    future: asyncio.Future[Any]
    rows: list[ModelRow] = field(default_factory=list)  # set once the job is tokenized
    results: list[Outputs | None] = field(default_factory=list)
    unfinished: int = 0  # rows without outputs yet
    queued: int = 1  # rows not yet taken into a batch; 1 until tokenized (the job itself)
    started: bool = False
    nonfinite: bool = False  # a row's outputs hold a NaN or an infinity
    timer: asyncio.TimerHandle | None = None
    timing: Timing = field(default_factory=Timing)  # the caller's, when it keeps one
    # Its rows share a batch with no other job's (offline batch runs: a job's answers then
    # depend on its own rows alone, run after run; see next_batch).
    alone: bool = False
    # perf_counter() when queued: the queue wait's start. Not loop.time(): uvloop's is the
    # loop iteration's cached millisecond clock, and made x-queue-time up to a ms off (a
    # request's stages then added up to more than its x-total-time).
    queued_at: float = field(default_factory=time.perf_counter)


class JobQueue:
    """Jobs waiting for tokenization (the inbox), then their rows waiting for a batch."""

    def __init__(
        self,
        metrics: ModelMetrics,
        *,
        max_batch_tokens: int,
        max_batch_size: int,
        pad_limit: int | None,
    ) -> None:
        self.metrics = metrics
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.pad_limit = pad_limit
        self._inbox: list[Queued] = []  # jobs not yet tokenized
        self._rows: deque[tuple[Queued, int]] = deque()
        # Rows of live requests in _rows (dead ones are skipped lazily), and 1 per job not yet
        # tokenized.
        self.depth = 0
        self.unanswered = 0  # jobs put whose future is not done: 0 = nothing left to answer
        metrics.queue_depth.set_function(lambda: self.depth)
        self.arrived = asyncio.Event()  # set by put(); the worker clears it before it waits

    def put(
        self,
        job: Job,
        deadline: float,
        loop: asyncio.AbstractEventLoop,
        timing: Timing | None = None,
        alone: bool = False,
    ) -> Queued:
        """Queue `job` until `deadline` (event loop clock); `timing` gets its stages' times;
        `alone`: its rows are batched with each other only."""
        request = Queued(job, deadline, loop.time(), loop.create_future(), alone=alone)
        if timing is not None:
            request.timing = timing
        request.timer = loop.call_at(deadline, self._expire, request)
        request.future.add_done_callback(lambda _: self._finished(request))
        self._inbox.append(request)
        self.depth += 1
        self.unanswered += 1
        self.arrived.set()
        return request

    def take_new(self) -> list[Queued]:
        """The jobs that arrived since the last call and are still live."""
        new = [r for r in self._inbox if not r.future.done()]
        self._inbox = []
        return new

    def oldest(self) -> Queued | None:
        """The oldest job with rows queued, if any is still live."""
        return next((r for r, _ in self._rows if not r.future.done()), None)

    def add_rows(self, request: Queued, rows: list[ModelRow]) -> None:
        """A tokenized job's rows join the queue (no rows: nothing joins)."""
        request.rows = rows
        request.results = [None] * len(rows)
        request.unfinished = len(rows)
        self.depth += len(rows) - 1
        request.queued = len(rows)
        self._rows.extend((request, i) for i in range(len(rows)))

    def next_batch(self) -> list[tuple[Queued, int]]:
        """Take the next batch out of the queue (`next_batch` over a window of the oldest live
        rows); the rest of the window goes back in front, in order. The rows of a job queued
        `alone` share a batch only with each other."""
        window: list[tuple[Queued, int]] = []
        apart: list[tuple[Queued, int]] = []  # rows of `alone` jobs kept out of this window
        oldest: Queued | None = None
        while self._rows and len(window) + len(apart) < WINDOW_FACTOR * self.max_batch_size:
            request, i = self._rows.popleft()
            if request.future.done():
                continue
            if oldest is None:
                oldest = request
            elif (request.alone or oldest.alone) and request is not oldest:
                apart.append((request, i))
                if oldest.alone:  # its rows are all in the window: it is batched alone
                    break
                continue
            window.append((request, i))
        if not window:  # the queue held only finished requests' rows: none is queued
            self.depth = sum(not r.future.done() for r in self._inbox)
            return []
        lengths = [len(request.rows[i]) for request, i in window]  # window[0]: the oldest
        picked = next_batch(lengths, self.max_batch_tokens, self.max_batch_size, self.pad_limit)
        chosen = set(picked)
        rest = [window[k] for k in range(len(window)) if k not in chosen]
        self._rows.extendleft(reversed(rest + apart))  # apart: behind the window's rest
        batch = [window[k] for k in picked]
        for request, _ in batch:
            request.queued -= 1
        self.depth -= len(batch)
        return batch

    def fail(self, request: Queued, error: Exception) -> None:
        """Fail a live request (its rows still queued are dropped)."""
        if not request.future.done():
            self.forget(request)
            request.future.set_exception(error)

    def forget(self, request: Queued) -> None:
        """Take a finished request's still-queued rows out of the depth count."""
        self.depth -= request.queued
        request.queued = 0

    def close(self, live: list[Queued]) -> None:
        """Shutdown: every request still waiting (and `live`, those the worker holds) gets 503
        not_ready; the queue is left empty."""
        waiting = [*live, *self._inbox, *(r for r, _ in self._rows)]
        for request in waiting:
            if not request.future.done():
                request.future.set_exception(NotReady("the service is shutting down"))
        self._inbox = []
        self._rows.clear()
        self.depth = 0

    def _expire(self, request: Queued) -> None:
        if request.future.done():
            return
        if request.queued:  # counted only when it saves compute: rows still queued
            self.metrics.dropped_deadline.inc()
        self.forget(request)
        request.future.set_exception(
            DeadlineExceeded("request_timeout passed before the model answered")
        )

    def _finished(self, request: Queued) -> None:
        """Done callback of every request's future: an answer, an error, or a cancel."""
        self.unanswered -= 1
        if request.timer is not None:
            request.timer.cancel()
        if request.future.cancelled():
            # The handler gave up: the client is gone. Its queued rows will be skipped.
            if request.queued:
                self.metrics.dropped_client_gone.inc()
            self.forget(request)
