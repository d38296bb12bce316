"""Several server processes on one port (`--workers N`), supervised: the way to use a
many-core host.

    python -m service --model-dir models --workers 2

The parent listens on the port and deals each connection to a worker (service.dealer); it
starts N workers (spawned, not forked: ONNX Runtime and the tokenizers pool hold threads a
fork would copy half-alive). Each runs the whole service — its own event loop, its own
sessions, intra_op_threads = its share of the cores unless set — on the connections it is
dealt (service.server's `Inbox`). Why not uvicorn's own `workers`: its children run a plain
`uvicorn.Server`, without the /ready-503-on-SIGTERM drain of `service.server`, and settings
given as flags would not reach them.

- A worker that dies unasked (a crash; SIGKILL from the OOM killer) is replaced, as uvicorn's
  and gunicorn's supervisors replace theirs (they at once); the others serve on and the port
  stays open (the parent holds it). The requests on the dead worker's connections are lost with it; new connections go to
  the workers that serve, and /ready stays 200 while one does. The replacement starts after
  0.5 s, doubled for each death of that slot in the last minute, so a crash loop does not
  spin. Once it has loaded, it gets new connections again, and each other worker holding
  more than its share gives up the excess: the next responses on that many of its
  connections say `Connection: close` (service.server.Shed), and their clients' new
  connections go to the replacement. Without it keep-alive clients would stay where they
  reconnected after the death, all on the survivors, and the replacement would idle.
- A crash loop stops the server: the 5th death of one slot within 60 s is logged with how
  that worker ended (exit status or signal), the others are stopped and the parent exits 1.
  uvicorn and gunicorn stop at the first worker that fails while starting; here a worker
  killed while loading (memory taken by something else for a moment) gets its retries.
  Not covered: a worker that hangs without dying stays (uvicorn pings its workers, gunicorn
  watches a heartbeat file; nothing here does yet).
- /metrics: `bert_heads_worker_restarts_total{worker}` counts the replacements per slot
  (service.metrics.WorkerRestarts: the parent's count, read by whichever worker answers).
- The workers never outlive the parent: each asks the kernel for SIGTERM when the parent dies,
  even by SIGKILL (Linux's PR_SET_PDEATHSIG; elsewhere its inbox's end of file does the same
  once it serves) and drains as on an orderly stop.
- SIGTERM / SIGINT to the parent: it passes the signal on and keeps dealing; each worker
  drains like a single process does (/ready 503, in-flight requests finish within
  drain_timeout) and stops taking connections when it would close its listening socket; once
  none takes them the parent closes the port, and exits 0.
- /ready says `loading` until every worker has tried its packages (a shared flag per worker),
  so a load balancer never sends traffic to a worker still opening its sessions.
- /metrics sums every worker (prometheus_client's multiprocess mode, files in a private
  temporary folder): counters and histograms add up, the dead workers' counts included;
  queue_depth is the sum over live workers; model_info is the max. `_created` samples are
  absent in that mode.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from multiprocessing.context import SpawnContext, SpawnProcess
from multiprocessing.sharedctypes import Synchronized, SynchronizedArray
from types import FrameType
from typing import Any

from prometheus_client import multiprocess

from service.dealer import POLL_SECONDS, Dealer, listen
from service.registry import LoadFlags
from service.runtime import usable_cores
from service.settings import Settings

log = logging.getLogger("service.workers")
CRASH_LOOP_DEATHS, CRASH_LOOP_SECONDS = 5, 60.0  # of one slot: then the server stops
FIRST_BACKOFF_SECONDS = 0.5  # before a replacement; doubled per death in the last minute
# After a replacement has loaded, how long connections are moved to it: a `Connection: close`
# that lands on a connection its client closed anyway moves nothing, so the parent asks again
REBALANCE_SECONDS = 10.0
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def share_of_cores(workers: int) -> int:
    """Intra-op threads for each of `workers` processes: the usable cores split evenly, at
    least 1."""
    return max(1, usable_cores() // workers)


def describe(exitcode: int) -> str:
    """How a worker ended, from multiprocessing's exit code: "killed by SIGKILL" (-9),
    "exited with status 1"."""
    if exitcode >= 0:
        return f"exited with status {exitcode}"
    try:
        return f"killed by {signal.Signals(-exitcode).name}"
    except ValueError:
        return f"killed by signal {-exitcode}"


@dataclass
class Shared:
    """What the parent and its workers share, one slot per worker: `loaded` and `started`
    (service.registry.LoadFlags: /ready, and which workers the dealer may choose), `closed`
    (connections the worker closed: the dealer's count), `restarts` (the parent's count,
    shown at /metrics), `shed_asked` and `shed_done` (connections the parent asked the worker
    to give up, and those it did: service.server.Shed)."""

    loaded: SynchronizedArray[Any]
    started: Synchronized[Any]
    closed: Any  # RawArrays of int64
    restarts: Any
    shed_asked: Any
    shed_done: Any

    @classmethod
    def create(cls, ctx: SpawnContext, n: int) -> Shared:
        counts = [ctx.RawArray("q", n) for _ in range(4)]
        return cls(ctx.Array("b", n), ctx.Value("b", 0), *counts)


def _worker(
    settings: Settings, channel: socket.socket, shared: Shared, i: int, parent: int
) -> None:
    # Ctrl-C reaches the whole process group, and the parent turns it into SIGTERM for every
    # worker: a worker takes no SIGINT of its own. Blocked from before this process existed
    # (see Supervisor._start), so one that arrives while it imports is dropped, not raised.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    _die_with_parent(parent)
    from service.server import Inbox, Shed, WorkerLink, serve

    def count_close() -> None:
        shared.closed[i] += 1  # this process alone writes its slot

    link = WorkerLink(
        inbox=Inbox(channel, count_close),
        load_flags=LoadFlags(shared.loaded, i, shared.started),
        restarts=shared.restarts,
        shed=Shed(shared.shed_asked, shared.shed_done, i),
    )
    serve(settings, link)


def _die_with_parent(parent: int) -> None:
    """Have the kernel send this process SIGTERM when `parent` dies, however it dies."""
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            log.warning("prctl(PR_SET_PDEATHSIG): errno %d", ctypes.get_errno())
    if os.getppid() != parent:  # it died before the request above
        os.kill(os.getpid(), signal.SIGTERM)


@dataclass
class Slot:
    """One worker's place: its process now, the deaths the crash-loop rule counts, when its
    replacement is due, and how its last process ended."""

    process: SpawnProcess | None = None
    serving: bool = False  # its process has loaded its packages
    signalled: bool = False  # its process was sent SIGTERM
    deaths: deque[float] = field(default_factory=deque)
    restart_at: float | None = None
    exitcode: int | None = None


class Supervisor:
    """Start settings.workers workers, replace those that die, stop them all on `stop`."""

    def __init__(self, settings: Settings, listener: socket.socket) -> None:
        self.settings, self.listener = settings, listener
        self.ctx = multiprocessing.get_context("spawn")
        n = settings.workers
        self.shared = Shared.create(self.ctx, n)
        self.slots = [Slot() for _ in range(n)]
        self.dealer = Dealer(
            listener, [None] * n, self.shared.closed, self.shared.loaded, self.shared.started
        )
        self.stopping = False
        self.crash: str | None = None  # why the server stopped on its own
        self.rebalance_until = 0.0

    def run(self) -> int:
        """Serve until stopped; the exit status."""
        for i in range(len(self.slots)):
            self._start(i)
        self.dealer.start()
        log.info(
            "%d workers on %s:%d, %d intra-op threads each", len(self.slots),
            self.settings.host, self.listener.getsockname()[1], self.settings.intra_op_threads,
        )  # fmt: skip
        while not (self.stopping and all(s.process is None for s in self.slots)):
            # returns at once when a worker ends
            wait([s.process.sentinel for s in self.slots if s.process], POLL_SECONDS)
            now = time.monotonic()
            if self.stopping:
                self._terminate()
            for i, slot in enumerate(self.slots):
                if slot.process is not None and slot.process.exitcode is not None:
                    self._bury(i, now)
                elif slot.process is not None and not slot.serving and self.shared.loaded[i]:
                    slot.serving = True
                    if slot.deaths:
                        log.warning(
                            "worker %d (pid %d) serves again, %.1f s after the last death",
                            i, slot.process.pid, now - slot.deaths[-1],
                        )  # fmt: skip
                        self.rebalance_until = now + REBALANCE_SECONDS
                elif slot.restart_at is not None and now >= slot.restart_at and not self.stopping:
                    slot.restart_at = None
                    self.shared.restarts[i] += 1
                    self._start(i)
            if now < self.rebalance_until and not self.stopping:
                self._rebalance()
        if self.crash is not None:
            log.error("stopped: %s", self.crash)
            return 1
        # a drained worker exits 0; one signalled before its server took the signal over (still
        # importing) dies by it: both are a clean stop
        ended = [s.exitcode for s in self.slots if s.restart_at is None]
        return 0 if all(code in (0, -signal.SIGTERM) for code in ended) else 1

    def stop(self, sig: int | None = None, frame: FrameType | None = None) -> None:
        """Stop every worker (they drain) and replace none; `run` returns once all ended."""
        if not self.stopping:
            log.info("stopping %d workers", len(self.slots))
        self.stopping = self.dealer.stopping = True
        self._terminate()

    def close(self) -> None:
        """Kill what still runs (`run` failed) and stop dealing."""
        for slot in self.slots:
            if slot.process is not None:
                if slot.process.exitcode is None:
                    slot.process.kill()
                slot.process.join()
        self.dealer.stop()
        for i in range(len(self.slots)):
            self.dealer.retire(i)

    def _start(self, i: int) -> None:
        # From the main thread only: the kernel's parent-death signal follows the thread
        # that started the child, not the process.
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.dealer.replace(i, parent_end)
        self.shared.shed_asked[i] = self.shared.shed_done[i] = 0
        process = self.ctx.Process(
            target=_worker, args=(self.settings, child_end, self.shared, i, os.getpid()),
            name=f"worker-{i}",
        )  # fmt: skip
        # the child inherits the blocked SIGINT through fork and exec; here it waits until the
        # unblock, so a Ctrl-C during the start still stops the parent
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        child_end.close()  # the worker has its own: its end closing is its "no more"
        slot = self.slots[i]
        slot.process, slot.serving, slot.signalled = process, False, False

    def _rebalance(self) -> None:
        """Ask each serving worker for its connections above an even share of what all the
        serving workers hold (rounded up), less those it was asked for and still holds."""
        serving = [i for i, s in enumerate(self.slots) if s.serving]
        if not serving:
            return
        held = {i: self.dealer.dealt[i] - self.shared.closed[i] for i in serving}
        share = -(-sum(held.values()) // len(serving))
        for i in serving:
            pending = self.shared.shed_asked[i] - self.shared.shed_done[i]
            if held[i] - pending > share:
                self.shared.shed_asked[i] += held[i] - pending - share

    def _terminate(self) -> None:
        # Always SIGTERM: a Ctrl-C reaches the workers too, and a second SIGINT would make
        # uvicorn skip the drain.
        for slot in self.slots:
            p = slot.process
            if p is not None and p.pid is not None and p.exitcode is None and not slot.signalled:
                slot.signalled = True
                os.kill(p.pid, signal.SIGTERM)

    def _bury(self, i: int, now: float) -> None:
        """Slot i's process has ended: forget it and, unless stopping, schedule its
        replacement or, on the crash loop's last death, stop the server."""
        slot = self.slots[i]
        process, slot.process, slot.serving = slot.process, None, False
        assert process is not None and process.pid is not None
        process.join()
        code = slot.exitcode = process.exitcode
        assert code is not None
        self.dealer.retire(i)
        self.shared.loaded[i] = 0
        multiprocess.mark_process_dead(process.pid)  # its queue depth leaves the sums
        if self.stopping:
            return
        slot.deaths.append(now)
        while slot.deaths[0] < now - CRASH_LOOP_SECONDS:
            slot.deaths.popleft()
        how = describe(code)
        if len(slot.deaths) >= CRASH_LOOP_DEATHS:
            self.crash = (
                f"worker {i} died {len(slot.deaths)} times in {CRASH_LOOP_SECONDS:.0f} s, "
                f"the last time {how} (pid {process.pid})"
            )
            log.error("%s; stopping the server", self.crash)
            self.stop()
            return
        delay = FIRST_BACKOFF_SECONDS * 2 ** (len(slot.deaths) - 1)
        slot.restart_at = now + delay
        log.warning("worker %d (pid %d) %s; replacing it in %.1f s", i, process.pid, how, delay)


def run_workers(settings: Settings) -> int:
    """Serve with settings.workers processes; return the exit status."""
    if settings.intra_op_threads == 0:
        threads = share_of_cores(settings.workers)
        settings = settings.model_copy(update={"intra_op_threads": threads})
    metrics_dir = tempfile.mkdtemp(prefix="bert-heads-metrics-")
    # Read by prometheus_client when a worker imports it: every worker writes its samples there
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    listener = listen(settings.host, settings.port)
    supervisor = Supervisor(settings, listener)
    signal.signal(signal.SIGTERM, supervisor.stop)
    signal.signal(signal.SIGINT, supervisor.stop)
    try:
        return supervisor.run()
    finally:
        supervisor.close()
        listener.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)
