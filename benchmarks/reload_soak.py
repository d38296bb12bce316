"""Reload under load (issue 32): a real server with --model-control explicit, closed-loop
clients on /classify, and one package reloaded again and again (one broken copy dropped in
half-way: refused, the old version serves on). What it reports: the answers' statuses, each
reload's time, and the server's memory (RSS) before the first reload, after each, at the end.

    python -m benchmarks.reload_soak                                # demo-sentiment, 10 x, 32 clients
    python -m benchmarks.reload_soak --package models/demo-sentiment --reloads 20 --clients 0
    python -m benchmarks.reload_soak --env MALLOC_MMAP_THRESHOLD_=131072 --tag env

Results: benchmarks/results/reload_soak[-tag].{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from benchmarks import _server
from benchmarks._machine import cpu_name
from benchmarks._paths import write_results

ADMIN_KEY = "reload-soak-admin"
TEXT = "a fine film with a weak ending"


def rss_mb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    raise RuntimeError(f"no VmRSS for {pid}")


async def soak(server: _server.Server, folder: Path, cli: argparse.Namespace) -> dict:
    statuses: Counter[int] = Counter()
    stop = asyncio.Event()

    async def client() -> None:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as c:
            while not stop.is_set():
                r = await c.post("/classify", json={"inputs": [TEXT], "model": folder.name})
                statuses[r.status_code] += 1

    clients = [asyncio.create_task(client()) for _ in range(cli.clients)]
    await asyncio.sleep(cli.settle)
    pid = server.process.pid
    before, reloads, trace = rss_mb(pid), [], []
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120, headers=admin) as c:
        for n in range(cli.reloads):
            if n == cli.reloads // 2:  # a broken copy: refused, the version serving stays
                model = folder / "model.onnx"
                good = model.read_bytes()
                model.write_bytes(b"broken")
                refused = (await c.post(f"/models/{folder.name}/load")).status_code
                model.write_bytes(good)
                del good
            start = time.perf_counter()
            r = await c.post(f"/models/{folder.name}/load")
            if r.status_code != 200:
                raise RuntimeError(f"reload {n + 1}: {r.status_code} {r.text}")
            reloads.append(round(time.perf_counter() - start, 3))
            await asyncio.sleep(cli.pause)
            trace.append(rss_mb(pid))
    await asyncio.sleep(cli.settle)
    after = rss_mb(pid)
    stop.set()
    await asyncio.gather(*clients)
    return {
        "answers": dict(statuses),
        "broken_copy_status": refused if cli.reloads else None,
        "reload_seconds": reloads,
        "rss_mb": {"before": before, "after": after, "after_each_reload": trace},
    }


def markdown(report: dict) -> str:
    r, rss = report["result"], report["result"]["rss_mb"]
    times = sorted(r["reload_seconds"])
    return (
        f"# Reload under load\n\n`{report['command']}` on {report['machine']}.\n\n"
        f"| clients | reloads | answers (status: count) | broken copy | reload s (min / median / max) "
        f"| RSS MB before / after (min-max between) |\n|---|---|---|---|---|---|\n"
        f"| {report['clients']} | {len(times)} | "
        f"{', '.join(f'{k}: {v}' for k, v in sorted(r['answers'].items())) or 'none'} | "
        f"{r['broken_copy_status']} | {times[0]} / {times[len(times) // 2]} / {times[-1]} | "
        f"{rss['before']} / {rss['after']} ({min(rss['after_each_reload'])}-"
        f"{max(rss['after_each_reload'])}) |\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--package", type=Path, default=Path("models/demo-sentiment"))
    parser.add_argument("--reloads", type=int, default=10)
    parser.add_argument("--clients", type=int, default=32, help="closed-loop /classify clients")
    parser.add_argument("--pause", type=float, default=1.5, help="s between reloads")
    parser.add_argument("--settle", type=float, default=5.0, help="s before and after")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the server")
    parser.add_argument("--server-root", type=Path, default=_server.REPO)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--tag", default="", help="suffix of the result files")
    cli = parser.parse_args(argv)
    if not (cli.package / "package.json").is_file():
        parser.error(f"{cli.package} is not a model package (make models builds demo-sentiment)")
    if cli.reloads < 1:
        parser.error("--reloads must be at least 1")
    env = {**os.environ, **dict(e.split("=", 1) for e in cli.env)}
    with tempfile.TemporaryDirectory(prefix="reload-soak-") as tmp:
        folder = Path(tmp) / "models" / cli.package.name
        shutil.copytree(cli.package, folder)
        port = _server.free_port()
        args = [
            sys.executable, "-m", "service", "--model-dir", str(folder.parent),
            "--port", str(port), "--model-control", "explicit", "--admin-key", ADMIN_KEY,
            "--log-level", "warning",
        ]  # fmt: skip
        with _server.running(args, cli.server_root, env, port, Path(tmp) / "server.log") as s:
            result = asyncio.run(soak(s, folder, cli))
    report = {
        "command": "python -m benchmarks.reload_soak "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": f"{cpu_name()}, {os.cpu_count()} CPUs",
        "clients": cli.clients,
        "result": result,
    }
    stem = "reload_soak" + (f"-{cli.tag}" if cli.tag else "")
    print(write_results(cli.out, stem, report, markdown(report)).read_text())
    return 0 if set(result["answers"]) <= {200} else 1


if __name__ == "__main__":
    sys.exit(main())
