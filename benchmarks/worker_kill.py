"""Workers killed under load (issue 48): `python -m service --workers 2`, closed-loop clients on
/classify (one keep-alive connection each); SIGKILL one worker (what the OOM killer does),
later the other, then SIGTERM the parent. For each phase: requests answered, failed requests
by kind, the connections the killed worker held (each had at most one request in flight), and
the seconds until throughput is back to the pre-kill level.

    python -m benchmarks.worker_kill                      # a tiny classifier, built here
    python -m benchmarks.worker_kill --package models/demo-sentiment --clients 32 --tag demo

Failure kinds: `refused` (connection refused: the port is closed), `reset` (the connection was
reset or closed before an answer came), `5xx` (the status), `timeout`, `other`. Back to full
capacity: the first moment after the kill from which answers over the next 2 s come at 90% of
the pre-kill rate or more.

Results: benchmarks/results/worker_kill[-tag].{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from benchmarks import _server
from benchmarks._cpu import CLOCK_TICKS
from benchmarks._machine import cpu_name
from benchmarks._paths import write_results

TEXT = "a fine film with a weak ending"
RECOVERED, WINDOW = 0.9, 2.0  # of the pre-kill rate, over this many seconds
POLL = 0.05


def kind_of(exc: BaseException) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    codes, e = [], exc
    while e is not None:  # the OS error under httpx's and httpcore's
        codes.append(getattr(e, "errno", None))
        e = e.__cause__ or e.__context__
    if errno.ECONNREFUSED in codes or "refused" in str(exc).lower():
        return "refused"
    if {errno.ECONNRESET, errno.EPIPE} & set(codes):
        return "reset"
    if isinstance(exc, httpx.ReadError | httpx.WriteError | httpx.RemoteProtocolError):
        return "reset"  # closed before an answer came
    code = next((errno.errorcode.get(c, str(c)) for c in codes if c), "")
    return f"other: {type(exc).__name__}" + (f" ({code})" if code else "")


def held_connections(pid: int, port: int) -> int:
    """Established TCP connections on `port` whose socket process `pid` holds."""
    inodes = set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:  # it has ended
        return 0
    for fd in fds:
        try:
            link = os.readlink(fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:[") : -1])
    held = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "01" and int(f[1].rsplit(":", 1)[1], 16) == port and f[9] in inodes:
                held += 1
    return held


async def client(url: str, records: list[tuple[float, str]], stop: asyncio.Event) -> None:
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with httpx.AsyncClient(base_url=url, timeout=10, limits=limits) as c:
        while not stop.is_set():
            try:
                r = await c.post("/classify", json={"inputs": TEXT})
                kind = "ok" if r.status_code == 200 else f"{r.status_code // 100}xx"
            except httpx.HTTPError as exc:
                kind = kind_of(exc)
            records.append((time.monotonic(), kind))
            if kind != "ok":
                await asyncio.sleep(POLL)  # a closed port refuses at once: no busy loop


def cpu_snapshot(server: _server.Server) -> dict[str, Any]:
    """CPU seconds so far: the whole machine's busy time, this harness's, each server
    process's (a worker killed meanwhile leaves the tree: its last seconds go uncounted)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    busy = sum(fields[:8]) - fields[3] - fields[4]  # all but idle and iowait
    return {"t": time.monotonic(), "machine": busy / CLOCK_TICKS, "harness": time.process_time(),
            "server": server.cpu_by_process()}  # fmt: skip


def cores(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    """Cores used between two snapshots by the server, this harness and everybody else."""
    wall = b["t"] - a["t"]
    server = sum(v - a["server"].get(pid, 0.0) for pid, v in b["server"].items()) / wall
    harness = (b["harness"] - a["harness"]) / wall
    others = (b["machine"] - a["machine"]) / wall - server - harness
    return {"server": round(server, 2), "harness": round(harness, 2),
            "others": round(max(0.0, others), 2)}  # fmt: skip


async def until(predicate: Any, timeout: float) -> float | None:
    """Seconds until `predicate()` is true, polled; None past `timeout`."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return round(time.monotonic() - start, 2)
        await asyncio.sleep(POLL)
    return None


async def scenario(server: _server.Server, port: int, cli: argparse.Namespace) -> dict:
    records: list[tuple[float, str]] = []
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(client(server.base_url, records, stop)) for _ in range(cli.clients)
    ]
    marks: dict[str, float] = {}
    cpu: dict[str, dict[str, Any]] = {}

    def mark(name: str) -> None:
        cpu[name], marks[name] = cpu_snapshot(server), time.monotonic()

    def serving_again() -> int:
        return server.log.read_text().count("serves again")

    parent = server.process.pid
    await asyncio.sleep(cli.warmup)
    mark("baseline")
    await asyncio.sleep(cli.baseline)
    kills = []
    for n, victim in enumerate(_server.worker_pids(parent), 1):
        held, served, before = held_connections(victim, port), serving_again(), {victim}
        before |= set(_server.worker_pids(parent))
        mark(f"kill {n}")
        with contextlib.suppress(ProcessLookupError):  # gone: a server that stopped at kill 1
            os.kill(victim, signal.SIGKILL)
        started = await until(lambda b=before: set(_server.worker_pids(parent)) - b, cli.after)
        serving = await until(lambda s=served: serving_again() > s, cli.after)
        kills.append({"victim": victim, "held_connections": held,
                      "replacement_started_s": started, "replacement_serving_s": serving})  # fmt: skip
        await asyncio.sleep(max(0.0, marks[f"kill {n}"] + cli.after - time.monotonic()))
    mark("SIGTERM")
    server.process.send_signal(signal.SIGTERM)
    exited = await until(lambda: server.process.poll() is not None, 60)
    await asyncio.sleep(cli.tail)  # what clients meet once the port is closed
    mark("end")
    stop.set()
    await asyncio.gather(*tasks)
    names = list(marks)
    return {
        "phases": [
            {**p, "cpu_cores": cores(cpu[name], cpu[end])}
            for p, name, end in zip(phases(records, marks), names, names[1:], strict=False)
        ],
        "kills": [{**k, **recovery(records, marks, n)} for n, k in enumerate(kills, 1)],
        "parent_exit": {"status": server.process.returncode, "seconds": exited},
        "answered_per_half_second": series(records, marks),
        "log_lines": [
            line for line in server.log.read_text().splitlines() if "service.workers" in line
        ],  # fmt: skip
    }


def phases(records: list[tuple[float, str]], marks: dict[str, float]) -> list[dict]:
    names = list(marks)
    out = []
    for name, end in zip(names, names[1:], strict=False):
        start = marks[name]
        kinds = Counter(k for t, k in records if start <= t < marks[end])
        out.append({
            "phase": name, "seconds": round(marks[end] - start, 2), "answered": kinds.pop("ok", 0),
            "failed": dict(kinds),
        })  # fmt: skip
    return out


def series(records: list[tuple[float, str]], marks: dict[str, float]) -> dict[str, Any]:
    """Answers per 0.5 s from the baseline's start, and when each mark fell on that clock."""
    start = marks["baseline"]
    bins = [0] * (int((marks["end"] - start) / 0.5) + 1)
    for t, k in records:
        if k == "ok" and t >= start:
            bins[int((t - start) / 0.5)] += 1
    return {"marks_s": {k: round(v - start, 2) for k, v in marks.items()}, "answers": bins}


def rate(records: list[tuple[float, str]], start: float, end: float) -> float:
    return sum(1 for t, k in records if k == "ok" and start <= t < end) / (end - start)


def recovery(records: list[tuple[float, str]], marks: dict[str, float], n: int) -> dict:
    """Pre-kill rate, the slowest second after kill `n`, and seconds until back to full
    capacity (None: not within the phase)."""
    before = rate(records, marks["baseline"], marks["kill 1"])
    start = marks[f"kill {n}"]
    end = marks[f"kill {n + 1}"] if f"kill {n + 1}" in marks else marks["SIGTERM"]
    back, t = None, start
    while t + WINDOW <= end:
        if rate(records, t, t + WINDOW) >= RECOVERED * before:
            back = round(t - start, 2)
            break
        t += 0.1
    slowest = min(rate(records, s, s + 1) for s in _steps(start, end - 1, 0.25))
    return {"pre_kill_per_s": round(before, 1), "slowest_second_per_s": round(slowest, 1),
            "full_capacity_after_s": back}  # fmt: skip


def _steps(start: float, end: float, step: float) -> list[float]:
    return [start + i * step for i in range(max(1, int((end - start) / step) + 1))]


def markdown(report: dict) -> str:
    r = report["result"]
    lines = [
        "# Workers killed under load\n",
        f"`{report['command']}` on {report['machine']}: {report['clients']} clients, one "
        f"keep-alive connection each, on /classify; `python -m service --workers 2` serving "
        f"{report['package']}.\n",
        "| phase | s | answered | req/s | failed (kind: count) | cores: server / harness / "
        "others |",
        "|---|---|---|---|---|---|",
    ]
    for p in r["phases"]:
        failed = ", ".join(f"{k}: {v}" for k, v in sorted(p["failed"].items())) or "none"
        c = p["cpu_cores"]
        lines.append(
            f"| {p['phase']} | {p['seconds']} | {p['answered']} | "
            f"{p['answered'] / p['seconds']:.0f} | {failed} | "
            f"{c['server']} / {c['harness']} / {c['others']} |"
        )
    lines += [
        "",
        "| kill | connections the worker held | failed | replacement started / serving (s) "
        "| req/s before | slowest second after | back to full capacity (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for n, (k, p) in enumerate(zip(r["kills"], r["phases"][1:], strict=False), 1):
        lines.append(
            f"| {n} | {k['held_connections']} | {sum(p['failed'].values())} | "
            f"{k['replacement_started_s']} / {k['replacement_serving_s']} | "
            f"{k['pre_kill_per_s']} | {k['slowest_second_per_s']} | "
            f"{k['full_capacity_after_s']} |"
        )
    exit_ = r["parent_exit"]
    lines += ["", f"After SIGTERM the parent exited with status {exit_['status']} in "
              f"{exit_['seconds']} s.", "", "The supervisor's log:", "", "```",
              *r["log_lines"], "```", ""]  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--package", type=Path, help="a classification package (default: tiny)")
    parser.add_argument("--clients", type=int, default=32, help="closed-loop /classify clients")
    parser.add_argument("--warmup", type=float, default=3.0, help="s before the baseline")
    parser.add_argument("--baseline", type=float, default=8.0, help="s measured before a kill")
    parser.add_argument("--after", type=float, default=15.0, help="s after each kill")
    parser.add_argument("--tail", type=float, default=1.0, help="s of clients after exit")
    parser.add_argument("--log", type=Path, help="keep the server's log (stderr) there")
    parser.add_argument(
        "--server-root",
        type=Path,
        default=_server.REPO,
        help="the source tree whose service runs (an older checkout)",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("benchmarks/results"), help="folder of the result files"
    )
    parser.add_argument("--tag", default="", help="suffix of the result files")
    cli = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="worker-kill-") as tmp:
        models = Path(tmp) / "models"
        if cli.package is None:
            from benchmarks import tiny

            tiny.build_tiny_package(models / "sst2", "classification", max_seq_length=32)
        else:
            models.mkdir()
            (models / cli.package.name).symlink_to(cli.package.resolve())
        port = _server.free_port()
        args = [
            sys.executable, "-m", "service", "--workers", "2", "--model-dir", str(models),
            "--port", str(port), "--log-level", "warning", "--max-concurrent-requests", "4096",
        ]  # fmt: skip
        env = {"PYTHONUNBUFFERED": "1"}
        log = Path(tmp) / "server.log"
        with _server.running(args, cli.server_root, env, port, log) as s:
            result = asyncio.run(scenario(s, port, cli))
        if cli.log:
            shutil.copyfile(log, cli.log)
    report = {
        "command": " ".join(
            ["python -m benchmarks.worker_kill", *(sys.argv[1:] if argv is None else argv)]
        ),
        "machine": f"{cpu_name()}, {os.cpu_count()} CPUs",
        "package": str(cli.package) if cli.package else "tiny random classifier (benchmarks.tiny)",
        "clients": cli.clients,
        "result": result,
    }
    stem = "worker_kill" + (f"-{cli.tag}" if cli.tag else "")
    print(write_results(cli.out, stem, report, markdown(report)).read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
