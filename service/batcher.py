"""Token-budget dynamic batching per model, admission control, deadlines.

Requests arrive already tokenized as `Sequence` rows. One worker task per model builds the next
batch as soon as the runtime is free:

1. take a window of the oldest queued rows (FIFO), skipping rows of requests that are already
   finished: cancelled because the client went away, past their deadline, or failed;
2. sort the window by length and grow a batch around the oldest row, first with shorter rows
   (free: the padded length stays), then longer ones, while rows x longest <= max_batch_tokens
   and rows <= max_batch_size; on CPU, where padding costs as much as tokens, only rows that add
   at most CPU_PAD_LIMIT padded tokens. Similar lengths share a batch, so little compute goes to
   padding, and the oldest row always goes, so no request starves;
3. pad, run the backend in a thread (the event loop keeps accepting and tokenizing requests
   meanwhile), and hand each row its slice of the outputs.

A request's rows may land in different batches; it completes when its last row does. A backend
exception fails the requests of that batch only (BackendError) and the worker carries on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field

from prometheus_client import Counter

from service.errors import BackendError, DeadlineExceeded, NotReady, Overloaded
from service.metrics import ModelMetrics
from service.rows import Outputs, Sequence, pad
from service.runtime import Backend

log = logging.getLogger(__name__)

# How many queued rows the batch builder looks at, in units of max_batch_size: enough choice to
# group similar lengths, small enough that sorting it costs nothing next to a forward pass.
WINDOW_FACTOR = 4
# On CPU a padded position costs as much as a real token, and one more forward pass costs
# little beyond its tokens: a row joins a CPU batch only if it adds at most this many padded
# tokens; the others form the next batch. SST-2 sentences in batches of 16 on 2 cores ran
# 1.7x faster (MiniLM fp32 and int8) and 1.4x / 1.9x (BERT-base fp32 / int8) than padded
# whole; limits of 4 to 16 were within 5% of each other (benchmarks/README.md). On a GPU,
# larger batches win over padding waste: no limit there.
CPU_PAD_LIMIT = 8


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


@dataclass(eq=False)
class _Request:
    rows: list[Sequence]
    deadline: float  # loop.time() clock
    enqueued: float
    future: asyncio.Future[list[Outputs]]
    results: list[Outputs | None] = field(init=False)
    unfinished: int = field(init=False)  # rows without outputs yet
    queued: int = field(init=False)  # rows not yet taken into a batch
    started: bool = False

    def __post_init__(self) -> None:
        self.results = [None] * len(self.rows)
        self.unfinished = self.queued = len(self.rows)


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


class Batcher:
    """The queue and worker of one model. Create, `start()` inside the event loop, `submit()`
    from request handlers, `stop()` at shutdown."""

    def __init__(
        self,
        backend: Backend,
        metrics: ModelMetrics,
        *,
        sequence_outputs: frozenset[str],
        max_batch_tokens: int,
        max_batch_size: int,
        max_wait_ms: float = 0.0,
        pad_token_id: int = 0,
        name: str = "model",
    ) -> None:
        self.backend = backend
        self.metrics = metrics
        self.sequence_outputs = sequence_outputs
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.max_wait = max_wait_ms / 1000
        self.pad_token_id = pad_token_id
        self.pad_limit = CPU_PAD_LIMIT if backend.provider == "cpu" else None
        self.name = name
        self._queue: deque[tuple[_Request, int]] = deque()
        self._queued_rows = 0  # rows of live requests in _queue (dead ones are skipped lazily)
        self._wake = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self._running: list[tuple[_Request, int]] = []  # the batch in the backend now

    def start(self) -> None:
        self._worker = asyncio.create_task(self._run(), name=f"batcher-{self.name}")

    @property
    def alive(self) -> bool:
        """False once the worker has ended other than by stop(): nothing would run the queue."""
        return self._worker is not None and not self._worker.done()

    async def stop(self) -> None:
        """Stop the worker; requests still queued get 503 not_ready."""
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
            self._worker = None
        for request, _ in [*self._running, *self._queue]:
            if not request.future.done():
                request.future.set_exception(NotReady("the service is shutting down"))
        self._queue.clear()
        self._running = []
        self._set_depth(0)

    async def submit(self, rows: list[Sequence], deadline: float) -> list[Outputs]:
        """Run `rows` (in any batches) and return their outputs in order.

        `deadline` is on the event loop's clock. Raises DeadlineExceeded when it passes first,
        BackendError when a batch holding one of the rows failed.
        """
        if not rows:
            return []
        if self._worker is None:
            raise NotReady(f"model {self.name} is not running")
        loop = asyncio.get_running_loop()
        request = _Request(rows, deadline, loop.time(), loop.create_future())
        self._queue.extend((request, i) for i in range(len(rows)))
        self._set_depth(self._queued_rows + len(rows))
        self._wake.set()
        try:
            return await asyncio.wait_for(asyncio.shield(request.future), deadline - loop.time())
        except TimeoutError:
            self._drop(request, self.metrics.dropped_deadline)
            raise DeadlineExceeded("request_timeout passed before the model answered") from None
        except asyncio.CancelledError:
            # The handler was cancelled: the client is gone. Its queued rows will be skipped.
            self._drop(request, self.metrics.dropped_client_gone)
            raise

    def _drop(self, request: _Request, counter: Counter) -> None:
        if request.future.done():
            return
        request.future.cancel()
        # Counted only when rows are still queued: those are the compute the drop saves (a
        # request whose rows all ran or are running gets its error, but nothing was dropped).
        if request.queued:
            counter.inc()
        self._forget(request)

    def _forget(self, request: _Request) -> None:
        """Take a finished request's still-queued rows out of the depth count."""
        self._set_depth(self._queued_rows - request.queued)
        request.queued = 0

    def _set_depth(self, rows: int) -> None:
        self._queued_rows = rows
        self.metrics.queue_depth.set(rows)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self._queued_rows == 0:
                self._wake.clear()
                await self._wake.wait()
                continue
            if self.max_wait and self._queued_rows < self.max_batch_size:
                oldest = next((r for r, _ in self._queue if not r.future.done()), None)
                if (
                    oldest is not None
                    and (wait := oldest.enqueued + self.max_wait - loop.time()) > 0
                ):
                    await asyncio.sleep(wait)
            batch = self._next_batch(loop.time())
            if batch:
                self._running = batch
                try:
                    await self._execute(batch, loop.time())
                except Exception:  # a bug here must not kill the worker
                    log.exception("%s: batch failed outside the backend", self.name)
                    self._fail(batch, BackendError("internal error while batching"))
                self._running = []

    def _next_batch(self, now: float) -> list[tuple[_Request, int]]:
        window: list[tuple[_Request, int]] = []
        while self._queue and len(window) < WINDOW_FACTOR * self.max_batch_size:
            request, i = self._queue.popleft()
            if request.future.done():
                continue
            if request.deadline <= now:
                self._forget(request)
                request.future.set_exception(DeadlineExceeded("request_timeout passed in queue"))
                self.metrics.dropped_deadline.inc()
                continue
            window.append((request, i))
        if not window:  # the queue held only finished requests' rows: nothing is queued
            self._set_depth(0)
            return []
        # window[0] is the oldest live row; sorting is stable so ties keep FIFO order.
        order = sorted(range(len(window)), key=lambda k: len(window[k][0].rows[window[k][1]]))
        lengths = [len(window[k][0].rows[window[k][1]]) for k in order]
        lo, hi = grow_batch(
            lengths, order.index(0), self.max_batch_tokens, self.max_batch_size, self.pad_limit
        )
        chosen = set(order[lo:hi])
        self._queue.extendleft(reversed([window[k] for k in range(len(window)) if k not in chosen]))
        return [window[k] for k in order[lo:hi]]

    async def _execute(self, batch: list[tuple[_Request, int]], now: float) -> None:
        for request, _ in batch:
            request.queued -= 1
            if not request.started:
                request.started = True
                self.metrics.queue_wait.observe(now - request.enqueued)
        self._set_depth(self._queued_rows - len(batch))
        rows = [request.rows[i] for request, i in batch]
        feeds = pad(rows, self.pad_token_id)
        size, longest = feeds["input_ids"].shape
        self.metrics.batch_size.observe(size)
        self.metrics.batch_tokens.observe(size * longest)
        log.debug("%s: batch of %d rows x %d tokens", self.name, size, longest)

        start = time.perf_counter()
        try:
            outputs = await asyncio.to_thread(self.backend.run, feeds)
        except Exception as exc:
            log.exception("%s: inference failed on a batch of %d x %d", self.name, size, longest)
            self._fail(batch, BackendError(f"inference failed ({type(exc).__name__}); retry"))
            return
        finally:
            self.metrics.inference.observe(time.perf_counter() - start)

        for k, (request, i) in enumerate(batch):
            if request.future.done():
                continue
            n = len(rows[k])
            request.results[i] = {
                name: value[k, :n] if name in self.sequence_outputs else value[k]
                for name, value in outputs.items()
            }
            request.unfinished -= 1
            if request.unfinished == 0:
                request.future.set_result(request.results)  # type: ignore[arg-type]

    def _fail(self, batch: list[tuple[_Request, int]], error: BackendError) -> None:
        for request, _ in batch:
            if not request.future.done():
                self._forget(request)
                request.future.set_exception(error)
