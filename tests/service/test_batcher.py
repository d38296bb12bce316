"""The batcher against a fake backend that records every batch: budgets, grouping by length,
split requests, drops before compute, deadlines, failures that stay in their batch, lanes and
their pockets, start and stop, and what each request's timing and the metrics record; the
queue's own accounting (service.job_queue) beside."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from heads.rows import InvalidInput, ModelRow, Outputs
from service.batcher import Batcher, pad
from service.errors import BackendError, DeadlineExceeded, NotReady, Overloaded
from service.job_queue import WINDOW_FACTOR, Admission, JobQueue, Timing, grow_batch, next_batch
from service.metrics import Metrics
from service.stages.encode import INLINE_CHARS, SERIAL_BELOW

pytestmark = pytest.mark.anyio


def seq(length: int, first_id: int = 1) -> ModelRow:
    """A row of `length` tokens whose ids start at first_id (so rows can be told apart)."""
    return ModelRow(
        np.arange(first_id, first_id + length, dtype=np.int64), np.zeros(length, dtype=np.int64)
    )


class FakeBackend:
    """Outputs: `tokens` (B, T) = the ids (a sequence output), `total` (B,) = sum of real ids.
    `gate` holds the first batch until released; `fail_on` fails a batch containing that id."""

    provider = "cpu"
    lanes = 1

    def __init__(self, fail_on: int | None = None, hold_first: bool = False) -> None:
        self.batches: list[np.ndarray] = []
        self.fail_on = fail_on
        self.gate = threading.Event()
        self.entered = threading.Event()
        if not hold_first:
            self.gate.set()

    def run(self, feeds: Mapping[str, np.ndarray], alone: bool = True) -> dict[str, np.ndarray]:
        self.entered.set()
        self.gate.wait(10)
        ids, mask = feeds["input_ids"], feeds["attention_mask"]
        self.batches.append(ids)
        if self.fail_on is not None and (ids == self.fail_on).any():
            raise RuntimeError("ORT says no")
        return {"tokens": ids.astype(np.float32), "total": (ids * mask).sum(-1).astype(np.float32)}

    def ran(self, first_id: int) -> bool:
        return any((b[:, 0] == first_id).any() for b in self.batches)


def make(
    backend: FakeBackend, sequence_outputs: frozenset[str] = frozenset({"tokens"}), **limits: float
) -> tuple[Batcher, Metrics]:
    metrics = Metrics()
    batcher = Batcher(
        backend,
        metrics.add_model("m", "token-classification"),
        sequence_outputs=sequence_outputs,
        max_batch_tokens=int(limits.get("tokens", 1000)),
        max_batch_size=int(limits.get("size", 64)),
        max_wait_ms=limits.get("wait_ms", 0),
        pad_token_id=int(limits.get("pad_id", 0)),
        name="m",
    )
    batcher.start()
    return batcher, metrics


class Rows:
    """A job whose rows are made already: no texts to encode, its answer the rows' outputs."""

    texts: list[str] = []
    truncated = windowed = 0

    def __init__(self, rows: list[ModelRow]) -> None:
        self._rows = rows

    def rows(self, tokenizer: object, encodings: list[object]) -> list[ModelRow]:
        return self._rows

    def answer(self, outputs: list[Outputs]) -> list[Outputs]:
        return outputs


async def submit(batcher: Batcher, rows: list[ModelRow], deadline: float) -> Any:
    """The rows' outputs, in order (a coroutine: a task enqueues when it first runs)."""
    return await batcher.enqueue(Rows(rows), deadline)


def deadline(seconds: float = 10) -> float:
    return asyncio.get_running_loop().time() + seconds


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(
        name, {"model": "m", "task": "token-classification", **labels}
    )
    return value or 0.0


def test_grow_batch_takes_shorter_rows_first_and_respects_budgets() -> None:
    lengths = [2, 3, 5, 8, 13]
    assert grow_batch(lengths, seed=2, max_tokens=20, max_size=10) == (0, 3)  # 3 x 5 = 15
    assert grow_batch(lengths, seed=2, max_tokens=100, max_size=10) == (0, 5)
    assert grow_batch(lengths, seed=2, max_tokens=100, max_size=2) == (1, 3)
    assert grow_batch(lengths, seed=4, max_tokens=5, max_size=10) == (4, 5)  # alone, over budget


def test_grow_batch_with_a_pad_limit_keeps_padding_per_row_under_it() -> None:
    lengths = [5, 6, 7, 20, 21, 40]
    assert grow_batch(lengths, seed=1, max_tokens=1000, max_size=10, pad_limit=8) == (0, 3)
    assert grow_batch(lengths, seed=3, max_tokens=1000, max_size=10, pad_limit=8) == (3, 5)
    assert grow_batch(lengths, seed=5, max_tokens=1000, max_size=10, pad_limit=8) == (5, 6)
    assert grow_batch(lengths, seed=1, max_tokens=1000, max_size=10) == (0, 6)  # GPU: no limit
    # a shorter row joins on its own padding, whatever the rows below it would add
    assert grow_batch([1, 10, 12], seed=2, max_tokens=1000, max_size=10, pad_limit=8) == (1, 3)
    # padding of exactly the limit joins, from below and from above
    assert grow_batch([2, 10], seed=1, max_tokens=1000, max_size=10, pad_limit=8) == (0, 2)
    assert grow_batch([2, 10], seed=0, max_tokens=1000, max_size=10, pad_limit=8) == (0, 2)
    # a batch that cannot grow down grows up: by its own size, and by the padding the longer
    # row adds to each row already in (4 to one row here)
    assert grow_batch([1, 20, 24], seed=1, max_tokens=1000, max_size=2, pad_limit=5) == (1, 3)


def test_next_batch_grows_around_the_oldest_row_shortest_first() -> None:
    # arrival order: the oldest (10 tokens) goes, with its near lengths; 30 would pad too much
    assert next_batch([10, 3, 4, 30, 11], 1000, 64, pad_limit=8) == [1, 2, 0, 4]
    assert next_batch([30, 3, 4], 1000, 64, pad_limit=8) == [0]  # never starved


def test_pad_masks_and_pads_with_zeros() -> None:
    feeds = pad([seq(3, 5), ModelRow(np.array([7], dtype=np.int64), np.array([1], dtype=np.int64))])
    assert feeds["input_ids"].tolist() == [[5, 6, 7], [7, 0, 0]]
    assert feeds["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert feeds["token_type_ids"].tolist() == [[0, 0, 0], [1, 0, 0]]
    assert all(v.dtype == np.int64 for v in feeds.values())


def queue_of(max_batch_size: int, pad_limit: int | None = None) -> tuple[JobQueue, Metrics]:
    metrics = Metrics()
    queue = JobQueue(
        metrics.add_model("m", "token-classification"),
        max_batch_tokens=1000,
        max_batch_size=max_batch_size,
        pad_limit=pad_limit,
    )
    return queue, metrics


async def test_the_depth_counts_unencoded_jobs_and_the_queued_rows_of_live_ones() -> None:
    """What the queue depth gauge reads at every step, and what a cancel counts as dropped:
    only a request with rows still queued saves compute when its client goes away."""
    queue, metrics = queue_of(max_batch_size=2)
    loop = asyncio.get_running_loop()
    assert queue.depth == 0 and sample(metrics, "bert_heads_queue_depth") == 0
    a, b = queue.put(Rows([]), deadline(), loop), queue.put(Rows([]), deadline(), loop)
    assert queue.depth == 2  # one per job not encoded yet
    assert queue.take_new() == [a, b]
    queue.add_rows(a, [seq(3, 10 * k) for k in range(1, 5)])
    queue.add_rows(b, [seq(3, 50)])
    assert sample(metrics, "bert_heads_queue_depth") == 5
    assert queue.next_batch() == [(a, 0), (a, 1)]  # equal lengths: first come, first in
    assert queue.depth == 3
    a.future.cancel()  # the client went away with two rows queued
    await asyncio.sleep(0)  # done callbacks run on the loop
    assert queue.depth == 1
    assert sample(metrics, "bert_heads_dropped_requests_total", reason="client_gone") == 1
    c = queue.put(Rows([]), deadline(), loop)
    assert queue.next_batch() == [(b, 0)]  # a's rows are skipped, c is not encoded yet
    assert queue.depth == 1
    assert queue.next_batch() == [] and queue.depth == 1  # nothing to run; c still counts
    b.future.cancel()  # every row of b is running: cancelling it saves nothing
    c.future.set_result(None)
    await asyncio.sleep(0)
    assert sample(metrics, "bert_heads_dropped_requests_total", reason="client_gone") == 1
    assert queue.take_new() == [] and queue.next_batch() == [] and queue.depth == 0
    # a finished request's deadline timer is cancelled: the loop does not keep it until then
    assert all(r.timer is not None and r.timer.cancelled() for r in (a, b, c))


async def test_a_batch_is_chosen_among_the_oldest_rows_only() -> None:
    """The builder looks at WINDOW_FACTOR x max_batch_size rows, and puts the ones it leaves
    back in front, in order."""
    queue, _ = queue_of(max_batch_size=2, pad_limit=8)
    request = queue.put(Rows([]), deadline(), asyncio.get_running_loop())
    queue.take_new()
    window = WINDOW_FACTOR * 2
    lengths = [10] + [50] * (window - 1) + [10]  # the second 10 is just outside the window
    queue.add_rows(request, [seq(n, 100 * k) for k, n in enumerate(lengths)])
    assert queue.next_batch() == [(request, 0)]  # no row in the window within 8 pads of it
    assert queue.next_batch() == [(request, 1), (request, 2)]
    assert queue.depth == len(lengths) - 3
    request.future.cancel()


async def test_the_rows_of_a_job_queued_alone_share_batches_only_with_each_other() -> None:
    """Its rows are kept apart from the window of an older job (and count towards its
    room), and no other job's row joins its batches."""
    queue, _ = queue_of(max_batch_size=2)
    loop = asyncio.get_running_loop()
    a = queue.put(Rows([]), deadline(), loop)
    b = queue.put(Rows([]), deadline(), loop, alone=True)
    c = queue.put(Rows([]), deadline(), loop)
    queue.take_new()
    for request, n in ((a, 1), (b, 7), (c, 1)):  # rows of one length: FIFO
        queue.add_rows(request, [seq(3, k) for k in range(n)])
    batches = [queue.next_batch() for _ in range(7)]
    assert batches == [
        [(a, 0)],  # a's window: a's row and 7 of b's kept apart, 8 rows in all
        [(b, 0), (b, 1)],
        [(b, 2), (b, 3)],
        [(b, 4), (b, 5)],
        [(b, 6)],  # c's row stays out of b's batches
        [(c, 0)],
        [],
    ]


async def test_outputs_come_back_per_row_with_padding_cut() -> None:
    backend = FakeBackend()
    batcher, _ = make(backend, pad_id=7)
    rows = [seq(4, 10), seq(2, 20), seq(6, 30)]
    outputs = await submit(batcher, rows, deadline())
    [batch] = backend.batches  # padded with the model's pad id
    assert batch.tolist() == [[20, 21, 7, 7, 7, 7], [10, 11, 12, 13, 7, 7], list(range(30, 36))]
    for row, out in zip(rows, outputs, strict=True):
        assert out["tokens"].tolist() == row.input_ids.tolist()  # sequence axis cut to the row
        assert out["total"].shape == () and out["total"] == row.input_ids.sum()
    await batcher.stop()


async def test_a_batcher_takes_jobs_only_while_its_worker_runs() -> None:
    batcher = Batcher(
        FakeBackend(),
        Metrics().add_model("m", "token-classification"),
        sequence_outputs=frozenset(),
        max_batch_tokens=100,
        max_batch_size=4,
        name="m",
    )
    assert not batcher.alive
    with pytest.raises(NotReady, match="model m is not running"):
        batcher.enqueue(Rows([seq(3)]), deadline())
    before = asyncio.all_tasks()
    batcher.start()
    assert batcher.alive
    assert [t.get_name() for t in asyncio.all_tasks() - before] == ["batcher-m"]
    assert (await batcher.enqueue(Rows([seq(3, 1)]), deadline()))[0]["total"] == 6
    await asyncio.sleep(0.01)  # idle again: its lane has ended
    await batcher.stop()
    assert not batcher.alive
    assert asyncio.all_tasks() <= before  # stop() returns once its worker has ended
    with pytest.raises(NotReady, match="model m is not running"):
        batcher.enqueue(Rows([seq(3)]), deadline())
    await batcher.stop()  # a second stop is harmless


def stage(metrics: Metrics, name: str, stat: str) -> float:
    return sample(metrics, f"bert_heads_stage_duration_seconds_{stat}", stage=name)


async def test_the_callers_timing_and_the_metrics_add_up_over_its_batches() -> None:
    """One request alone, its rows in two batches: its timing holds both batches, and says
    what the stage metrics say (each batch observed once, its queue wait once)."""
    backend = FakeBackend()
    batcher, metrics = make(backend, tokens=12, size=4)
    timing = Timing()
    start = time.perf_counter()
    # rows of 3, 2 and 6 tokens under a 12-token budget: (3, 2) pad to 2 x 3, then 6 alone
    await batcher.enqueue(Rows([seq(3, 1), seq(2, 10), seq(6, 20)]), deadline(), timing)
    elapsed = time.perf_counter() - start
    stages = (timing.queue, timing.tokenization, timing.inference)
    assert all(0 <= t < elapsed for t in stages) and sum(stages) < elapsed
    assert [b.shape for b in backend.batches] == [(2, 3), (1, 6)]
    assert (timing.batches, timing.batch_rows, timing.batch_tokens) == (2, 3, 12)
    assert sample(metrics, "bert_heads_batch_size_count") == 2
    assert sample(metrics, "bert_heads_batch_size_sum") == 3
    assert sample(metrics, "bert_heads_batch_tokens_sum") == 12
    assert stage(metrics, "inference", "count") == 2
    assert timing.inference == pytest.approx(stage(metrics, "inference", "sum"), rel=1e-9)
    assert timing.inference > 0
    assert stage(metrics, "tokenization", "count") == 1
    assert timing.tokenization == pytest.approx(stage(metrics, "tokenization", "sum"), rel=1e-9)
    assert stage(metrics, "queue_wait", "count") == 1  # at its first batch only
    waited = stage(metrics, "queue_wait", "sum")
    assert timing.queue == pytest.approx(max(0.0, waited - timing.tokenization), abs=1e-12)
    assert stage(metrics, "postprocess", "count") == 1  # only the batch that completed it
    assert 0 < stage(metrics, "postprocess", "sum") < elapsed
    await batcher.stop()


async def test_concurrent_requests_share_batches_within_budgets() -> None:
    backend = FakeBackend(hold_first=True)
    batcher, metrics = make(backend, tokens=64, size=8)
    first = asyncio.create_task(submit(batcher, [seq(3, 1000)], deadline()))
    await asyncio.to_thread(backend.entered.wait, 5)  # the worker is busy with `first`
    lengths = [3, 9, 4, 8, 5, 7, 6, 16, 2, 3] * 3
    tasks = [
        asyncio.create_task(submit(batcher, [seq(n, 100 * i)], deadline()))
        for i, n in enumerate(lengths)
    ]
    await asyncio.sleep(0.05)
    backend.gate.set()
    results = await asyncio.gather(first, *tasks)
    for (out,), n in zip(results[1:], lengths, strict=True):
        assert len(out["tokens"]) == n
    later = backend.batches[1:]
    assert len(later) < len(lengths), "queued requests were batched together"
    for batch in later:
        assert batch.shape[0] <= 8 and (batch.shape[0] == 1 or batch.size <= 64)
    assert sample(metrics, "bert_heads_batch_size_count") == len(backend.batches)
    await batcher.stop()


async def test_a_job_enqueued_alone_gets_batches_of_its_own() -> None:
    """The offline batch command's calls (`alone`): the jobs beside it still share theirs."""
    backend = FakeBackend()
    batcher, _ = make(backend)
    requests = [
        batcher.enqueue(Rows([seq(3, 1)]), deadline()),
        batcher.enqueue(Rows([seq(3, 10)]), deadline(), alone=True),
        batcher.enqueue(Rows([seq(3, 20)]), deadline()),
    ]
    await asyncio.gather(*requests)
    assert [b[:, 0].tolist() for b in backend.batches] == [[1, 20], [10]]
    await batcher.stop()


async def test_similar_lengths_share_a_batch() -> None:
    backend = FakeBackend(hold_first=True)
    batcher, _ = make(backend, tokens=4 * 40, size=4)
    first = asyncio.create_task(submit(batcher, [seq(2, 1)], deadline()))
    await asyncio.to_thread(backend.entered.wait, 5)
    # alternate short and long rows: FIFO batches would pad every short row to 40
    lengths = [4, 40, 5, 39, 4, 38, 5, 37]
    tasks = [
        asyncio.create_task(submit(batcher, [seq(n, 100 * (i + 1))], deadline()))
        for i, n in enumerate(lengths)
    ]
    await asyncio.sleep(0.05)
    backend.gate.set()
    await asyncio.gather(first, *tasks)
    widths = sorted(b.shape[1] for b in backend.batches[1:])
    assert widths == [5, 40]
    await batcher.stop()


class GpuBackend(FakeBackend):
    provider = "cuda"


async def test_on_a_gpu_rows_of_any_length_share_a_batch() -> None:
    """A GPU pads for free: only the budgets bound its batches (on CPU these rows form two
    batches, test_similar_lengths_share_a_batch)."""
    backend = GpuBackend(hold_first=True)
    batcher, _ = make(backend, tokens=4 * 40, size=4)
    first = asyncio.create_task(submit(batcher, [seq(2, 1)], deadline()))
    await asyncio.to_thread(backend.entered.wait, 5)
    tasks = [
        asyncio.create_task(submit(batcher, [seq(n, 100 * (i + 1))], deadline()))
        for i, n in enumerate([4, 40, 5, 39])
    ]
    await asyncio.sleep(0.05)
    backend.gate.set()
    await asyncio.gather(first, *tasks)
    assert [b.shape for b in backend.batches[1:]] == [(4, 40)]
    await batcher.stop()


async def test_max_wait_does_not_hold_a_full_batch() -> None:
    backend = FakeBackend()
    batcher, _ = make(backend, size=2, wait_ms=5000)
    start = time.perf_counter()
    both = [batcher.enqueue(Rows([seq(3, k)]), deadline()) for k in (1, 10)]  # queued at once
    await asyncio.gather(*both)
    assert time.perf_counter() - start < 2.5  # not max_wait's 5 s
    assert [b.shape[0] for b in backend.batches] == [2]
    await batcher.stop()


async def test_max_wait_lets_a_batch_gather_rows_when_idle() -> None:
    backend = FakeBackend()
    batcher, _ = make(backend, wait_ms=100)
    first = asyncio.create_task(submit(batcher, [seq(3, 1)], deadline()))
    await asyncio.sleep(0.02)
    second = asyncio.create_task(submit(batcher, [seq(3, 10)], deadline()))
    await asyncio.gather(first, second)
    assert [b.shape[0] for b in backend.batches] == [2]
    await batcher.stop()


async def test_a_request_split_across_batches_completes_once_all_rows_ran() -> None:
    backend = FakeBackend()
    batcher, _ = make(backend, tokens=20, size=2)
    rows = [seq(5, 10 * i + 1) for i in range(7)]
    outputs = await submit(batcher, rows, deadline())
    assert len(backend.batches) == 4  # 2 + 2 + 2 + 1 rows
    assert [o["tokens"][0] for o in outputs] == [r.input_ids[0] for r in rows]
    await batcher.stop()


async def test_a_cancelled_request_is_dropped_before_it_costs_compute() -> None:
    backend = FakeBackend(hold_first=True)
    batcher, metrics = make(backend)
    first = asyncio.create_task(submit(batcher, [seq(3, 1)], deadline()))
    await asyncio.to_thread(backend.entered.wait, 5)
    gone = asyncio.create_task(submit(batcher, [seq(3, 500), seq(4, 600)], deadline()))
    kept = asyncio.create_task(submit(batcher, [seq(3, 700)], deadline()))
    await asyncio.sleep(0.01)
    gone.cancel()  # what the route does when the client disconnects
    await asyncio.sleep(0.01)
    assert not batcher.idle  # `first` and `kept` are not answered yet
    backend.gate.set()
    await first, await kept
    assert batcher.idle  # the drain at unload waits for this
    assert not backend.ran(500) and not backend.ran(600) and backend.ran(700)
    assert sample(metrics, "bert_heads_dropped_requests_total", reason="client_gone") == 1
    assert sample(metrics, "bert_heads_queue_depth") == 0
    await batcher.stop()


async def test_a_request_cancelled_while_its_batch_runs_leaves_the_others_their_answers() -> None:
    backend = FakeBackend(hold_first=True)
    batcher, _ = make(backend)
    futures = [batcher.enqueue(Rows([seq(3, 10 * k)]), deadline()) for k in (1, 2, 3)]
    await asyncio.to_thread(backend.entered.wait, 5)  # the three share the held batch
    futures[0].cancel()  # the first to be answered: its client went away meanwhile
    backend.gate.set()
    answers = await asyncio.wait_for(asyncio.gather(*futures[1:]), 5)
    assert [a[0]["total"] for a in answers] == [20 + 21 + 22, 30 + 31 + 32]
    assert len(backend.batches) == 1
    await batcher.stop()


async def test_a_request_past_its_deadline_is_dropped() -> None:
    backend = FakeBackend(hold_first=True)
    batcher, metrics = make(backend)
    first = asyncio.create_task(submit(batcher, [seq(3, 1)], deadline()))
    await asyncio.to_thread(backend.entered.wait, 5)
    with pytest.raises(
        DeadlineExceeded, match="^request_timeout passed before the model answered$"
    ):
        await submit(batcher, [seq(3, 500)], deadline(0.05))
    backend.gate.set()
    await first
    assert not backend.ran(500)
    assert sample(metrics, "bert_heads_dropped_requests_total", reason="deadline") == 1
    await batcher.stop()


async def test_a_backend_failure_fails_only_its_batch_and_the_worker_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = FakeBackend(fail_on=666, hold_first=True)
    batcher, _ = make(backend, tokens=10, size=1)  # one row per batch
    bad = asyncio.create_task(submit(batcher, [seq(3, 666)], deadline()))
    good = asyncio.create_task(submit(batcher, [seq(3, 1)], deadline()))  # the lane's next
    await asyncio.to_thread(backend.entered.wait, 5)
    backend.gate.set()
    with pytest.raises(BackendError, match=r"^inference failed \(RuntimeError\); retry$"):
        await bad
    assert (await asyncio.wait_for(good, 5))[0]["total"] == 6
    [record] = [r for r in caplog.records if r.name == "service.batcher"]
    assert record.getMessage() == "m: inference failed on a batch of 1 x 3" and record.exc_info
    assert (await submit(batcher, [seq(2, 5)], deadline()))[0]["total"] == 11
    assert batcher.alive
    await batcher.stop()


async def test_stop_fails_what_is_still_queued() -> None:
    before = asyncio.all_tasks()
    backend = FakeBackend(hold_first=True)
    batcher, metrics = make(backend)
    running = asyncio.create_task(submit(batcher, [seq(3, 1)], deadline()))
    await asyncio.to_thread(backend.entered.wait, 5)
    queued = asyncio.create_task(submit(batcher, [seq(3, 9)], deadline()))
    await asyncio.sleep(0.01)
    await batcher.stop()
    assert asyncio.all_tasks() - before <= {running, queued}  # its worker and lane have ended
    backend.gate.set()
    for task in (running, queued):
        with pytest.raises(NotReady, match="^the service is shutting down$"):
            await task
    assert sample(metrics, "bert_heads_queue_depth") == 0


async def test_admission_refuses_past_the_limit_with_retry_after() -> None:
    admission = Admission(2)
    admission.acquire()
    admission.acquire()
    with pytest.raises(
        Overloaded, match=r"2 requests in flight \(max_concurrent_requests\)"
    ) as refused:
        admission.acquire()
    assert refused.value.headers == {"Retry-After": "1"}
    admission.release()
    admission.acquire()
    assert not await admission.wait_idle(0.01)
    admission.release()
    admission.release()
    assert await admission.wait_idle(0.01)


class NaNBackend(FakeBackend):
    """Like FakeBackend, with `labels` (B, T, 3) beside, a per-token output with an axis more
    (NER's logits): token 99 comes out NaN in `tokens`, token 77 in `labels`, and every
    padding position is infinite in both."""

    def run(self, feeds: Mapping[str, np.ndarray], alone: bool = True) -> dict[str, np.ndarray]:
        out = super().run(feeds, alone)
        ids, padding = feeds["input_ids"], feeds["attention_mask"] == 0
        labels = np.repeat(np.where(ids == 77, np.nan, out["tokens"])[..., None], 3, axis=-1)
        out["labels"] = np.where(padding[..., None], np.inf, labels)
        out["tokens"] = np.where(padding, np.inf, np.where(ids == 99, np.nan, out["tokens"]))
        return out


async def test_a_nan_fails_only_its_request_and_padding_does_not_count() -> None:
    batcher, _ = make(NaNBackend(hold_first=False), frozenset({"tokens", "labels"}))
    # ids 98, 99 (a NaN in `tokens`) and 76, 77 (in `labels`); `good` is padded to 2 beside
    bad = [batcher.enqueue(Rows([seq(2, first)]), deadline()) for first in (98, 76)]
    good = batcher.enqueue(Rows([seq(1, 10)]), deadline())
    for request in bad:
        with pytest.raises(
            BackendError, match="^the model produced a NaN or infinite value for this input$"
        ):
            await request
    [out] = await good
    assert out["tokens"].tolist() == [10.0] and out["labels"].tolist() == [[10.0] * 3]
    await batcher.stop()


class Together(Rows):
    """A job whose class answers several jobs at once, unless one of them is `poison`; its
    answer says which way it was made, and the total of its first row."""

    calls: list[int] = []

    def __init__(self, rows: list[ModelRow], poison: bool = False) -> None:
        super().__init__(rows)
        self.poison = poison

    def answer(self, outputs: list[Outputs]) -> Any:
        if self.poison:
            raise ValueError("a bug in this job's post-processing")
        return ("alone", outputs[0]["total"])

    @staticmethod
    def answer_many(jobs: list[Together], outputs: list[list[Outputs]]) -> list[Any]:
        Together.calls.append(len(jobs))
        if any(job.poison for job in jobs):
            raise ValueError("one job of the group fails")
        return [("together", outs[0]["total"]) for outs in outputs]


async def answered_in_one_batch(jobs: list[Together]) -> list[Any]:
    """Each job's answer or exception, the jobs queued behind a held batch so they share one."""
    backend = FakeBackend(hold_first=True)
    batcher, _ = make(backend)
    first = batcher.enqueue(Rows([seq(1, 1)]), deadline())
    await asyncio.to_thread(backend.entered.wait, 10)
    futures = [batcher.enqueue(job, deadline()) for job in jobs]
    backend.gate.set()
    await first
    answers = await asyncio.gather(*futures, return_exceptions=True)
    await batcher.stop()
    return answers


@pytest.mark.parametrize("n", [2, 3])
async def test_jobs_of_one_class_are_answered_together(n: int) -> None:
    Together.calls = []
    answers = await answered_in_one_batch([Together([seq(1, 10 + k)]) for k in range(n)])
    assert answers == [("together", 10 + k) for k in range(n)]
    assert Together.calls == [n]


async def test_each_class_of_a_batch_answers_its_own_jobs() -> None:
    Together.calls = []
    jobs: list[Any] = [Together([seq(1, 10)]), Together([seq(1, 20)]), Rows([seq(1, 30)])]
    answers = await answered_in_one_batch([*jobs, Rows([seq(1, 40)])])
    assert answers[:2] == [("together", 10), ("together", 20)]
    assert [a[0]["total"] for a in answers[2:]] == [30, 40]  # Rows: one by one


async def test_a_failure_answering_together_stays_with_the_job_that_raises() -> None:
    Together.calls = []
    jobs = [Together([seq(1, 10)]), Together([seq(1, 20)], poison=True), Together([seq(1, 30)])]
    answers = await answered_in_one_batch(jobs)
    assert answers[0] == ("alone", 10) and answers[2] == ("alone", 30)  # retried one at a time
    assert isinstance(answers[1], BackendError) and "post-processing" in str(answers[1])
    assert Together.calls == [3]


class Texts(Rows):
    """A job with texts: records the thread that made its rows; `broken` raises there."""

    def __init__(self, text: str, broken: bool = False) -> None:
        super().__init__([seq(3, 40)])
        self.texts, self.broken = [text], broken
        self.thread: int | None = None

    def rows(self, tokenizer: object, encodings: list[object]) -> list[ModelRow]:
        self.thread = threading.get_ident()
        if self.broken:
            raise RuntimeError("a bug in this job's rows")
        return self._rows


class Encoder:
    def encode(self, text: str, add_special_tokens: bool = True) -> str:
        return text


async def test_an_idle_model_tokenizes_a_short_job_on_the_loop_and_a_long_one_in_a_thread() -> None:
    backend = FakeBackend()
    batcher, _ = make(backend)
    batcher.tokenizer = Encoder()  # type: ignore[assignment]
    # INLINE_CHARS characters in all are still short; one more is long
    short, long_ = Texts("w" * INLINE_CHARS), Texts("w" * (INLINE_CHARS + 1))
    assert (await batcher.enqueue(short, deadline()))[0]["total"] == 40 + 41 + 42
    assert (await batcher.enqueue(long_, deadline()))[0]["total"] == 40 + 41 + 42
    assert short.thread == threading.get_ident() != long_.thread
    await batcher.stop()


async def test_a_busy_model_tokenizes_short_jobs_on_the_loop_too() -> None:
    backend = FakeBackend(hold_first=True)
    batcher, _ = make(backend)
    batcher.tokenizer = Encoder()  # type: ignore[assignment]
    first = asyncio.ensure_future(submit(batcher, [seq(3, 1)], deadline()))
    await asyncio.to_thread(backend.entered.wait, 5)  # its batch runs (held) from here

    async def tokenized(jobs: list[Texts]) -> None:  # while the held batch runs
        for _ in range(5000):
            if all(job.thread is not None for job in jobs):
                return
            await asyncio.sleep(0.001)
        raise AssertionError("the worker did not tokenize the jobs")

    short = [Texts("a fine movie") for _ in range(3)]
    answers = [batcher.enqueue(job, deadline()) for job in short]
    await tokenized(short)  # together, in one encoder call
    long_ = Texts("word " * INLINE_CHARS)
    answers.append(batcher.enqueue(long_, deadline()))
    await tokenized([long_])
    backend.gate.set()
    assert [a[0]["total"] for a in await asyncio.gather(first, *answers)] == [6] + [123] * 4
    loop_thread = threading.get_ident()
    assert all(job.thread == loop_thread for job in short), "the hop costs more than these"
    assert long_.thread != loop_thread, "a long job would hold the loop: a thread encodes it"
    await batcher.stop()


@pytest.mark.parametrize("chars", [12, INLINE_CHARS + 1], ids=["on the loop", "in a thread"])
async def test_a_failure_tokenizing_fails_only_its_request_and_is_logged(
    chars: int, caplog: pytest.LogCaptureFixture
) -> None:
    backend = FakeBackend()
    batcher, _ = make(backend)
    batcher.tokenizer = Encoder()  # type: ignore[assignment]
    with pytest.raises(BackendError, match="^internal error while tokenizing$"):
        await batcher.enqueue(Texts("w" * chars, broken=True), deadline())
    [record] = [r for r in caplog.records if r.name == "service.batcher"]
    assert record.levelno == logging.ERROR and record.getMessage() == "m: tokenization failed"
    assert record.exc_info is not None  # with the traceback
    assert batcher.alive
    assert (await batcher.enqueue(Texts("w" * chars), deadline()))[0]["total"] == 123
    await batcher.stop()


class SlowEncoder(Encoder):
    """Takes `seconds` a text; records the most texts being encoded at once."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started = threading.Event()
        self.running = self.most = 0
        self._lock = threading.Lock()

    def encode(self, text: str, add_special_tokens: bool = True) -> str:
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
        self.started.set()
        time.sleep(self.seconds)
        with self._lock:
            self.running -= 1
        return text


async def test_a_busy_model_encodes_one_long_job_at_a_time_and_goes_on() -> None:
    backend = FakeBackend(hold_first=True)
    batcher, _ = make(backend)
    encoder = SlowEncoder(0.2)
    batcher.tokenizer = encoder  # type: ignore[assignment]
    first = asyncio.ensure_future(submit(batcher, [seq(3, 1)], deadline()))
    await asyncio.to_thread(backend.entered.wait, 5)  # busy from here
    a = batcher.enqueue(Texts("w" * (INLINE_CHARS + 1)), deadline())
    await asyncio.to_thread(encoder.started.wait, 5)  # `a` is being encoded in a thread
    b = batcher.enqueue(Texts("w" * (INLINE_CHARS + 1)), deadline())
    await asyncio.sleep(0.05)  # the worker has seen `b` arrive
    backend.gate.set()
    await asyncio.wait_for(asyncio.gather(first, a, b), 5)
    assert encoder.most == 1  # `b` waited for `a`'s encoder call
    later = batcher.enqueue(Texts("w" * (INLINE_CHARS + 1)), deadline())
    assert (await asyncio.wait_for(later, 5))[0]["total"] == 123
    await batcher.stop()


async def test_a_request_gone_while_tokenized_leaves_the_others_of_its_call_their_rows() -> None:
    batcher, _ = make(FakeBackend())
    encoder = SlowEncoder(0.1)
    batcher.tokenizer = encoder  # type: ignore[assignment]
    # three long jobs that arrive together: one encoder call, in a thread
    requests = [batcher.enqueue(Echo(["w" * (INLINE_CHARS + k)]), deadline()) for k in (1, 2, 3)]
    await asyncio.to_thread(encoder.started.wait, 5)
    requests[0].cancel()
    answers = await asyncio.wait_for(asyncio.gather(*requests[1:]), 5)
    assert [len(a[0]["tokens"]) for a in answers] == [INLINE_CHARS + 2, INLINE_CHARS + 3]
    await batcher.stop()


async def test_stop_fails_a_request_being_tokenized() -> None:
    """Not only the queued ones: a job whose texts are in the encoder's thread gets
    not_ready at once, not an answer at its deadline."""
    batcher, _ = make(FakeBackend())
    encoder = SlowEncoder(0.3)
    batcher.tokenizer = encoder  # type: ignore[assignment]
    request = batcher.enqueue(Texts("w" * (INLINE_CHARS + 1)), deadline())
    await asyncio.to_thread(encoder.started.wait, 5)
    await batcher.stop()
    with pytest.raises(NotReady, match="^the service is shutting down$"):
        await asyncio.wait_for(request, 2)


class Recording(Encoder):
    """Records its calls: ("encode", 1) a text, or ("encode_batch", number of texts)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def encode(self, text: str, add_special_tokens: bool = True) -> str:
        self.calls.append(("encode", 1))
        return text

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> list[str]:
        self.calls.append(("encode_batch", len(texts)))
        return list(texts)


@pytest.mark.parametrize(
    ("texts", "calls"),
    [
        (SERIAL_BELOW - 1, [("encode", 1)] * (SERIAL_BELOW - 1)),
        (SERIAL_BELOW, [("encode_batch", SERIAL_BELOW)]),
    ],
)
async def test_a_few_texts_are_encoded_one_by_one_and_more_in_one_call(
    texts: int, calls: list[tuple[str, int]]
) -> None:
    batcher, _ = make(FakeBackend())
    encoder = Recording()
    batcher.tokenizer = encoder  # type: ignore[assignment]
    jobs = [Texts(f"text {k}") for k in range(texts)]  # they arrive together: one step
    await asyncio.gather(*(batcher.enqueue(job, deadline()) for job in jobs))
    assert encoder.calls == calls
    await batcher.stop()


class Echo(Rows):
    """A job whose rows come from the encodings it is handed: a row per text, as long as the
    text (the Encoder hands texts back); `invalid` refuses its input."""

    def __init__(self, texts: list[str], invalid: bool = False, truncated: int = 0) -> None:
        super().__init__([])
        self.texts, self.invalid, self.truncated = texts, invalid, truncated
        self.windowed = int(truncated > 0)

    def rows(self, tokenizer: object, encodings: list[object]) -> list[ModelRow]:
        if self.invalid:
            raise InvalidInput("this input cannot make rows")
        return [seq(len(str(e)), 1) for e in encodings]


async def test_jobs_encoded_together_each_get_their_own_encodings_and_errors() -> None:
    batcher, metrics = make(FakeBackend())
    batcher.tokenizer = Encoder()  # type: ignore[assignment]
    jobs = [Echo(["ab", "cde"], truncated=2), Echo(["f"], invalid=True), Echo(["ghij"])]
    answers = await asyncio.wait_for(
        asyncio.gather(*(batcher.enqueue(job, deadline()) for job in jobs), return_exceptions=True),
        5,
    )
    assert [len(out["tokens"]) for out in answers[0]] == [2, 3]
    assert isinstance(answers[1], InvalidInput)  # the route's 422, for this job alone
    assert [len(out["tokens"]) for out in answers[2]] == [4]
    assert sample(metrics, "bert_heads_inputs_truncated_total") == 2
    assert sample(metrics, "bert_heads_inputs_windowed_total") == 1
    await batcher.stop()


async def test_a_job_without_rows_is_answered_without_a_batch() -> None:
    backend = FakeBackend()
    batcher, _ = make(backend)
    assert await batcher.enqueue(Rows([]), deadline()) == []
    assert backend.batches == []
    await batcher.stop()


class Refuses(Rows):
    """A job whose answer raises `error`."""

    def __init__(self, error: Exception) -> None:
        super().__init__([seq(2, 1)])
        self.error = error

    def answer(self, outputs: list[Outputs]) -> Any:
        raise self.error


async def test_an_error_in_an_answer_fails_its_job_alone(caplog: pytest.LogCaptureFixture) -> None:
    """Bad input found at the end stays bad input (422); any other error is a logged 503."""
    batcher, _ = make(FakeBackend())
    bad_input = InvalidInput("the spans do not fit")
    answers = await asyncio.gather(
        batcher.enqueue(Refuses(bad_input), deadline()),
        batcher.enqueue(Refuses(ValueError("a bug")), deadline()),
        batcher.enqueue(Rows([seq(2, 5)]), deadline()),
        return_exceptions=True,
    )
    assert answers[0] is bad_input
    assert isinstance(answers[1], BackendError)
    assert str(answers[1]) == "post-processing failed (ValueError)"
    assert answers[2][0]["total"] == 11
    [record] = [r for r in caplog.records if r.name == "service.batcher"]
    assert record.getMessage() == "m: post-processing failed" and record.exc_info
    await batcher.stop()


class LaneBackend(FakeBackend):
    """Two lanes. Records `alone` per batch; batches run beside another wait at a barrier of
    two, which breaks (and fails the batch) unless a second batch runs at the same time."""

    lanes = 2

    def __init__(self, hold_first: bool = False) -> None:
        super().__init__(hold_first=hold_first)
        self.alone: list[bool] = []
        self.together = threading.Barrier(2, timeout=5)

    def run(self, feeds: Mapping[str, np.ndarray], alone: bool = True) -> dict[str, np.ndarray]:
        self.alone.append(alone)
        out = super().run(feeds, alone)
        if not alone:
            self.together.wait()
        return out


async def held_first_then_two(backend: FakeBackend) -> tuple[Batcher, list[asyncio.Task[Any]]]:
    """A batcher whose first request's batch is held in the backend (hold_first) while two
    more queue, of lengths too far apart for one CPU batch: (batcher, the three requests)."""
    batcher, _ = make(backend)
    first = asyncio.create_task(submit(batcher, [seq(3, 1)], deadline()))
    await asyncio.to_thread(backend.entered.wait, 5)
    rest = [asyncio.create_task(submit(batcher, [r], deadline())) for r in (seq(3, 10), seq(40, 100))]  # fmt: skip
    await asyncio.sleep(0.05)
    return batcher, [first, *rest]


async def test_lanes_run_batches_side_by_side_and_a_lone_batch_alone() -> None:
    backend = LaneBackend(hold_first=True)
    batcher, requests = await held_first_then_two(backend)
    # the first runs alone (with every core): nothing starts beside it, however much queues
    assert backend.alone == [True]
    backend.gate.set()
    await asyncio.gather(*requests)
    assert backend.alone == [True, False, False]  # the other two ran side by side, on the lanes
    assert sorted(b.shape[1] for b in backend.batches[1:]) == [3, 40]
    await batcher.stop()


async def test_one_lane_runs_one_batch_at_a_time_and_each_alone() -> None:
    backend = FakeBackend(hold_first=True)
    batcher, requests = await held_first_then_two(backend)
    assert len(backend.batches) == 0  # the first is still held, and nothing runs beside it
    backend.gate.set()
    await asyncio.gather(*requests)
    assert len(backend.batches) == 3
    await batcher.stop()


class Stepped(FakeBackend):
    """Each batch waits for a step of the test (`steps.release()`); `begun` counts the
    batches started."""

    def __init__(self) -> None:
        super().__init__()
        self.steps = threading.Semaphore(0)
        self.begun = threading.Semaphore(0)

    def run(self, feeds: Mapping[str, np.ndarray], alone: bool = True) -> dict[str, np.ndarray]:
        self.begun.release()
        self.steps.acquire(timeout=10)
        return super().run(feeds, alone)

    async def started(self, timeout: float = 5) -> bool:
        """Whether the next batch starts within `timeout` seconds."""
        return await asyncio.to_thread(self.begun.acquire, True, timeout)


async def one_lane_three_batches() -> tuple[Batcher, Stepped, list[asyncio.Future[Any]]]:
    """One row a batch: `a` runs, `b` waits in the lane's pocket, `c` in the queue."""
    backend = Stepped()
    batcher, _ = make(backend, size=1)
    a, b = (batcher.enqueue(Rows([seq(3, k)]), deadline()) for k in (1, 10))
    assert await backend.started()  # a
    c = batcher.enqueue(Rows([seq(3, 20)]), deadline())
    await asyncio.sleep(0.05)  # the worker has seen c; the pocket holds one batch
    return batcher, backend, [a, b, c]


async def test_a_lanes_pocket_holds_one_batch_and_the_rest_waits_its_turn() -> None:
    batcher, backend, (a, b, c) = await one_lane_three_batches()
    assert not await backend.started(0.3)  # one lane: b waits for a
    backend.steps.release()  # a ends, b starts
    assert await backend.started()
    assert (await a)[0]["total"] == 1 + 2 + 3
    backend.steps.release(2)
    answers = await asyncio.wait_for(asyncio.gather(b, c), 5)
    assert [x[0]["total"] for x in answers] == [10 + 11 + 12, 20 + 21 + 22]
    assert [int(x[0, 0]) for x in backend.batches] == [1, 10, 20]  # oldest first
    await batcher.stop()


@pytest.mark.parametrize("running", ["first batch", "second batch"])
async def test_stop_fails_the_batches_a_lane_holds(running: str) -> None:
    """Those running and those in its pocket, whichever batch of the lane is running."""
    batcher, backend, requests = await one_lane_three_batches()
    if running == "second batch":
        backend.steps.release()
        assert await backend.started()
        await requests.pop(0)  # answered
    await batcher.stop()
    backend.steps.release(3)  # let the lane's thread end
    for request in requests:
        with pytest.raises(NotReady):
            await asyncio.wait_for(request, 5)


async def test_a_failure_answering_a_batch_fails_its_requests_and_the_lane_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug in handing out answers (here: the first call raises) fails that batch's
    requests, is logged, and the next batch is answered."""
    batcher, _ = make(FakeBackend())
    answer = batcher._answer
    calls = []

    def broken_once(requests: list[Any], answers: list[Any]) -> None:
        calls.append(len(requests))
        if len(calls) == 1:
            raise RuntimeError("a bug")
        answer(requests, answers)

    monkeypatch.setattr(batcher, "_answer", broken_once)
    with pytest.raises(BackendError, match="^internal error while batching$"):
        await submit(batcher, [seq(3, 1)], deadline())
    [record] = [r for r in caplog.records if r.name == "service.batcher"]
    assert record.getMessage() == "m: batch failed outside the backend" and record.exc_info
    assert (await submit(batcher, [seq(3, 1)], deadline()))[0]["total"] == 6
    await batcher.stop()


class Timed(FakeBackend):
    """Records when each batch starts (perf_counter), and the most batches run at once."""

    def __init__(self, hold_first: bool = False) -> None:
        super().__init__(hold_first=hold_first)
        self.starts: list[float] = []
        self.running = self.most = 0
        self._lock = threading.Lock()

    def run(self, feeds: Mapping[str, np.ndarray], alone: bool = True) -> dict[str, np.ndarray]:
        self.starts.append(time.perf_counter())
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            return super().run(feeds, alone)
        finally:
            with self._lock:
                self.running -= 1


async def test_a_lanes_next_batch_starts_in_its_thread_while_the_event_loop_is_busy() -> None:
    """Two requests queued at once, one row a batch: the second waits in the lane's pocket
    while the first runs, and starts as the first ends, even with the event loop blocked."""
    backend = Timed(hold_first=True)
    batcher, _ = make(backend, size=1)
    requests = [asyncio.create_task(submit(batcher, [seq(3, i)], deadline())) for i in (1, 10)]
    await asyncio.to_thread(backend.entered.wait, 5)
    backend.gate.set()
    time.sleep(0.3)  # the event loop does nothing else meanwhile
    unblocked = time.perf_counter()
    await asyncio.gather(*requests)
    assert len(backend.starts) == 2
    assert backend.starts[1] < unblocked - 0.2
    assert backend.most == 1  # one lane: one batch at a time, the next in its pocket
    await batcher.stop()
