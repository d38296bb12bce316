"""The batcher against a fake backend that records every batch: budgets, grouping by length,
split requests, drops before compute, deadlines, and failures that stay in their batch."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from heads.rows import Outputs, Sequence
from service.batcher import INLINE_CHARS, Batcher, pad
from service.errors import BackendError, DeadlineExceeded, NotReady, Overloaded
from service.job_queue import Admission, grow_batch, next_batch
from service.metrics import Metrics

pytestmark = pytest.mark.anyio


def seq(length: int, first_id: int = 1) -> Sequence:
    """A row of `length` tokens whose ids start at first_id (so rows can be told apart)."""
    return Sequence(
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


def make(backend: FakeBackend, **limits: float) -> tuple[Batcher, Metrics]:
    metrics = Metrics()
    batcher = Batcher(
        backend,
        metrics.add_model("m", "token-classification"),
        sequence_outputs=frozenset({"tokens"}),
        max_batch_tokens=int(limits.get("tokens", 1000)),
        max_batch_size=int(limits.get("size", 64)),
        max_wait_ms=limits.get("wait_ms", 0),
    )
    batcher.start()
    return batcher, metrics


class Rows:
    """A job whose rows are made already: no texts to encode, its answer the rows' outputs."""

    texts: list[str] = []
    truncated = windowed = 0

    def __init__(self, rows: list[Sequence]) -> None:
        self._rows = rows

    def rows(self, tokenizer: object, encodings: list[object]) -> list[Sequence]:
        return self._rows

    def answer(self, outputs: list[Outputs]) -> list[Outputs]:
        return outputs


def submit(batcher: Batcher, rows: list[Sequence], deadline: float) -> Any:
    """The batcher's submit (a coroutine): the rows' outputs, in order."""
    return batcher.submit(Rows(rows), deadline)


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


def test_next_batch_grows_around_the_oldest_row_shortest_first() -> None:
    # arrival order: the oldest (10 tokens) goes, with its near lengths; 30 would pad too much
    assert next_batch([10, 3, 4, 30, 11], 1000, 64, pad_limit=8) == [1, 2, 0, 4]
    assert next_batch([30, 3, 4], 1000, 64, pad_limit=8) == [0]  # never starved


def test_pad_masks_and_pads_with_zeros() -> None:
    feeds = pad([seq(3, 5), Sequence(np.array([7], dtype=np.int64), np.array([1], dtype=np.int64))])
    assert feeds["input_ids"].tolist() == [[5, 6, 7], [7, 0, 0]]
    assert feeds["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert feeds["token_type_ids"].tolist() == [[0, 0, 0], [1, 0, 0]]
    assert all(v.dtype == np.int64 for v in feeds.values())


async def test_outputs_come_back_per_row_with_padding_cut() -> None:
    batcher, _ = make(FakeBackend())
    rows = [seq(4, 10), seq(2, 20), seq(6, 30)]
    outputs = await submit(batcher, rows, deadline())
    for row, out in zip(rows, outputs, strict=True):
        assert out["tokens"].tolist() == row.input_ids.tolist()  # sequence axis cut to the row
        assert out["total"].shape == () and out["total"] == row.input_ids.sum()
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
    backend.gate.set()
    await first, await kept
    assert not backend.ran(500) and not backend.ran(600) and backend.ran(700)
    assert sample(metrics, "bert_heads_dropped_requests_total", reason="client_gone") == 1
    assert sample(metrics, "bert_heads_queue_depth") == 0
    await batcher.stop()


async def test_a_request_past_its_deadline_is_dropped() -> None:
    backend = FakeBackend(hold_first=True)
    batcher, metrics = make(backend)
    first = asyncio.create_task(submit(batcher, [seq(3, 1)], deadline()))
    await asyncio.to_thread(backend.entered.wait, 5)
    with pytest.raises(DeadlineExceeded):
        await submit(batcher, [seq(3, 500)], deadline(0.05))
    backend.gate.set()
    await first
    assert not backend.ran(500)
    assert sample(metrics, "bert_heads_dropped_requests_total", reason="deadline") == 1
    await batcher.stop()


async def test_a_backend_failure_fails_only_its_batch_and_the_worker_goes_on() -> None:
    backend = FakeBackend(fail_on=666, hold_first=True)
    batcher, _ = make(backend, tokens=10, size=1)  # one row per batch
    bad = asyncio.create_task(submit(batcher, [seq(3, 666)], deadline()))
    await asyncio.to_thread(backend.entered.wait, 5)
    good = asyncio.create_task(submit(batcher, [seq(3, 1)], deadline()))
    backend.gate.set()
    with pytest.raises(BackendError):
        await bad
    assert (await good)[0]["total"] == 6
    assert (await submit(batcher, [seq(2, 5)], deadline()))[0]["total"] == 11
    assert batcher.alive
    await batcher.stop()


async def test_stop_fails_what_is_still_queued() -> None:
    backend = FakeBackend(hold_first=True)
    batcher, _ = make(backend)
    running = asyncio.create_task(submit(batcher, [seq(3, 1)], deadline()))
    await asyncio.to_thread(backend.entered.wait, 5)
    queued = asyncio.create_task(submit(batcher, [seq(3, 9)], deadline()))
    await asyncio.sleep(0.01)
    await batcher.stop()
    backend.gate.set()
    for task in (running, queued):
        with pytest.raises(NotReady):
            await task


async def test_admission_refuses_past_the_limit_with_retry_after() -> None:
    admission = Admission(2)
    admission.acquire()
    admission.acquire()
    with pytest.raises(Overloaded) as refused:
        admission.acquire()
    assert refused.value.headers == {"Retry-After": "1"}
    admission.release()
    admission.acquire()
    assert not await admission.wait_idle(0.01)
    admission.release()
    admission.release()
    assert await admission.wait_idle(0.01)


class NaNBackend(FakeBackend):
    """Like FakeBackend, but token 99 comes out NaN and every padding position infinite."""

    def run(self, feeds: Mapping[str, np.ndarray], alone: bool = True) -> dict[str, np.ndarray]:
        out = super().run(feeds, alone)
        tokens = np.where(feeds["input_ids"] == 99, np.nan, out["tokens"])
        out["tokens"] = np.where(feeds["attention_mask"] == 0, np.inf, tokens)
        return out


async def test_a_nan_fails_only_its_request_and_padding_does_not_count() -> None:
    batcher, _ = make(NaNBackend(hold_first=False))
    bad = batcher.enqueue(Rows([seq(2, 98)]), deadline())  # ids 98, 99: 99 is NaN
    good = batcher.enqueue(Rows([seq(1, 10)]), deadline())  # padded to 2 beside `bad`
    with pytest.raises(BackendError, match="NaN or infinite"):
        await bad
    assert (await good)[0]["tokens"].tolist() == [10.0]
    await batcher.stop()


class Together(Rows):
    """A job whose class answers several jobs at once, unless one of them is `poison`."""

    calls: list[int] = []

    def __init__(self, rows: list[Sequence], poison: bool = False) -> None:
        super().__init__(rows)
        self.poison = poison

    def answer(self, outputs: list[Outputs]) -> Any:
        if self.poison:
            raise ValueError("a bug in this job's post-processing")
        return "alone"

    @staticmethod
    def answer_many(jobs: list[Together], outputs: list[list[Outputs]]) -> list[Any]:
        Together.calls.append(len(jobs))
        if any(job.poison for job in jobs):
            raise ValueError("one job of the group fails")
        return ["together"] * len(jobs)


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


async def test_jobs_of_one_class_are_answered_together() -> None:
    Together.calls = []
    answers = await answered_in_one_batch([Together([seq(1, 10 + k)]) for k in range(3)])
    assert answers == ["together"] * 3
    assert Together.calls == [3]


async def test_a_failure_answering_together_stays_with_the_job_that_raises() -> None:
    Together.calls = []
    jobs = [Together([seq(1, 10)]), Together([seq(1, 20)], poison=True), Together([seq(1, 30)])]
    answers = await answered_in_one_batch(jobs)
    assert answers[0] == answers[2] == "alone"  # retried one at a time
    assert isinstance(answers[1], BackendError) and "post-processing" in str(answers[1])
    assert Together.calls == [3]


class Texts(Rows):
    """A job with texts: records the thread that made its rows; `broken` raises there."""

    def __init__(self, text: str, broken: bool = False) -> None:
        super().__init__([seq(3, 40)])
        self.texts, self.broken = [text], broken
        self.thread: int | None = None

    def rows(self, tokenizer: object, encodings: list[object]) -> list[Sequence]:
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
    short, long_ = Texts("a fine movie"), Texts("word " * INLINE_CHARS)
    assert (await batcher.submit(short, deadline()))[0]["total"] == 40 + 41 + 42
    assert (await batcher.submit(long_, deadline()))[0]["total"] == 40 + 41 + 42
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


async def test_a_failure_tokenizing_on_the_loop_fails_only_its_request() -> None:
    backend = FakeBackend()
    batcher, _ = make(backend)
    batcher.tokenizer = Encoder()  # type: ignore[assignment]
    with pytest.raises(BackendError, match="tokenizing"):
        await batcher.submit(Texts("a fine movie", broken=True), deadline())
    assert batcher.alive
    assert (await batcher.submit(Texts("a dull one"), deadline()))[0]["total"] == 123
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


class Timed(FakeBackend):
    """Records when each batch starts (perf_counter)."""

    def __init__(self, hold_first: bool = False) -> None:
        super().__init__(hold_first=hold_first)
        self.starts: list[float] = []

    def run(self, feeds: Mapping[str, np.ndarray], alone: bool = True) -> dict[str, np.ndarray]:
        self.starts.append(time.perf_counter())
        return super().run(feeds, alone)


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
    await batcher.stop()
