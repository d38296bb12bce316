"""`python -m service --workers 2`: two server processes on one port behave as one service.

Each answer comes from whichever worker accepted the connection; /ready waits for both;
/metrics counts the requests of both; SIGTERM stops both cleanly."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import httpx

from benchmarks._server import worker_pids
from service.dealer import Dealer
from service.workers import share_of_cores
from tests.service.conftest import metric

REPO = Path(__file__).resolve().parents[2]
REQUESTS = 20


def start_two_workers(
    tmp_path: Path, make_package: Callable[..., Path]
) -> tuple[subprocess.Popen, str, Path]:
    """`python -m service --workers 2` on a free port, ready: (the parent, its URL, its log)."""
    models = tmp_path / "models"
    models.mkdir()
    make_package(models, "classification")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BERT_HEADS_", "PROMETHEUS"))}
    log = tmp_path / "server.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "service", "--workers", "2", "--model-dir", str(models),
         "--port", str(port), "--drain-timeout", "5"],
        cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True,  # a process group of its own, as a terminal would start it
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/ready").status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise AssertionError(log.read_text())
        time.sleep(0.2)
    else:
        proc.kill()
        raise AssertionError(f"not ready:\n{log.read_text()}")
    assert len(worker_pids(proc.pid)) == 2
    return proc, url, log


@contextmanager
def two_workers(tmp_path: Path, make_package: Callable[..., Path]) -> Iterator[tuple[str, int]]:
    """`python -m service --workers 2` on a free port, ready: (its URL, the parent's pid).
    SIGTERM afterwards: both stop cleanly (exit 0, no traceback)."""
    proc, url, log = start_two_workers(tmp_path, make_package)
    try:
        yield url, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
    assert rc == 0, log.read_text()
    assert "Traceback" not in log.read_text()


def test_two_workers_answer_count_and_stop(
    tmp_path: Path, make_package: Callable[..., Path]
) -> None:
    with two_workers(tmp_path, make_package) as (url, _):
        for _ in range(REQUESTS):  # a new connection each: either worker may take it
            r = httpx.post(url + "/classify", json={"inputs": "a fine film"})
            assert r.status_code == 200
            assert r.json()[0]["label"] in ("negative", "positive")
        text = httpx.get(url + "/metrics").text
        answered = metric(
            text, "bert_heads_requests_total",
            model="sst2", task="classification", endpoint="/classify", status="200",
        )  # fmt: skip
        assert answered == REQUESTS  # both workers' counts, summed


def test_each_worker_gets_its_share_of_the_cores() -> None:
    cores = len(os.sched_getaffinity(0))
    assert share_of_cores(1) == cores
    assert share_of_cores(cores) == 1
    assert share_of_cores(cores * 4) == 1  # never 0 (= ONNX Runtime's own default)


def worker_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_keep_alive_clients_are_shared_between_the_workers(
    tmp_path: Path, make_package: Callable[..., Path]
) -> None:
    """8 clients open their connections at once and keep them: the parent deals them 4 and 4.
    With one listening socket shared, the first worker to wake took the whole burst half the
    time; with a socket each (SO_REUSEPORT) the kernel's hash split 8 as 6/2 or worse 29% of
    the time (issue 31)."""

    async def load(url: str) -> None:
        clients = [httpx.AsyncClient(base_url=url, timeout=30) for _ in range(8)]
        try:
            for _ in range(60):  # each client its one connection, kept alive
                answers = await asyncio.gather(
                    *(c.post("/classify", json={"inputs": "a fine film"}) for c in clients)
                )
                assert {a.status_code for a in answers} == {200}
        finally:
            await asyncio.gather(*(c.aclose() for c in clients))

    with two_workers(tmp_path, make_package) as (url, parent):
        pids = worker_pids(parent)
        before = [worker_cpu(pid) for pid in pids]
        asyncio.run(load(url))
        used = [worker_cpu(pid) - b for pid, b in zip(pids, before, strict=True)]
    # 480 requests, 240 each: a worker given none spends ~0.01 s, a 6/2 split 3x the CPU
    assert min(used) >= 0.5 * max(used), used


def test_the_dealer_gives_each_connection_to_the_worker_with_the_fewest_open() -> None:
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(3)]
    closed = [0, 0, 0]
    with socket.socket() as listener:
        dealer = Dealer(listener, [p for p, _ in pairs], closed)
        conns = [socket.socket() for _ in range(8)]
        try:
            assert [dealer.deal(c) for c in conns[:6]] == [0, 1, 2, 0, 1, 2]
            closed[1] = 2  # worker 1's connections both closed: it is the least busy
            assert [dealer.deal(c) for c in conns[6:8]] == [1, 1]
            for _, child in pairs:  # each received one socket a message, a working copy
                got = socket.recv_fds(child, 16, 1)[1]
                assert len(got) == 1 and os.fstat(got[0]).st_ino != 0
                os.close(got[0])
            pairs[1][1].close()  # worker 1 takes no more (draining): skipped from now on
            closed[1] = 4  # though the least busy
            assert dealer.deal(conns[0]) == 0 and not dealer.taking[1]
            pairs[0][1].close()
            pairs[2][1].close()
            assert dealer.deal(conns[1]) is None and not any(dealer.taking)
        finally:
            for c in conns:
                c.close()
            for a, b in pairs:
                a.close()
                b.close()


def test_once_started_the_dealer_deals_only_to_workers_that_have_loaded() -> None:
    """Before the first start is over, a worker still loading takes connections (it answers
    /ready with 503 `loading`); after it, a replacement still loading gets none, and with no
    worker serving the dealer deals nothing (it leaves connections in the backlog); while
    stopping, every worker that takes connections gets them (it answers 503 `draining`)."""
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(3)]
    loaded, started = [1, 0], SimpleNamespace(value=0)
    with socket.socket() as listener:
        dealer = Dealer(listener, [p for p, _ in pairs[:2]], [0, 0], loaded, started)
        conns = [socket.socket() for _ in range(3)]
        try:
            assert dealer.eligible() == [0, 1]
            started.value = 1
            assert dealer.eligible() == [0]
            assert [dealer.deal(c) for c in conns[:2]] == [0, 0]
            dealer.retire(0)  # worker 0 died
            assert dealer.eligible() == [] and dealer.deal(conns[2]) is None
            dealer.replace(0, pairs[2][0])  # its replacement, still loading
            loaded[0] = 0
            assert dealer.eligible() == [] and dealer.dealt[0] == 0
            loaded[0] = 1
            assert dealer.deal(conns[2]) == 0 and dealer.dealt[0] == 1
            dealer.stopping = True
            assert dealer.eligible() == [0, 1]
        finally:
            for c in conns:
                c.close()
            for a, b in pairs:
                a.close()
                b.close()
