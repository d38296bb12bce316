"""Soak: a long mixed stream of requests against a real server, to show that nothing grows:
resident memory, queues, latency.

    python -m benchmarks.soak --tiny                      # tiny random packages (needs torch)
    python -m benchmarks.soak --model-dir models/bench --requests 20000 --concurrency 16

Starts `python -m service` (a subprocess on 127.0.0.1) on a model_dir with one package per task
and sends --requests requests, --concurrency at a time, cycling over every endpoint: the five
inference endpoints in single and batched forms (benchmarks/_traffic.py) and /health, /ready,
/models, /metrics. Every inference answer is compared with the answer the same request got alone
before the run. Per slice of --slice requests: latency p50/p99, the server's resident memory,
the queue depth, errors. The first slice is the warm-up. Pass when, after it:

- resident memory at the end is less than 10 % above its value after the warm-up;
- the queues do not grow: the queue depth at each slice boundary (reported) stays bounded by
  the requests in flight, and is 0 once the load stops;
- there is no error and no wrong answer;
- latency is stable: the last slice's p99 within 2x (+5 ms) of the first measured slice's.

Exits 1 when a criterion fails. Results: benchmarks/results/soak[-tag].{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from benchmarks._paths import write_results
from benchmarks._server import REPO, Server, _wait_ready, free_port
from benchmarks._traffic import INFERENCE, PROBES, assert_same, percentile
from heads.contract import MANIFEST

TINY = {
    "classification": "tiny-classify",
    "token-classification": "tiny-ner",
    "question-answering": "tiny-qa",
    "embedding": "tiny-embed",
}
MIX = INFERENCE + PROBES  # 10 inference requests, then the 4 probes; cycled


@dataclass
class Slice:
    """One --slice requests (by the order they were sent)."""

    index: int
    requests: int = 0  # sent and finished, whatever the outcome
    errors: int = 0  # not 200, or no answer
    wrong: int = 0
    latencies: list[float] = field(default_factory=list)  # seconds
    rss_mib: float = 0.0  # server RSS when the slice's last request was answered
    queue_depth: float = 0.0  # all models' queued rows then

    def row(self) -> dict[str, Any]:
        return {
            "slice": self.index,
            "requests": self.requests,
            "errors": self.errors,
            "wrong": self.wrong,
            "p50_ms": round(percentile(self.latencies, 50) * 1e3, 2),
            "p99_ms": round(percentile(self.latencies, 99) * 1e3, 2),
            "rss_mib": round(self.rss_mib, 1),
            "queue_depth": self.queue_depth,
        }


def queue_depth(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        if family.name == "bert_heads_queue_depth"
        for s in family.samples
    )


async def drive(url: str, pid: int, total: int, concurrency: int, size: int) -> list[Slice]:
    """Send `total` requests of MIX from `concurrency` closed-loop clients; measure per slice."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        reference = [
            (await client.request(m, p, json=b)).json() if m == "POST" else None for m, p, b in MIX
        ]
        slices = [Slice(i) for i in range((total + size - 1) // size)]
        process = psutil.Process(pid)
        sent = 0

        async def one(k: int) -> None:
            method, path, body = MIX[k % len(MIX)]
            s = slices[k // size]
            start = time.perf_counter()
            try:
                r = await client.request(method, path, json=body)
                s.latencies.append(time.perf_counter() - start)
                if r.status_code != 200:
                    s.errors += 1
                elif method == "POST":
                    try:
                        assert_same(r.json(), reference[k % len(MIX)])
                    except AssertionError:
                        s.wrong += 1
            except httpx.HTTPError:
                s.errors += 1
            s.requests += 1
            if s.requests == min(size, total - s.index * size):  # the slice's last answer
                s.rss_mib = process.memory_info().rss / 2**20
                s.queue_depth = await asyncio.to_thread(queue_depth, url)

        async def worker() -> None:
            nonlocal sent
            while sent < total:
                k, sent = sent, sent + 1
                await one(k)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return slices


def verdict(slices: list[Slice], final_depth: float) -> dict[str, Any]:
    measured = slices[1:] or slices
    base = slices[0].rss_mib
    growth = (slices[-1].rss_mib - base) / base
    first_p99 = percentile(measured[0].latencies, 99)
    last_p99 = percentile(measured[-1].latencies, 99)
    checks = {
        "rss_growth_under_10_percent": growth < 0.10,
        "queues_empty_at_the_end": final_depth == 0,
        "no_errors": sum(s.errors for s in slices) == 0,
        "no_wrong_answers": sum(s.wrong for s in slices) == 0,
        "latency_stable": last_p99 <= 2 * first_p99 + 0.005,
    }
    return {
        "rss_after_warmup_mib": round(base, 1),
        "rss_end_mib": round(slices[-1].rss_mib, 1),
        "rss_max_mib": round(max(s.rss_mib for s in measured), 1),
        "rss_growth_percent": round(100 * growth, 2),
        "final_queue_depth": final_depth,
        "p99_first_measured_ms": round(first_p99 * 1e3, 2),
        "p99_last_ms": round(last_p99 * 1e3, 2),
        "checks": checks,
        "passed": all(checks.values()),
    }


def tiny_model_dir(root: Path) -> Path:
    from benchmarks.tiny import build_tiny_package  # torch: only for --tiny

    for task, name in TINY.items():
        build_tiny_package(root / name, task, name=name)
    return root


def markdown(report: dict[str, Any]) -> str:
    v = report["verdict"]
    lines = [
        f"# Soak: {report['requests']} requests, {report['concurrency']} clients",
        "",
        f"{report['model_dir']} ({report['packages']}); {report['machine']}; "
        f"{report['seconds']:.0f} s, {report['requests'] / report['seconds']:.0f} requests/s. "
        "Slice 0 is the warm-up.",
        "",
        "| slice | requests | errors | wrong | p50 ms | p99 ms | server RSS MiB | queue depth |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["slices"]:
        lines.append(
            f"| {r['slice']} | {r['requests']} | {r['errors']} | {r['wrong']} | {r['p50_ms']} "
            f"| {r['p99_ms']} | {r['rss_mib']} | {r['queue_depth']:g} |"
        )
    lines += [
        "",
        f"RSS after warm-up {v['rss_after_warmup_mib']} MiB, at the end {v['rss_end_mib']} MiB "
        f"(growth {v['rss_growth_percent']} %, max {v['rss_max_mib']} MiB); queue depth at "
        f"the end {v['final_queue_depth']:g}; p99 {v['p99_first_measured_ms']} ms in the first "
        f"measured slice, {v['p99_last_ms']} ms in the last.",
        "",
        "| check | |",
        "|---|---|",
        *(f"| {name} | {'pass' if ok else 'FAIL'} |" for name, ok in v["checks"].items()),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n\n")[0])  # fmt: skip
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--model-dir", type=Path, help="one package per task")
    where.add_argument("--tiny", action="store_true", help="build tiny random packages (torch)")
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--slice", type=int, default=1_000, help="requests per slice")
    parser.add_argument("--server-arg", action="append", default=[],
                        help="extra flag for python -m service, e.g. --server-arg=--max-wait-ms=2")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--tag", help="suffix of the result files")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        model_dir = tiny_model_dir(Path(tmp) / "models") if args.tiny else args.model_dir
        port, log = free_port(), Path(tmp) / "server.log"
        command = [sys.executable, "-m", "service", "--model-dir", str(model_dir),
                   "--port", str(port), "--log-level", "warning", *args.server_arg]  # fmt: skip
        with log.open("w") as sink:
            process = subprocess.Popen(command, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)
        server = Server(process, f"http://127.0.0.1:{port}", log)
        try:
            _wait_ready(server, timeout=300)
            packages = sorted(p.name for p in model_dir.iterdir() if (p / MANIFEST).is_file())
            start = time.perf_counter()
            slices = asyncio.run(
                drive(server.base_url, process.pid, args.requests, args.concurrency, args.slice)
            )
            seconds = time.perf_counter() - start
            final_depth = queue_depth(server.base_url)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(60)

    report = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "model_dir": "tiny test packages (random weights, hidden 32)" if args.tiny else str(model_dir),
        "packages": ", ".join(packages),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
        "command": " ".join(["python -m benchmarks.soak", *(argv if argv is not None else sys.argv[1:])]),
        "requests": args.requests,
        "concurrency": args.concurrency,
        "seconds": seconds,
        "slices": [s.row() for s in slices],
        "verdict": verdict(slices, final_depth),
    }  # fmt: skip
    text = markdown(report)
    print(text)
    write_results(args.out, "soak" + (f"-{args.tag}" if args.tag else ""), report, text)
    return 0 if report["verdict"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
