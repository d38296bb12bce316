"""Several server processes on one port (`--workers N`): the way to use a many-core host.

The parent binds the socket once and starts N children (spawned, not forked: ONNX Runtime and
the tokenizers pool hold threads a fork would copy half-alive). Each child runs the whole
service — its own event loop, its own sessions, intra_op_threads = its share of the cores
unless set — and accepts from the shared socket, so the kernel hands each connection to
whichever child is free. Why not uvicorn's own `workers`: its children run a plain
`uvicorn.Server`, without the /ready-503-on-SIGTERM drain of `service.server`, and settings
given as flags would not reach them.

- /ready says `loading` until every worker has tried its packages (a shared flag per worker),
  so a load balancer never sends traffic to a worker still opening its sessions.
- SIGTERM / SIGINT to the parent: it closes its copy of the socket and passes the signal on;
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
from service.settings import Settings

log = logging.getLogger("service.workers")
POLL_SECONDS = 0.2


def share_of_cores(workers: int) -> int:
    """Intra-op threads for each of `workers` processes: the cores this process may use
    (its CPU affinity, which a container's cpuset narrows) split evenly, at least 1."""
    return max(1, len(os.sched_getaffinity(0)) // workers)


def bind(settings: Settings) -> socket.socket:
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((settings.host, settings.port))
    sock.listen(2048)  # uvicorn's default backlog
    sock.set_inheritable(True)
    return sock


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
    sock = bind(settings)
    ctx = multiprocessing.get_context("spawn")
    flags = ctx.Array("b", n)
    children = [
        ctx.Process(target=_worker, args=(settings, sock, LoadFlags(flags, i)), name=f"worker-{i}")
        for i in range(n)
    ]
    stopping, crashed = [False], [False]

    def stop(sig: int, frame: FrameType | None) -> None:
        if stopping[0]:
            return
        stopping[0] = True
        log.info("stopping %d workers", n)
        sock.close()  # the children's copies keep accepting until each one drains
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
            n, settings.host, sock.getsockname()[1], settings.intra_op_threads,
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
        sock.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)
