"""Several server processes on one port (`--workers N`): the way to use a many-core host.

The parent listens on the port and deals each new connection to the child with the fewest
open ones (`Dealer`: the accepted socket travels over a Unix socket pair, SCM_RIGHTS); it
starts N children (spawned, not forked: ONNX Runtime and the tokenizers pool hold threads a
fork would copy half-alive). Each child runs the whole service — its own event loop, its own
sessions, intra_op_threads = its share of the cores unless set — on the connections it is
dealt (service.server's `Inbox`). The parent only accepts: a keep-alive connection's requests
go straight to its child. Why not uvicorn's own `workers`: its children run a plain
`uvicorn.Server`, without the /ready-503-on-SIGTERM drain of `service.server`, and settings
given as flags would not reach them.

- /ready says `loading` until every worker has tried its packages (a shared flag per worker),
  so a load balancer never sends traffic to a worker still opening its sessions.
- SIGTERM / SIGINT to the parent: it passes the signal on and keeps dealing; each child
  drains like a single process does (/ready 503, in-flight requests finish within
  drain_timeout) and stops taking connections when it would close its listening socket; once
  none takes them the parent closes the port. A child that dies on its own takes the others
  down and the parent exits 1: restarting is the orchestrator's job, and a half-sized replica
  would pass its probes.
- /metrics sums every worker (prometheus_client's multiprocess mode, files in a private
  temporary folder): counters and histograms add up; queue_depth is the sum over live workers;
  model_info is the max. `_created` samples are absent in that mode.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import selectors
import shutil
import signal
import socket
import tempfile
import threading
import time
from types import FrameType
from typing import Any

from service.registry import LoadFlags
from service.runtime import usable_cores
from service.settings import Settings

log = logging.getLogger("service.workers")
POLL_SECONDS = 0.2


def share_of_cores(workers: int) -> int:
    """Intra-op threads for each of `workers` processes: the usable cores split evenly, at
    least 1."""
    return max(1, usable_cores() // workers)


def listen(settings: Settings) -> socket.socket:
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((settings.host, settings.port))
    sock.listen(2048)  # uvicorn's default backlog
    return sock


class Dealer:
    """The parent's side: accept on the port and hand each connection to the child with the
    fewest open (dealt minus closed; the child counts its closes in `closed`), the lowest
    index on a tie. The kernel's own spreading (a socket per child with SO_REUSEPORT) hashes
    each connection: 8 keep-alive clients on 2 workers split 6/2 or worse 29% of the time,
    and one listening socket shared by all let the first worker to wake accept a whole burst
    (3 trials in 6 left a worker with none; issue 31). A child that no longer takes
    connections (draining, gone) is skipped; with none left a connection is closed at once."""

    def __init__(self, listener: socket.socket, channels: list[socket.socket], closed: Any):
        self.listener, self.channels, self.closed = listener, channels, closed
        listener.setblocking(False)  # another wake-up may have taken the connection
        self.dealt = [0] * len(channels)
        self.taking = [True] * len(channels)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dealer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(self.listener, selectors.EVENT_READ)
            while not self._stop.is_set():
                if not sel.select(POLL_SECONDS):
                    continue
                try:
                    conn, _ = self.listener.accept()
                except OSError:  # BlockingIOError: another wake-up took it
                    continue
                with conn:  # the child holds its own copy once sent
                    self.deal(conn)

    def deal(self, conn: socket.socket) -> int | None:
        """The child `conn` went to, or None when no child takes connections."""
        load = [self.dealt[i] - self.closed[i] for i in range(len(self.channels))]
        for i in sorted(range(len(load)), key=load.__getitem__):
            if not self.taking[i]:
                continue
            try:
                socket.send_fds(self.channels[i], [b"c"], [conn.fileno()])
            except OSError:  # the child closed its end: it takes no more
                self.taking[i] = False
                continue
            self.dealt[i] += 1
            return i
        return None


def _worker(
    settings: Settings, inbox: socket.socket, closed: Any, i: int, flags: LoadFlags
) -> None:
    from service.server import Inbox, serve

    def count_close() -> None:
        closed[i] += 1  # this process alone writes its slot

    serve(settings, inbox=Inbox(inbox, count_close), load_flags=flags)


def run_workers(settings: Settings) -> int:
    """Serve with settings.workers processes; return the exit status."""
    n = settings.workers
    if settings.intra_op_threads == 0:
        settings = settings.model_copy(update={"intra_op_threads": share_of_cores(n)})
    metrics_dir = tempfile.mkdtemp(prefix="bert-heads-metrics-")
    # Read by prometheus_client when a child imports it: every worker writes its samples there
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    listener = listen(settings)
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(n)]
    ctx = multiprocessing.get_context("spawn")
    flags = ctx.Array("b", n)
    closed = ctx.RawArray("q", n)
    children = [
        ctx.Process(
            target=_worker, args=(settings, child_end, closed, i, LoadFlags(flags, i)),
            name=f"worker-{i}",
        )
        for i, (_, child_end) in enumerate(pairs)
    ]  # fmt: skip
    dealer = Dealer(listener, [parent_end for parent_end, _ in pairs], closed)
    stopping, crashed = [False], [False]

    def stop(sig: int, frame: FrameType | None) -> None:
        if stopping[0]:
            return
        stopping[0] = True
        log.info("stopping %d workers", n)
        # Always SIGTERM: a Ctrl-C reaches the children too, and a second SIGINT would make
        # uvicorn skip the drain.
        for child in children:
            if child.pid is not None and child.exitcode is None:
                os.kill(child.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        for child in children:
            child.start()
        for _, child_end in pairs:
            child_end.close()  # the child has its own: its end closing is its "no more"
        dealer.start()
        log.info(
            "%d workers on %s:%d, %d intra-op threads each",
            n, settings.host, listener.getsockname()[1], settings.intra_op_threads,
        )  # fmt: skip
        while any(child.exitcode is None for child in children):
            if not stopping[0] and any(child.exitcode is not None for child in children):
                log.error("a worker exited unasked; stopping the others")
                crashed[0] = True
                stop(signal.SIGTERM, None)
            time.sleep(POLL_SECONDS)
        # a drained worker exits 0; one signalled before its server took the signal over (still
        # importing) dies by it: both are a clean stop
        clean = (0, -signal.SIGTERM)
        return 1 if crashed[0] or any(c.exitcode not in clean for c in children) else 0
    finally:
        for child in children:
            if child.exitcode is None:
                child.kill()
            child.join()
        dealer.stop()
        listener.close()
        for parent_end, _ in pairs:
            parent_end.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)
