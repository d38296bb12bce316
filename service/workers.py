"""Several server processes on one port (`--workers N`): the way to use a many-core host.

The parent binds one listening socket per child on the port (SO_REUSEPORT, see `bind`) and
starts N children (spawned, not forked: ONNX Runtime and the tokenizers pool hold threads a
fork would copy half-alive). Each child runs the whole service — its own event loop, its own
sessions, intra_op_threads = its share of the cores unless set — and accepts from its own
socket, to which the kernel hands a share of the new connections. Why not uvicorn's own `workers`: its children run a plain
`uvicorn.Server`, without the /ready-503-on-SIGTERM drain of `service.server`, and settings
given as flags would not reach them.

- /ready says `loading` until every worker has tried its packages (a shared flag per worker),
  so a load balancer never sends traffic to a worker still opening its sessions.
- SIGTERM / SIGINT to the parent: it closes its copies of the sockets and passes the signal on;
  each child drains like a single process does (/ready 503, in-flight requests finish within
  drain_timeout). A child that dies on its own takes the others down and the parent exits 1:
  restarting is the orchestrator's job, and a half-sized replica would pass its probes.
- /metrics sums every worker (prometheus_client's multiprocess mode, files in a private
  temporary folder): counters and histograms add up; queue_depth is the sum over live workers;
  model_info is the max. `_created` samples are absent in that mode.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import time
from types import FrameType

from service.registry import LoadFlags
from service.runtime import usable_cores
from service.settings import Settings

log = logging.getLogger("service.workers")
POLL_SECONDS = 0.2


def share_of_cores(workers: int) -> int:
    """Intra-op threads for each of `workers` processes: the usable cores split evenly, at
    least 1."""
    return max(1, usable_cores() // workers)


def _bound(host: str, port: int, reuse_port: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def bind(settings: Settings, n: int) -> list[socket.socket]:
    """`n` listening sockets on one port (SO_REUSEPORT), one per worker: the kernel spreads new
    connections over them by a hash of each connection. One socket shared by all let the first
    worker to wake accept a whole burst of keep-alive connections: 8 clients on 2 workers
    (MiniLM int8, 1 thread each), 3 trials in 6 left a worker with none (0.0 s of CPU against
    2.6, 478 requests/s against 543-567 when shared)."""
    # A port another process holds fails here as it always did: SO_REUSEPORT would let a second
    # server (same user) join the port silently, so the port is taken without it first.
    with _bound(settings.host, settings.port, reuse_port=False) as probe:
        port = probe.getsockname()[1]
    socks = [_bound(settings.host, port, reuse_port=True) for _ in range(n)]
    for sock in socks:
        sock.listen(2048)  # uvicorn's default backlog
        sock.set_inheritable(True)
    return socks


def _worker(settings: Settings, sock: socket.socket, flags: LoadFlags) -> None:
    from service.server import serve

    serve(settings, sockets=[sock], load_flags=flags)


def run_workers(settings: Settings) -> int:
    """Serve with settings.workers processes; return the exit status."""
    n = settings.workers
    if settings.intra_op_threads == 0:
        settings = settings.model_copy(update={"intra_op_threads": share_of_cores(n)})
    metrics_dir = tempfile.mkdtemp(prefix="bert-heads-metrics-")
    # Read by prometheus_client when a child imports it: every worker writes its samples there
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    socks = bind(settings, n)
    ctx = multiprocessing.get_context("spawn")
    flags = ctx.Array("b", n)
    children = [
        ctx.Process(target=_worker, args=(settings, sock, LoadFlags(flags, i)), name=f"worker-{i}")
        for i, sock in enumerate(socks)
    ]
    stopping, crashed = [False], [False]

    def stop(sig: int, frame: FrameType | None) -> None:
        if stopping[0]:
            return
        stopping[0] = True
        log.info("stopping %d workers", n)
        for sock in socks:
            sock.close()  # each child's copy of its own keeps accepting until it drains
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
        log.info(
            "%d workers on %s:%d, %d intra-op threads each",
            n, settings.host, socks[0].getsockname()[1], settings.intra_op_threads,
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
        for sock in socks:
            sock.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)
