"""The inference stage of a model's worker: a batch run in a lane's thread (pad, run the
backend, hand each row its slice of the outputs, answer the requests it completed), and the
pocket that hands the thread its next batch while one runs."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import numpy as np

from heads.adapters import ADAPTER_INPUT
from heads.rows import pad
from service.job_queue import Queued
from service.metrics import ModelMetrics
from service.runtime import Backend
from service.stages import answer

log = logging.getLogger("service.batcher")  # one logger for the worker, whichever stage

# On CPU a padded position costs as much as a real token, and one more forward pass costs
# little beyond its tokens: a row joins a CPU batch only if it adds at most this many padded
# tokens; the others form the next batch. SST-2 sentences in batches of 16 on 2 cores ran
# 1.7x faster (MiniLM fp32 and int8) and 1.4x / 1.9x (BERT-base fp32 / int8) than padded
# whole; limits of 4 to 16 were within 5% of each other (benchmarks/README.md). On a GPU,
# larger batches win over padding waste: no limit there.
CPU_PAD_LIMIT = 8

# A batch: each of its rows as (its request, the row's index in the request's rows).
Batch = list[tuple[Queued, int]]
# A batch run and its outcome: the requests it completed and their answers, or the error.
Finished = tuple[Batch, tuple[list[Queued], list[Any]] | Exception]


def pad_limit(provider: str) -> int | None:
    """The batch padding limit on `provider` ("cpu" or "cuda"): CPU_PAD_LIMIT on a CPU, where
    a padded token costs as much as a real one; none on a GPU, which pads for free."""
    return CPU_PAD_LIMIT if provider == "cpu" else None


def finite_rows(
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


class Pocket:
    """A lane's next batch, handed from the event loop to the lane's thread, which starts it
    the moment its batch ends instead of waiting for the loop to come round. At 32 clients
    (MiniLM int8, 2 cores) the loop, busy with HTTP, took ~1.7 ms a batch to start a lane's
    next one: one of the two lanes stood idle 15% of the time. One slot; the thread takes it
    when its batch ends and closes the pocket if it is empty, and exits: a closed pocket takes
    nothing more (a new thread starts the next batch)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._batch: Batch | None = None
        self._closed = False

    def put(self, batch: Batch) -> bool:
        """False when the thread has ended (the pocket is closed)."""
        with self._lock:
            if self._closed:
                return False
            assert self._batch is None, "one batch at a time in a pocket"
            self._batch = batch
            return True

    def take(self) -> Batch | None:
        """The thread's next batch, or None: then the pocket is closed."""
        with self._lock:
            batch, self._batch = self._batch, None
            self._closed = batch is None
            return batch


class Runner:
    """Runs one model's batches in lanes' threads: `thread` starts one on a batch, `run` is
    what it does with each."""

    def __init__(
        self,
        backend: Backend,
        metrics: ModelMetrics,
        sequence_outputs: frozenset[str],
        pad_token_id: int,
        name: str,
    ) -> None:
        self.backend, self.metrics, self.name = backend, metrics, name
        self.sequence_outputs, self.pad_token_id = sequence_outputs, pad_token_id
        self._begin_lock = threading.Lock()  # lanes' threads close queue waits (`_begin`)

    def thread(
        self,
        loop: asyncio.AbstractEventLoop,
        batch: Batch,
        alone: bool,
        finished: asyncio.Queue[Finished],
    ) -> Pocket:
        """Start a lane's thread on `batch`; it goes on with what the returned pocket is given,
        and posts each batch with its outcome to `finished`."""
        pocket = Pocket()

        def work(running: Batch | None) -> None:
            while running is not None:
                outcome: tuple[list[Queued], list[Any]] | Exception
                try:
                    outcome = self.run(running, alone)
                except Exception as exc:
                    outcome = exc
                ran, running = running, pocket.take()  # before posting: the loop may refill it
                try:
                    loop.call_soon_threadsafe(finished.put_nowait, (ran, outcome))
                except RuntimeError:  # the loop has closed (shutdown): nobody to answer
                    return

        loop.run_in_executor(None, work, batch)
        return pocket

    def run(self, batch: Batch, alone: bool) -> tuple[list[Queued], list[Any]]:
        """In a thread: pad, run, slice each row's outputs; the answers of the requests whose
        last row this was (an exception in place of an answer fails only its request)."""
        self._begin(batch)
        rows = [request.rows[i] for request, i in batch]
        feeds = pad(rows, self.pad_token_id)
        # an encoder's batch: each row's LoRA adapter (heads.adapters; None: the encoder's own)
        adapters = [getattr(request.job, "adapter", None) for request, _ in batch]
        if any(a is not None for a in adapters):
            feeds[ADAPTER_INPUT] = np.array(adapters, dtype=object)
        size, longest = feeds["input_ids"].shape
        self.metrics.batch_size.observe(size)
        self.metrics.batch_tokens.observe(size * longest)
        start = time.perf_counter()
        # the outputs a session hands back only when asked (runtime.ON_REQUEST) that a job reads
        wants = frozenset(w for request, _ in batch for w in getattr(request.job, "wants", ()))
        run = self.backend.run
        try:
            outputs = run(feeds, alone, wants) if wants else run(feeds, alone)
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
        finite = finite_rows(outputs, feeds["attention_mask"], self.sequence_outputs)
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
        answers = answer.answers(done, self.name)
        if done:
            self.metrics.postprocess.observe(time.perf_counter() - start)
        return done, answers

    def _begin(self, batch: Batch) -> None:
        """As the batch starts: close its requests' queue wait."""
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
