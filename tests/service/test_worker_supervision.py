"""`python -m service --workers 2` under the deaths production brings (issue 48), with real
processes and real HTTP: a worker SIGKILLed (what the OOM killer does) is replaced while the
other serves; a parent SIGKILLed leaves no worker behind; a worker that dies at every start
stops the server with the cause."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from benchmarks._server import worker_pids
from benchmarks.worker_kill import held_connections
from service.server import Shed
from service.workers import CRASH_LOOP_DEATHS, describe
from tests.service.conftest import metric
from tests.service.test_workers import start_two_workers, two_workers

CLIENTS = 4


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} in {timeout:.0f} s"
        time.sleep(0.05)


class Load:
    """CLIENTS threads posting /classify in a loop, one keep-alive connection each, and one
    asking /ready on a new connection each time: what each got, and when."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.answers: list[tuple[float, str]] = []
        self.ready: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client) for _ in range(CLIENTS)]
        self._threads.append(threading.Thread(target=self._probe))

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()

    def _client(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self._stop.is_set():
                try:
                    r = client.post("/classify", json={"inputs": "a fine film"})
                    got = str(r.status_code)
                except httpx.HTTPError as e:
                    got = type(e).__name__
                self.answers.append((time.monotonic(), got))

    def _probe(self) -> None:
        while not self._stop.is_set():
            try:
                got = str(httpx.get(self.url + "/ready", timeout=30).status_code)
            except httpx.HTTPError as e:
                got = type(e).__name__
            self.ready.append((time.monotonic(), got))
            time.sleep(0.05)

    def between(self, start: float, end: float, probes: bool = False) -> Counter[str]:
        got = self.ready if probes else self.answers
        return Counter(what for t, what in got if start <= t < end)


def restarts(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    return sum(metric(text, "bert_heads_worker_restarts_total", worker=w) for w in "01")


def test_a_killed_worker_is_replaced_while_the_other_serves(
    tmp_path: Path, make_package: Callable[..., Path]
) -> None:
    """Only the requests in flight on the dead worker fail (at most one per connection it
    held, and a probe's); the other worker answers meanwhile and /ready says 200 (never 503)
    throughout; a new worker appears, the restart is counted, and once the replacement has
    loaded the clients are spread over both again (the survivor closes its excess connections
    after a response)."""
    with two_workers(tmp_path, make_package) as (url, parent), Load(url) as load:
        port = int(url.rsplit(":", 1)[1])
        assert restarts(url) == 0
        wait_for(lambda: len(load.answers) >= 40, 30, "answers before the kill")
        victim, survivor = worker_pids(parent)
        held = held_connections(victim, port)
        killed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: "serves again" in (tmp_path / "server.log").read_text(), 60, "restart")
        serving = time.monotonic()
        [replacement] = set(worker_pids(parent)) - {survivor}
        assert replacement != victim
        assert restarts(url) == 1
        # both workers hold two of the four clients' connections again
        wait_for(
            lambda: held_connections(replacement, port) == held_connections(survivor, port) == 2,
            30, "rebalanced connections",
        )  # fmt: skip
        time.sleep(0.5)
    log = (tmp_path / "server.log").read_text()
    assert f"(pid {victim}) killed by SIGKILL; replacing it in 0.5 s" in log, log
    during = load.between(killed, serving)
    assert during["200"] >= 10, during  # the survivor answered while the replacement loaded
    failed = load.between(killed, time.monotonic())
    failed += load.between(killed, time.monotonic(), probes=True)
    del failed["200"]
    # a probe's new connection may meet the dead worker before the parent knows: one more
    assert failed.total() <= held + 1 and not any(k.isdigit() for k in failed), failed
    assert {got for _, got in load.ready if got.isdigit()} == {"200"}, load.ready


@pytest.mark.parametrize("order", ["group", "parent first"])
def test_ctrl_c_stops_the_parent_and_the_workers_with_status_0(
    tmp_path: Path, make_package: Callable[..., Path], order: str
) -> None:
    """A terminal's Ctrl-C reaches the whole process group: every worker drains (the parent
    turns the SIGINT into SIGTERM for them; a worker takes no SIGINT of its own, so one that
    arrives after the SIGTERM cannot skip the drain), and no worker is taken for dead and
    replaced. "parent first" forces the order that failed once in CI: the parent's SIGTERM
    reaches a worker before the worker's own SIGINT."""
    proc, _, log = start_two_workers(tmp_path, make_package)
    workers = worker_pids(proc.pid)
    try:
        if order == "group":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGINT)
            wait_for(lambda: "stopping 2 workers" in log.read_text(), 10, "stop")
            for w in workers:
                os.kill(w, signal.SIGINT)
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert rc == 0, text
    assert all(gone(w) for w in workers)
    assert "replacing it" not in text and "Traceback" not in text, text


def gone(pid: int) -> bool:
    """`pid` has ended (a zombie not yet reaped by init counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_the_workers_exit_when_the_parent_is_killed(
    tmp_path: Path, make_package: Callable[..., Path]
) -> None:
    """SIGKILL gives the parent no chance to stop them: the kernel tells each worker
    (PR_SET_PDEATHSIG) and it drains and exits, so no orphan holds memory or a port."""
    proc, url, log = start_two_workers(tmp_path, make_package)
    workers = worker_pids(proc.pid)
    try:
        proc.kill()
        proc.wait()
        start = time.monotonic()
        wait_for(lambda: all(gone(w) for w in workers), 10, "exit of the workers")
        assert time.monotonic() - start < 5
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health")
    finally:
        for w in workers:
            if not gone(w):
                os.kill(w, signal.SIGKILL)


@pytest.mark.slow  # 7.5 s of back-off between the five deaths, and five starts
def test_a_worker_that_dies_at_every_start_stops_the_server_with_the_cause(
    tmp_path: Path, make_package: Callable[..., Path]
) -> None:
    """What a worker whose model does not fit in memory meets: the OOM killer takes every new
    one while it loads. After 0.5, 1, 2 and 4 s of back-off, the fifth death in a minute stops
    the server: exit status 1 and a log line that names the worker and its signal."""
    proc, _, log = start_two_workers(tmp_path, make_package)
    try:
        seen = set(worker_pids(proc.pid))
        victim = min(seen)
        kills = 0
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            if victim is not None:
                os.kill(victim, signal.SIGKILL)
                kills += 1
            new = set(worker_pids(proc.pid)) - seen
            seen |= new
            victim = min(new) if new else None
            time.sleep(0.02)
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert rc == 1, text
    assert kills == CRASH_LOOP_DEATHS, text
    last = text.strip().splitlines()[-1]
    assert last.startswith("ERROR:service.workers:stopped: worker "), text
    assert f"died {CRASH_LOOP_DEATHS} times in 60 s, the last time killed by SIGKILL" in last
    assert "Traceback" not in text


def test_how_a_worker_ended_is_told_in_words() -> None:
    assert describe(-signal.SIGKILL) == "killed by SIGKILL"
    assert describe(-signal.SIGSEGV) == "killed by SIGSEGV"
    assert describe(1) == "exited with status 1"


def test_a_worker_asked_to_give_up_connections_closes_them_after_their_next_response() -> None:
    """service.server.Shed: the parent asked for 2 (asked), so the next 2 responses say
    `Connection: close` (their clients reconnect, and the dealer places them); the third
    keeps its connection."""

    async def app(scope: dict, receive: Callable, send: Callable) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    asked, done = [0, 2], [0, 0]
    shedding = Shed(asked, done, 1).wrap(app)

    async def headers() -> list[tuple[bytes, bytes]]:
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        await shedding({"type": "http"}, None, send)
        return sent[0]["headers"]

    got = [asyncio.run(headers()) for _ in range(3)]
    assert got == [[(b"connection", b"close")], [(b"connection", b"close")], []]
    assert done == [0, 2]
