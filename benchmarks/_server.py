"""The real server as a subprocess (`python -m service`) on 127.0.0.1, serving one package,
and what it says about itself at /metrics: per-stage time, batch sizes and padded tokens."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks._cpu import stat_seconds
from benchmarks._paths import portable, shown

REPO = Path(__file__).resolve().parents[1]
# `python -m service` after a prelude (python -c): the same start, argv included
RUN_SERVICE = "\nimport runpy; runpy.run_module('service', run_name='__main__', alter_sys=True)"


# What `benchmarks._paths.shown` cannot make relative: a scratch build or another checkout.
_SCRATCH = re.compile(r"(?<![\w.])/(?:tmp|work|home|root|var|mnt|data|opt)(?:/[^\s/`'\"]+)+")


def local_paths(value: Any) -> Any:
    """`value` (JSON-like) with each absolute scratch path written as `<local>/<last part>`:
    results name what was measured, never where it lay on this machine."""
    return portable(value, _local_path)


def _local_path(text: str) -> str:
    return _SCRATCH.sub(lambda m: "<local>/" + m.group(0).rsplit("/", 1)[1], shown(text))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _process_tree(pid: int) -> list[int]:
    """`pid` and its descendants alive now."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except OSError:  # ended meanwhile
            continue
    return out


def worker_pids(pid: int) -> list[int]:
    """The worker processes `python -m service --workers N` (parent `pid`) spawned, not its
    resource tracker; [] once `pid` has ended."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    out = []
    for c in children:
        try:
            if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes():
                out.append(int(c))
        except OSError:  # ended meanwhile
            continue
    return out


class Server:
    def __init__(self, process: subprocess.Popen, base_url: str, log: Path) -> None:
        self.process, self.base_url, self.log = process, base_url, log

    def cpu_seconds(self) -> float:
        """User + system CPU time so far of the server process and its live children (the
        workers of --workers N, which would otherwise count as other people's work)."""
        return sum(self.cpu_by_process().values())

    def cpu_by_process(self) -> dict[int, float]:
        """cpu_seconds per live process: {pid: seconds}, the server's and its children's."""
        out = {}
        for pid in _process_tree(self.process.pid):
            try:
                out[pid] = stat_seconds(f"/proc/{pid}/stat")
            except OSError:  # ended meanwhile
                continue
        return out

    def metrics(self) -> dict[str, float]:
        """/metrics as {'name{label=value,...}': value} for the bert_heads_* histograms and
        counters the report reads."""
        text = httpx.get(self.base_url + "/metrics", timeout=10).text
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model")
                out[f"{s.name}{{{labels}}}"] = s.value
        return out


@contextmanager
def serve(
    package: Path,
    variant: str,
    threads: int,
    spinning: bool,
    extra: list[str],
    *,
    root: Path = REPO,
    prelude: str = "",
    env: dict[str, str] | None = None,
) -> Iterator[Server]:
    """Start the service on `package` alone, wait for /ready, stop it afterwards.

    root: the source tree whose `service` runs (another checkout, to measure old code beside
    new); prelude: Python run in the server process before the service starts."""
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        model_dir = Path(tmp) / "models"
        model_dir.mkdir()
        (model_dir / package.name).symlink_to(package.resolve())
        port = free_port()
        log = Path(tmp) / "server.log"
        start = ["-c", prelude + RUN_SERVICE] if prelude else ["-m", "service"]
        args = [
            sys.executable, *start,
            "--model-dir", str(model_dir), "--port", str(port),
            "--variant", variant, "--intra-op-threads", str(threads),
            "--intra-op-spinning" if spinning else "--no-intra-op-spinning",
            # 128 clients must never meet the 429 guard: it is admission control, not speed
            "--max-concurrent-requests", "4096",
            "--log-level", "warning", *extra,
        ]  # fmt: skip
        with running(args, root, env, port, log) as server:
            yield server


@contextmanager
def running(
    args: list[str],
    cwd: Path,
    env: dict[str, str] | None,
    port: int,
    log: Path,
    ready: str = "/ready",
) -> Iterator[Server]:
    """Run `args` (a server listening on `port`), wait until `ready` answers 200, SIGTERM it
    afterwards."""
    # cwd first on the path: its `service` runs even where another tree is pip-installed
    path = os.pathsep.join(filter(None, [str(cwd), os.environ.get("PYTHONPATH")]))
    environ = {**os.environ, "PYTHONPATH": path, **(env or {})}
    with log.open("w") as sink:
        process = subprocess.Popen(
            args, cwd=cwd, env=environ, stdout=sink, stderr=subprocess.STDOUT
        )
    server = Server(process, f"http://127.0.0.1:{port}", log)
    try:
        _wait_ready(server, timeout=180, path=ready)
        yield server
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_ready(server: Server, timeout: float, path: str = "/ready") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"the server exited at start-up:\n{server.log.read_text()[-3000:]}")
        try:
            if httpx.get(server.base_url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server was not ready in {timeout:.0f} s")


def stage_profile(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """Where the server's time went between two scrapes: mean seconds per request of each
    stage, mean rows and padded tokens per forward pass, and forward passes."""

    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    def find(name: str, **labels: str) -> str:
        for key in after:
            if key.startswith(name + "{") and all(f"{k}={v}" in key for k, v in labels.items()):
                return key
        return name + "{}"

    out: dict[str, Any] = {}
    requests = delta(find("bert_heads_request_duration_seconds_count"))
    if requests:
        total = delta(find("bert_heads_request_duration_seconds_sum"))
        out["request_ms"] = round(1000 * total / requests, 3)
    for stage in ("tokenization", "queue_wait", "postprocess"):
        n = delta(find("bert_heads_stage_duration_seconds_count", stage=stage))
        if n:
            s = delta(find("bert_heads_stage_duration_seconds_sum", stage=stage))
            out[f"{stage}_ms"] = round(1000 * s / n, 3)
    batches = delta(find("bert_heads_batch_size_count"))
    if batches:
        infer = delta(find("bert_heads_stage_duration_seconds_sum", stage="inference"))
        out["batches"] = int(batches)
        out["inference_ms_per_batch"] = round(1000 * infer / batches, 3)
        out["inference_busy_s"] = round(infer, 3)
        out["rows_per_batch"] = round(delta(find("bert_heads_batch_size_sum")) / batches, 2)
        out["padded_tokens"] = int(delta(find("bert_heads_batch_tokens_sum")))
    return out
