"""The worker of one model: tokenize, batch, run, answer.

Requests arrive as `Job`s (heads.tasks): texts plus what to do with them. Each stage is a
module of its own (service.stages): the queue policy (admission, deadlines, disconnect drops,
which rows form the next batch) is service.job_queue, texts -> rows service.stages.encode, a
batch in a lane's thread service.stages.infer, the answers service.stages.answer; this module
is the worker that runs them and owns what is in flight. One worker task per model
dispatches, in a loop:

1. encode the texts of every job that arrived since its last look in one `encode_batch` call
   (one `encode` each under SERIAL_BELOW texts) and ask each job for its rows: on the event
   loop when they are short (encode.INLINE_CHARS in all, sparing the hop), else in a thread (the Rust
   encoder runs without the GIL), which overlaps the batches running; when the model is idle,
   they come first;
2. take a window of the oldest queued rows (FIFO), skipping rows of requests that are already
   finished: cancelled because the client went away, past their deadline, or failed;
3. sort the window by length and grow a batch around the oldest row, first with shorter rows
   (free: the padded length stays), then longer ones, while rows x longest <= max_batch_tokens
   and rows <= max_batch_size; on CPU, where padding costs as much as tokens, only rows that add
   at most CPU_PAD_LIMIT padded tokens. Similar lengths share a batch, so little compute goes to
   padding, and the oldest row always goes, so no request starves;
4. in one thread hop: pad, run the backend, hand each row its slice of the outputs, and ask
   each job whose last row this was for its answer. The event loop meanwhile only accepts
   requests and writes answers.

A backend with lanes (service.runtime.OrtBackend on CPU) runs up to `lanes` batches at once,
each a lane task with its own thread; while a lane's batch runs, the lane takes the queue's
next batch and puts it in the thread's pocket, and the thread starts it as the first ends,
before the event loop answers the finished batch's requests. A batch that is the only work
(no other lane, nothing queued or being encoded) runs "alone", with every thread of the
backend, and no lane starts beside it.

A request's rows may land in different batches; it completes when its last row does. A backend
exception fails the requests of that batch only (BackendError) and the worker carries on.
Metrics are written once per tokenizer call and once per batch, not per request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from tokenizers import Tokenizer

from heads.rows import pad
from heads.tasks import Job
from service.errors import BackendError, NotReady
from service.job_queue import JobQueue, Queued, Timing
from service.metrics import ModelMetrics
from service.runtime import Backend
from service.stages import answer, encode, infer
from service.stages.infer import Batch

__all__ = ["Batcher", "pad"]

log = logging.getLogger(__name__)


class Batcher:
    """The worker of one model over its JobQueue. Create, `start()` inside the event loop,
    `enqueue()` jobs from request handlers, `stop()` at shutdown."""

    def __init__(
        self,
        backend: Backend,
        metrics: ModelMetrics,
        *,
        tokenizer: Tokenizer | None = None,
        sequence_outputs: frozenset[str],
        max_batch_tokens: int,
        max_batch_size: int,
        max_wait_ms: float = 0.0,
        pad_token_id: int = 0,
        name: str = "model",
    ) -> None:
        self.metrics = metrics
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.max_wait = max_wait_ms / 1000
        self.name = name
        self.runner = infer.Runner(backend, metrics, sequence_outputs, pad_token_id, name)
        self.queue = JobQueue(
            metrics,
            max_batch_tokens=max_batch_tokens,
            max_batch_size=max_batch_size,
            pad_limit=infer.pad_limit(backend.provider),
        )
        self._worker: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tokenizing: list[Queued] = []  # requests in the encoder's thread now
        self._encoding = False  # an encoder call is running in its thread
        # how many batches may run at once, each in its own thread (the backend's lanes)
        self.lanes = backend.lanes
        self._lanes: dict[asyncio.Task[None], list[Queued]] = {}  # running batch -> its requests
        self._top_ups: dict[asyncio.Task[None], Callable[[], None]] = {}  # fill a lane's pocket
        self._alone_running = False  # the running batch has every core: start no other

    @property
    def backend(self) -> Backend:
        """What runs its batches (the runner's: one owner)."""
        return self.runner.backend

    @backend.setter
    def backend(self, backend: Backend) -> None:
        self.runner.backend = backend

    def start(self) -> None:
        # Kept: asyncio.get_running_loop() makes a getpid() system call on every call.
        self._loop = asyncio.get_running_loop()
        self._worker = asyncio.create_task(self._run(), name=f"batcher-{self.name}")

    @property
    def alive(self) -> bool:
        """False once the worker has ended other than by stop(): nothing would run the queue."""
        return self._worker is not None and not self._worker.done()

    @property
    def idle(self) -> bool:
        """Every job it was given has its answer (or error)."""
        return self.queue.unanswered == 0

    async def stop(self) -> None:
        """Stop the worker; requests still queued get 503 not_ready."""
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
            self._worker = None
        self.queue.close([*self._running, *self._tokenizing])
        self._tokenizing = []
        lanes = list(self._lanes)  # their threads finish on their own; nothing is answered
        for lane in lanes:
            lane.cancel()
        await asyncio.gather(*lanes, return_exceptions=True)

    def enqueue(
        self, job: Job, deadline: float, timing: Timing | None = None, alone: bool = False
    ) -> asyncio.Future[Any]:
        """Queue `job`; the future gets its answer, or raises DeadlineExceeded when `deadline`
        (event loop clock) passes first, InvalidInput when the job's texts cannot make rows,
        BackendError when a batch holding one of its rows failed. Cancelling the future drops
        the job: its rows still queued never run (counted as client_gone). `timing` gets the
        job's queue, tokenization and inference seconds; `alone`: its rows share a batch with
        no other job's (JobQueue.next_batch)."""
        loop = self._loop
        if self._worker is None or loop is None:
            raise NotReady(f"model {self.name} is not running")
        return self.queue.put(job, deadline, loop, timing, alone).future

    async def _run(self) -> None:
        """Dispatch until stopped: tokenize what arrived (one encoder call at a time), start
        batches while a lane is free, then sleep until a job arrives or a lane or the encoder
        finishes (each sets `queue.arrived`)."""
        loop = asyncio.get_running_loop()
        queue = self.queue
        wake = queue.arrived
        while True:
            wake.clear()
            if not self._encoding and (new := queue.take_new()):
                if encode.short(new):
                    self._tokenize_here(new)
                elif not self._lanes and queue.oldest() is None:
                    # idle model: these rows are the next batch; encode them first
                    await self._tokenize(new)
                else:  # overlaps the batches running
                    self._encoding = True
                    self._spawn(self._tokenize(new), encoder=True)
            if self.max_wait and not self._lanes and queue.depth < self.max_batch_size:
                oldest = queue.oldest()
                if oldest is not None and (at := oldest.enqueued + self.max_wait) > loop.time():
                    loop.call_at(at, wake.set)
                    await wake.wait()
                    continue
            while len(self._lanes) < self.lanes and not self._alone_running:
                batch = queue.next_batch()
                if not batch:
                    break
                # the only work: a backend with lanes may give it every core
                alone = not self._lanes and queue.depth == 0 and not self._encoding
                self._alone_running = alone
                lane = self._spawn(self._lane(batch, alone))
                self._lanes[lane] = [r for r, _ in batch]
            for top_up in list(self._top_ups.values()):  # rows encoded while the lanes ran
                top_up()
            if not wake.is_set():
                await wake.wait()

    def _spawn(self, step: Any, encoder: bool = False) -> asyncio.Task[None]:
        task = asyncio.create_task(step)
        task.add_done_callback(self._encoded if encoder else self._lane_done)
        return task

    def _encoded(self, _: asyncio.Task[None]) -> None:
        self._encoding = False
        self.queue.arrived.set()

    def _lane_done(self, task: asyncio.Task[None]) -> None:
        self._lanes.pop(task, None)
        self._alone_running = False
        self.queue.arrived.set()

    @property
    def _running(self) -> list[Queued]:
        return [r for requests in self._lanes.values() for r in requests]

    async def _lane(self, batch: Batch, alone: bool) -> None:
        """Run `batch`, then (unless it ran alone) the queue's next batches while there are
        any. The lane's thread runs them back to back: while a batch runs, the next one waits
        in the thread's pocket (`infer.Pocket`), so neither the thread nor its core waits for the
        event loop, which meanwhile answers the finished batch's requests."""
        lane, loop = asyncio.current_task(), self._loop
        assert lane is not None and loop is not None
        finished: asyncio.Queue[infer.Finished] = asyncio.Queue()
        running = [batch]  # handed to a thread, not answered yet
        pocket = self.runner.thread(loop, batch, alone, finished)

        def top_up() -> None:
            nonlocal pocket
            if alone or len(running) > 1:
                return
            following = self.queue.next_batch()
            if not following:
                return
            if not pocket.put(following):  # that thread has ended: start another
                pocket = self.runner.thread(loop, following, False, finished)
            running.append(following)
            self._lanes[lane] = [r for b in running for r, _ in b]

        top_up()
        self._top_ups[lane] = top_up  # and the worker, when rows arrive meanwhile
        try:
            while running:
                ran, result = await finished.get()
                running[:] = [b for b in running if b is not ran]
                top_up()
                self._lanes[lane] = [r for b in running for r, _ in b]
                if isinstance(result, Exception):
                    error = BackendError(f"inference failed ({type(result).__name__}); retry")
                    self._fail(ran, error)
                    continue
                try:
                    self._answer(*result)
                except Exception:  # a bug here must not kill the lane
                    log.exception("%s: batch failed outside the backend", self.name)
                    self._fail(ran, BackendError("internal error while batching"))
        finally:
            self._top_ups.pop(lane, None)

    # -- step 1: texts -> rows -------------------------------------------------------------

    async def _tokenize(self, requests: list[Queued]) -> None:
        start = time.perf_counter()
        self._tokenizing = requests
        made = await asyncio.to_thread(encode.encode, self.tokenizer, requests, self.name)
        # Not in a `finally`: when stop() cancels the worker here, the requests stay listed,
        # for stop() to fail them with not_ready (else they would wait for their deadline).
        self._tokenizing = []
        encode.hand_out(self.queue, self.metrics, requests, made, time.perf_counter() - start)

    def _tokenize_here(self, requests: list[Queued]) -> None:
        """`_tokenize` on the event loop (see encode.INLINE_CHARS)."""
        start = time.perf_counter()
        made = encode.encode(self.tokenizer, requests, self.name)
        encode.hand_out(self.queue, self.metrics, requests, made, time.perf_counter() - start)

    # -- step 3: answers, or the batch's failure --------------------------------------------

    _answer = staticmethod(answer.deliver)

    def _fail(self, batch: Batch, error: BackendError) -> None:
        for request, _ in batch:
            self.queue.fail(request, error)
