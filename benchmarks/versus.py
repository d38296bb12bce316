"""bert-heads against infinity's ONNX engine on the same all-MiniLM-L6-v2, and both against
ONNX Runtime alone, side by side in one run (issue 31).

    python -m benchmarks.versus --package models/bench/minilm-embed --infinity DIR
    python -m benchmarks.versus --package models/bench/minilm-embed --infinity DIR \\
        --layouts default "--workers 2" --rounds 3 --duration 5
    python -m benchmarks.versus --package models/bench/minilm-embed --no-infinity --rounds 1

DIR is the folder `optimum-cli export onnx --task feature-extraction --model CHECKPOINT DIR`
wrote from the package's source checkpoint; infinity runs inside it as its recipe says:
`infinity_emb v2 --model-id . --engine optimum --device cpu --pooling-method mean
--url-prefix /v1` (plus --port and --no-model-warmup: each level warms both servers up
anyway). --infinity-bin names its `infinity_emb` (default: the one on PATH). Check its vectors
equal sentence-transformers' first: optimum 2.x silently skips the graph optimisation that
1.27 applies (the issue's recipe pins every version).

Levels: 1, 8 and 32 closed-loop clients posting one SST-2 dev sentence a request, and 4
clients posting 32 sentences a request. Both servers get the same OpenAI embeddings bodies at
/v1/embeddings. A round measures the raw ceiling, then starts each server in turn (infinity,
then ours in each --layouts x --variants) and runs every level on it; rounds interleave, and
the best round of each figure is kept (other work on the machine only slows a round down).
The raw ceiling is ONNX Runtime alone on the package's file, opened as the service opens it
(every thread, one run at a time), on length-sorted batches of 8, 16 and 32: the best.

Results: benchmarks/results/versus-<package>[-tag].{json,md}.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks import _engine, _load, _server, server_cost
from benchmarks._data import shared_data, workload
from benchmarks._machine import cpu_name
from benchmarks._paths import write_results
from benchmarks.serve import CpuMeter, log
from heads.package import read_package
from service.settings import Settings

LEVELS = ("1", "8", "32", "4x32")  # clients, or clients x sentences per request


def bodies(texts: list[str], per_request: int, model: str) -> list[dict[str, Any]]:
    """OpenAI embeddings bodies of `per_request` texts each, naming `model`."""
    return [b | {"model": model} for b in server_cost.bodies("/v1/embeddings", texts, per_request)]


def parse_level(level: str) -> tuple[int, int]:
    clients, _, per = level.partition("x")
    return int(clients), int(per or 1)


@contextmanager
def infinity(folder: Path, binary: str) -> Iterator[_server.Server]:
    port = _server.free_port()
    args = [binary, "v2", "--model-id", ".", "--engine", "optimum", "--device", "cpu",
            "--pooling-method", "mean", "--url-prefix", "/v1", "--port", str(port),
            "--no-model-warmup"]  # fmt: skip
    env = {"HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "1"}
    with tempfile.TemporaryDirectory(prefix="bench-infinity-") as tmp:
        log_path = Path(tmp) / "infinity.log"
        with _server.running(args, folder, env, port, log_path, ready="/health") as server:
            yield server


def measure(server: _server.Server, texts: list[str], model: str, cli: argparse.Namespace,
            tokens: dict[str, int]) -> dict[str, Any]:  # fmt: skip
    out = {}
    for level in cli.levels:
        clients, per = parse_level(level)
        sent = bodies(texts, per, model)
        rows = [per] * len(sent)
        toks = [sum(tokens[t] for t in ([b["input"]] if per == 1 else b["input"])) for b in sent]
        meter = CpuMeter(server)
        got = _load.run_level(server.base_url + "/v1/embeddings", sent, rows, toks, clients,
                              warmup=cli.warmup, duration=cli.duration).summary()  # fmt: skip
        got["server_cpu_cores"] = round(meter.read()["server_cpu_cores"], 2)
        if got["errors"]:
            raise RuntimeError(f"errors at level {level}: {got['errors']}")
        out[level] = got
        log(f"  {level}: {got['sequences_per_s']} seq/s, p50 {got['latency_ms']['p50']} ms, "
            f"server {got['server_cpu_cores']} cores")  # fmt: skip
    return out


def raw_ceiling(package: Any, variant: str, rows: list, budget: float) -> dict[str, Any]:
    backend = _engine.open_session(package.variant_path(variant), 0, Settings().intra_op_spinning)
    sweep = [_engine.throughput(backend, rows, size, "sorted", budget) for size in (8, 16, 32)]
    best = max(sweep, key=lambda s: s["sequences_per_s"])
    log(f"raw {variant}: {best['sequences_per_s']} seq/s (batch {best['batch_size']})")
    return best


def best_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per configuration and level, the round with the most sequences/s."""
    out: dict[str, Any] = {}
    for r in rounds:
        for config, levels in r["served"].items():
            for level, got in levels.items():
                kept = out.setdefault(config, {}).get(level)
                if kept is None or got["sequences_per_s"] > kept["sequences_per_s"]:
                    out[config][level] = got
    return out


def markdown(report: dict[str, Any]) -> str:
    served, raw = report["best"], report["raw"]
    configs = list(served)
    lines = [
        f"# bert-heads against infinity's ONNX engine: {report['package']}",
        "",
        f"`python -m benchmarks.versus {' '.join(report['argv'])}`",
        "",
        f"{report['when']}; {report['cpu']}, {report['cores']} cores. {report['rounds']} "
        f"interleaved rounds, the best of each figure kept; each level {report['warmup']} s "
        f"warm-up, {report['duration']} s measured. Sequences/s (p50 ms at 1 client); "
        "requests are SST-2 dev sentences, one a request, or 32 a request at 4x32.",
        "",
        "| level | " + " | ".join(configs) + " |",
        "|---|" + "---|" * len(configs),
    ]
    for level in report["levels"]:
        cells = []
        for c in configs:
            got = served[c][level]
            cell = f"{got['sequences_per_s']:.0f}"
            if level == "1":
                cell += f" ({got['latency_ms']['p50']:.1f} ms)"
            cells.append(cell)
        lines.append(f"| {level} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| raw ceiling (ONNX Runtime alone, length-sorted) | seq/s | batch |",
        "|---|---|---|",
    ]
    for variant, best in raw.items():
        lines.append(f"| {variant} | {best['sequences_per_s']:.0f} | {best['batch_size']} |")
    lines += ["", "Ratios:", ""]
    peer = next((c for c in configs if c.startswith("infinity")), None)
    for c in configs:
        if c == peer:
            continue
        variant = c.split()[-1]
        parts = []
        if "32" in served[c] and variant in raw:
            parts.append(
                f"served / raw at 32 clients {served[c]['32']['sequences_per_s'] / raw[variant]['sequences_per_s']:.2f}"
            )
        if peer and variant == "fp32":
            parts.append("against infinity " + ", ".join(
                f"{lv} {served[c][lv]['sequences_per_s'] / served[peer][lv]['sequences_per_s']:.2f}x"
                for lv in report["levels"]))  # fmt: skip
        if "1" in served[c] and "8" in served[c]:
            parts.append(
                f"8 clients / 1 client {served[c]['8']['sequences_per_s'] / served[c]['1']['sequences_per_s']:.2f}"
            )
        lines.append(f"- {c}: " + "; ".join(parts))
    lines += ["", "Server CPU (cores) by level: " + "; ".join(
        f"{c}: " + ", ".join(f"{lv} {served[c][lv]['server_cpu_cores']}" for lv in report["levels"])
        for c in configs)]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--package", type=Path, required=True, help="an embedding model package")
    p.add_argument("--infinity", type=Path, help="infinity's model folder (optimum's export)")
    p.add_argument("--infinity-bin", default="infinity_emb", help="infinity's executable")
    p.add_argument("--no-infinity", action="store_true", help="ours and the raw ceiling only")
    p.add_argument("--variants", nargs="+", default=["fp32", "int8"], help="ours: model files")
    p.add_argument(
        "--layouts",
        nargs="+",
        default=["default"],
        help='ours: server arguments per layout, "default" for none (e.g. "--workers 2")',
    )
    p.add_argument(
        "--baseline-root",
        type=Path,
        help="another source tree (an older commit) served beside ours, default layout",
    )
    p.add_argument("--levels", nargs="+", default=list(LEVELS), help="N or NxM (M a request)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; best kept")
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds per level")
    p.add_argument("--warmup", type=float, default=1.5, help="unmeasured seconds per level")
    p.add_argument("--raw-budget", type=float, default=1.0, help="seconds per raw batch size")
    p.add_argument("--data", type=Path, help="../shared/data (default: beside the repository)")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    p.add_argument("--tag", help="suffix of the results' file names")
    cli = p.parse_args(argv)
    if not cli.no_infinity and cli.infinity is None:
        p.error("give --infinity DIR (infinity's model folder) or --no-infinity")
    if not cli.no_infinity and shutil.which(cli.infinity_bin) is None:
        p.error(f"{cli.infinity_bin}: not found; give --infinity-bin PATH")
    package = read_package(cli.package)
    if package.task != "embedding":
        p.error(f"{cli.package} is a {package.task} package; this compares embedding servers")
    items = workload(package, shared_data(cli.data))
    texts = [i.body["inputs"] for i in items]
    tokens = {t: i.tokens for t, i in zip(texts, items, strict=True)}
    rows = [r for i in items for r in i.rows]
    configs: list[tuple[str, Any]] = [] if cli.no_infinity else [("infinity fp32", None)]
    if cli.baseline_root:
        configs += [(f"baseline {v}", (v, [], cli.baseline_root)) for v in cli.variants]
    for layout in cli.layouts:
        extra = [] if layout == "default" else shlex.split(layout)
        for variant in cli.variants:
            name = f"bert-heads{'' if layout == 'default' else ' ' + layout} {variant}"
            configs.append((name, (variant, extra, _server.REPO)))
    rounds = []
    for r in range(cli.rounds):
        log(f"round {r + 1} of {cli.rounds}")
        done: dict[str, Any] = {"raw": {}, "served": {}}
        for variant in cli.variants:
            done["raw"][variant] = raw_ceiling(package, variant, rows, cli.raw_budget)
        for name, spec in configs:
            log(name)
            if spec is None:
                with infinity(cli.infinity, shutil.which(cli.infinity_bin) or "") as server:
                    done["served"][name] = measure(server, texts, ".", cli, tokens)
            else:
                variant, extra, root = spec
                with _server.serve(cli.package, variant, 0, Settings().intra_op_spinning,
                                   extra, root=root) as server:  # fmt: skip
                    done["served"][name] = measure(server, texts, cli.package.name, cli, tokens)
        rounds.append(done)
    raw = {
        v: max((r["raw"][v] for r in rounds), key=lambda s: s["sequences_per_s"])
        for v in cli.variants
    }
    report = {
        "package": cli.package.name,
        "argv": sys.argv[1:] if argv is None else argv,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cpu": cpu_name(),
        "cores": len(os.sched_getaffinity(0)),
        "rounds": cli.rounds,
        "warmup": cli.warmup,
        "duration": cli.duration,
        "levels": cli.levels,
        "raw": raw,
        "best": best_rounds(rounds),
        "all_rounds": rounds,
    }
    stem = f"versus-{cli.package.name}" + (f"-{cli.tag}" if cli.tag else "")
    report = _server.local_paths(report)
    path = write_results(cli.out, stem, report, markdown(report))
    print(path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
