"""The worker of one model: tokenize, batch, run, answer.

Requests arrive as `Job`s (heads.tasks): texts plus what to do with them. The queue policy
(admission, deadlines, disconnect drops, which rows form the next batch) is service.job_queue;
this module runs it. One worker task per model dispatches, in a loop:

1. encode the texts of every job that arrived since its last look in one `encode_batch` call
   (one `encode` each under SERIAL_BELOW texts) and ask each job for its rows: on the event
   loop when they are short (INLINE_CHARS in all, sparing the hop), else in a thread (the Rust
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
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from heads.rows import InvalidInput, ModelRow, pad
from heads.tasks import Job
from service.errors import BackendError, NotReady
from service.job_queue import JobQueue, Queued, Timing
from service.metrics import ModelMetrics
from service.runtime import Backend

__all__ = ["Batcher", "pad"]

log = logging.getLogger(__name__)

# On CPU a padded position costs as much as a real token, and one more forward pass costs
# little beyond its tokens: a row joins a CPU batch only if it adds at most this many padded
# tokens; the others form the next batch. SST-2 sentences in batches of 16 on 2 cores ran
# 1.7x faster (MiniLM fp32 and int8) and 1.4x / 1.9x (BERT-base fp32 / int8) than padded
# whole; limits of 4 to 16 were within 5% of each other (benchmarks/README.md). On a GPU,
# larger batches win over padding waste: no limit there.
CPU_PAD_LIMIT = 8


def pad_limit(provider: str) -> int | None:
    """The batch padding limit on `provider` ("cpu" or "cuda"): CPU_PAD_LIMIT on a CPU, where
    a padded token costs as much as a real one; none on a GPU, which pads for free."""
    return CPU_PAD_LIMIT if provider == "cpu" else None


# Fewer texts than this are encoded one `encode` call each, not by `encode_batch`: waking the
# tokenizers Rust pool for a few short texts cost more than it saved. SST-2 sentences on a busy
# 2-core EPYC: 2 texts 104 vs 85 us CPU, 4 texts 185 vs 170, 8 texts 357 vs 342, 16 within
# noise.
SERIAL_BELOW = 8
# Jobs that arrive together with at most this many characters in all are tokenized on the
# event loop, whatever the model is doing; larger ones go to a thread. On 2 cores the hop to a
# thread and back (waking it, then the loop) cost about what encoding a few sentences does
# (~40 us a 106-character SST-2 sentence, 0.33 us a character), and while both lanes run the
# thread only takes a core from them: MiniLM int8 served 10-28% more at 8 clients, 0-6% at 32
# and 12% at 4 x 32 sentences than with every job under load in a thread (fp32 +1-4%;
# docs/design.md, "Short requests are tokenized on the event loop"). A larger job (up to ~1.3 ms of
# encoding here) would hold the loop, and every request behind it, longer than a hop costs.
INLINE_CHARS = 4096


def _finite_rows(
    outputs: dict[str, np.ndarray], mask: np.ndarray, sequence_outputs: frozenset[str]
) -> np.ndarray | None:
    """None when every output of the batch is finite (one check per output, the usual case);
    else (B,) bool: row k's outputs are finite on its real tokens (padding may be anything)."""
    if all(np.isfinite(value).all() for value in outputs.values()):
        return None
    ok = np.ones(len(mask), dtype=bool)
    for name, value in outputs.items():
        finite = np.isfinite(value)
        if name in sequence_outputs:  # (B, T, ...): padding positions do not count
            finite = finite.reshape(*value.shape[:2], -1).all(axis=-1) | (mask == 0)
        ok &= finite.reshape(len(value), -1).all(axis=1)
    return ok


# A lane's batch and its outcome: the requests it completed and their answers, or the error.
Finished = tuple[list[tuple[Queued, int]], tuple[list[Queued], list[Any]] | Exception]


class _Pocket:
    """A lane's next batch, handed from the event loop to the lane's thread, which starts it
    the moment its batch ends instead of waiting for the loop to come round. At 32 clients
    (MiniLM int8, 2 cores) the loop, busy with HTTP, took ~1.7 ms a batch to start a lane's
    next one: one of the two lanes stood idle 15% of the time. One slot; the thread takes it
    when its batch ends and closes the pocket if it is empty, and exits: a closed pocket takes
    nothing more (a new thread starts the next batch)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._batch: list[tuple[Queued, int]] | None = None
        self._closed = False

    def put(self, batch: list[tuple[Queued, int]]) -> bool:
        """False when the thread has ended (the pocket is closed)."""
        with self._lock:
            if self._closed:
                return False
            assert self._batch is None, "one batch at a time in a pocket"
            self._batch = batch
            return True

    def take(self) -> list[tuple[Queued, int]] | None:
        """The thread's next batch, or None: then the pocket is closed."""
        with self._lock:
            batch, self._batch = self._batch, None
            self._closed = batch is None
            return batch


class Batcher:
    """The worker of one model over its JobQueue. Create, `start()` inside the event loop,
    `enqueue()` (or `await submit()`) jobs from request handlers, `stop()` at shutdown."""

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
        self.backend = backend
        self.metrics = metrics
        self.tokenizer = tokenizer
        self.sequence_outputs = sequence_outputs
        self.max_batch_size = max_batch_size
        self.max_wait = max_wait_ms / 1000
        self.pad_token_id = pad_token_id
        self.name = name
        self.queue = JobQueue(
            metrics,
            max_batch_tokens=max_batch_tokens,
            max_batch_size=max_batch_size,
            pad_limit=pad_limit(backend.provider),
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
        self._begin_lock = threading.Lock()  # lanes' threads close queue waits (`_begin`)

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
                if sum(len(text) for r in new for text in r.job.texts) <= INLINE_CHARS:
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

    async def _lane(self, batch: list[tuple[Queued, int]], alone: bool) -> None:
        """Run `batch`, then (unless it ran alone) the queue's next batches while there are
        any. The lane's thread runs them back to back: while a batch runs, the next one waits
        in the thread's pocket (`_Pocket`), so neither the thread nor its core waits for the
        event loop, which meanwhile answers the finished batch's requests."""
        lane = asyncio.current_task()
        assert lane is not None
        finished: asyncio.Queue[Finished] = asyncio.Queue()
        running = [batch]  # handed to a thread, not answered yet
        pocket = self._thread(batch, alone, finished)

        def top_up() -> None:
            nonlocal pocket
            if alone or len(running) > 1:
                return
            following = self.queue.next_batch()
            if not following:
                return
            if not pocket.put(following):  # that thread has ended: start another
                pocket = self._thread(following, False, finished)
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

    def _thread(
        self, batch: list[tuple[Queued, int]], alone: bool, finished: asyncio.Queue[Finished]
    ) -> _Pocket:
        """Start a lane's thread on `batch`; it goes on with what the returned pocket is given,
        and posts each batch with its outcome to `finished`."""
        loop = self._loop
        assert loop is not None
        pocket = _Pocket()

        def work(running: list[tuple[Queued, int]] | None) -> None:
            while running is not None:
                outcome: tuple[list[Queued], list[Any]] | Exception
                try:
                    outcome = self._infer(running, alone)
                except Exception as exc:
                    outcome = exc
                ran, running = running, pocket.take()  # before posting: the loop may refill it
                try:
                    loop.call_soon_threadsafe(finished.put_nowait, (ran, outcome))
                except RuntimeError:  # the loop has closed (shutdown): nobody to answer
                    return

        loop.run_in_executor(None, work, batch)
        return pocket

    # -- step 1: texts -> rows -------------------------------------------------------------

    async def _tokenize(self, requests: list[Queued]) -> None:
        start = time.perf_counter()
        self._tokenizing = requests
        try:
            made = await asyncio.to_thread(self._rows_of, [r.job for r in requests])
        except Exception:  # a bug here must not kill the worker
            log.exception("%s: tokenization failed", self.name)
            error = BackendError("internal error while tokenizing")
            made = [error] * len(requests)
        # Not in a `finally`: when stop() cancels the worker here, the requests stay listed,
        # for stop() to fail them with not_ready (else they would wait for their deadline).
        self._tokenizing = []
        self._take_rows(requests, made, start)

    def _tokenize_here(self, requests: list[Queued]) -> None:
        """`_tokenize` on the event loop (see INLINE_CHARS)."""
        start = time.perf_counter()
        try:
            made = self._rows_of([r.job for r in requests])
        except Exception:  # a bug here must not kill the worker
            log.exception("%s: tokenization failed", self.name)
            made = [BackendError("internal error while tokenizing")] * len(requests)
        self._take_rows(requests, made, start)

    def _take_rows(
        self, requests: list[Queued], made: list[list[ModelRow] | Exception], start: float
    ) -> None:
        seconds = time.perf_counter() - start
        self.metrics.tokenization.observe(seconds)
        truncated = windowed = 0
        for request, rows in zip(requests, made, strict=True):
            request.timing.tokenization += seconds
            if request.future.done():  # gone or expired meanwhile
                continue
            if isinstance(rows, Exception):
                self.queue.fail(request, rows)
                continue
            truncated += request.job.truncated
            windowed += request.job.windowed
            self.queue.add_rows(request, rows)
            if not rows:
                self._answer([request], [request.job.answer([])])
        if truncated:
            self.metrics.truncated.inc(truncated)
        if windowed:
            self.metrics.windowed.inc(windowed)

    def _rows_of(self, jobs: list[Job]) -> list[list[ModelRow] | Exception]:
        """Every job's texts in one encoder call, then each job's rows (on the loop or in a
        thread)."""
        texts = [text for job in jobs for text in job.texts]
        encodings = []
        if texts:
            assert self.tokenizer is not None, "a batcher that takes texts needs the tokenizer"
            if len(texts) < SERIAL_BELOW:
                encode = self.tokenizer.encode
                encodings = [encode(text, add_special_tokens=False) for text in texts]
            else:
                encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        out: list[list[ModelRow] | Exception] = []
        at = 0
        for job in jobs:
            n = len(job.texts)
            try:
                out.append(job.rows(self.tokenizer, encodings[at : at + n]))
            except InvalidInput as exc:
                out.append(exc)
            at += n
        return out

    # -- step 3: run it, and answer the requests it completes ------------------------------

    def _begin(self, batch: list[tuple[Queued, int]]) -> None:
        """In the lane's thread, as the batch starts: close its requests' queue wait."""
        now = time.perf_counter()
        starting: list[Queued] = []
        with self._begin_lock:  # a request's rows may start in two lanes at once
            for request, _ in batch:  # once per request, however many of its rows are here
                if not request.started:
                    request.started = True
                    starting.append(request)
        for request in starting:
            waited = now - request.queued_at
            self.metrics.queue_wait.observe(waited)
            # the header's queue time leaves out the tokenization it waited through
            request.timing.queue = max(0.0, waited - request.timing.tokenization)

    def _infer(
        self, batch: list[tuple[Queued, int]], alone: bool
    ) -> tuple[list[Queued], list[Any]]:
        """In a thread: pad, run, slice each row's outputs; the answers of the requests whose
        last row this was (an exception in place of an answer fails only its request)."""
        self._begin(batch)
        rows = [request.rows[i] for request, i in batch]
        feeds = pad(rows, self.pad_token_id)
        size, longest = feeds["input_ids"].shape
        self.metrics.batch_size.observe(size)
        self.metrics.batch_tokens.observe(size * longest)
        start = time.perf_counter()
        try:
            outputs = self.backend.run(feeds, alone)
        except Exception:
            log.exception("%s: inference failed on a batch of %d x %d", self.name, size, longest)
            raise
        finally:
            seconds = time.perf_counter() - start
            self.metrics.inference.observe(seconds)
            for request in {r for r, _ in batch}:  # once per job, not once per row
                timing = request.timing
                timing.inference += seconds
                timing.batches += 1
                timing.batch_rows += size
                timing.batch_tokens += size * longest
        start = time.perf_counter()
        finite = _finite_rows(outputs, feeds["attention_mask"], self.sequence_outputs)
        done: list[Queued] = []
        for k, (request, i) in enumerate(batch):
            n = len(rows[k])
            request.results[i] = {
                name: value[k, :n] if name in self.sequence_outputs else value[k]
                for name, value in outputs.items()
            }
            if finite is not None and not finite[k]:
                request.nonfinite = True
            request.unfinished -= 1
            if request.unfinished == 0:
                done.append(request)
        answers = self._answers(done)
        if done:
            self.metrics.postprocess.observe(time.perf_counter() - start)
        return done, answers

    def _answers(self, done: list[Queued]) -> list[Any]:
        """The answers of `done`, in order. Jobs of one class answer together (`answer_many`:
        one softmax or normalisation over all their rows, where the task has one); an
        exception there falls back to one job at a time, so it fails only the job that raises
        it."""
        answers: list[Any] = [None] * len(done)
        groups: dict[type[Job], list[int]] = {}
        for k, request in enumerate(done):
            if request.nonfinite:
                answers[k] = BackendError(
                    "the model produced a NaN or infinite value for this input"
                )
            else:
                groups.setdefault(type(request.job), []).append(k)
        for cls, ks in groups.items():
            if len(ks) > 1:
                try:
                    jobs, results = [done[k].job for k in ks], [done[k].results for k in ks]
                    together = cls.answer_many(jobs, results)  # type: ignore[arg-type]
                except Exception:  # retried one by one below, to find the job that fails
                    pass
                else:
                    for k, answer in zip(ks, together, strict=True):
                        answers[k] = answer
                    continue
            for k in ks:
                answers[k] = self._answer_of(done[k])
        return answers

    def _answer_of(self, request: Queued) -> Any:
        try:
            return request.job.answer(request.results)  # type: ignore[arg-type]
        except InvalidInput as exc:
            return exc
        except Exception as exc:  # a bug in one job's post-processing fails only that job
            log.exception("%s: post-processing failed", self.name)
            return BackendError(f"post-processing failed ({type(exc).__name__})")

    def _answer(self, requests: list[Queued], answers: list[Any]) -> None:
        for request, answer in zip(requests, answers, strict=True):
            if request.future.done():
                continue
            if isinstance(answer, Exception):
                request.future.set_exception(answer)
            else:
                request.future.set_result(answer)

    def _fail(self, batch: list[tuple[Queued, int]], error: BackendError) -> None:
        for request, _ in batch:
            self.queue.fail(request, error)
