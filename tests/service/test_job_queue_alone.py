"""A job queued `alone` (the offline batch command's engine calls) shares no batch with another
job's rows, in either direction, and keeps its rows' order; jobs that are not alone still
share batches as before. What the batch command's bit-for-bit resume rests on."""

from __future__ import annotations

import asyncio

import pytest

from tests.service.test_batcher import Rows, deadline, queue_of, seq

pytestmark = pytest.mark.anyio


def owners(batch: list) -> set:
    return {request for request, _ in batch}


async def test_alone_jobs_are_batched_with_their_own_rows_only() -> None:
    queue, _ = queue_of(max_batch_size=8)
    loop = asyncio.get_running_loop()
    a = queue.put(Rows([]), deadline(), loop, alone=True)
    b = queue.put(Rows([]), deadline(), loop, alone=True)
    c = queue.put(Rows([]), deadline(), loop)  # a server's request beside them
    d = queue.put(Rows([]), deadline(), loop)
    queue.take_new()
    for request, n in ((a, 3), (b, 3), (c, 2), (d, 2)):
        queue.add_rows(request, [seq(5, 10 * k) for k in range(n)])  # all of one length
    batches = []
    while batch := queue.next_batch():
        batches.append(batch)
    assert [owners(b) for b in batches] == [{a}, {b}, {c, d}]  # c and d still share
    assert batches[0] == [(a, 0), (a, 1), (a, 2)]


async def test_an_alone_job_waits_its_turn_behind_the_others() -> None:
    queue, _ = queue_of(max_batch_size=8)
    loop = asyncio.get_running_loop()
    c = queue.put(Rows([]), deadline(), loop)
    a = queue.put(Rows([]), deadline(), loop, alone=True)
    d = queue.put(Rows([]), deadline(), loop)
    queue.take_new()
    for request in (c, a, d):
        queue.add_rows(request, [seq(5, 1), seq(5, 2)])
    first, second = queue.next_batch(), queue.next_batch()
    assert owners(first) == {c, d} and owners(second) == {a}
    assert second == [(a, 0), (a, 1)]  # its rows kept their order
