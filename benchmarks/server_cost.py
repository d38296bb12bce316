"""The server's own cost (issue 18): CPU per request of `python -m service` on models that cost
nearly nothing, beside a bare uvicorn ASGI app, per endpoint and request shape; and how to use
many cores (`--workers` processes x ONNX Runtime threads each).

    python -m benchmarks.server_cost                              # every endpoint, 1 and 32 inputs
    python -m benchmarks.server_cost --endpoints /classify --shapes 1 --rounds 1
    python -m benchmarks.server_cost --server-root ../old-checkout --tag before   # older code
    python -m benchmarks.server_cost --endpoints --layouts 1x2 2x1 \\
        --layout-package models/bench/minilm-embed --layout-variant int8          # many cores

The near-null packages (built once into --packages): a random BERT of 1 layer, hidden 32, with
all-MiniLM-L6-v2's real WordPiece tokenizer (so tokenization costs what it costs), exported by
`training.export`. Each task's server (a subprocess, `benchmarks._server`) and the bare app
(`benchmarks._bare`) are driven in turn by the same closed-loop client (`benchmarks._load`),
in `--rounds` interleaved rounds on real inputs from ../shared/data (SST-2 sentences, CoNLL-2003
sentences, SQuAD question/context pairs). Over the measured window only: requests/s, the
server's CPU per request split by thread (`benchmarks._cpu`: event loop / tokenizers' pool /
runtime threads = executor + ORT pool / other), the tokenization stage's time from /metrics,
requests/s per server core, and the ratio to the bare app's CPU per request on the same bodies.
Results: benchmarks/results/server_cost[-tag].{json,md}.

`--backend null` keeps everything but `session.run`: the server's ONNX Runtime backend answers
each batch with slices of fixed random arrays of the graph's output shapes (`NULL_BACKEND`), so
the table shows the server without any model. (The 1-layer, hidden-32 model is not free: its
`session.run` costs ~360 us for 7 SST-2 rows on one thread, as much as the rest of the server
per request.)
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from benchmarks import _load, _server
from benchmarks._bare import serve_bare
from benchmarks._cpu import CLASSES, PRELUDE, CpuSplit, ThreadMap
from benchmarks._data import CONLL_LABELS, SST2_LABELS, shared_data, texts
from benchmarks._machine import cpu_name
from benchmarks._paths import write_results
from benchmarks.serve import CpuMeter
from heads.contract import MANIFEST

ENDPOINT_TASKS = {
    "/classify": "classification",
    "/embed": "embedding",
    "/v1/embeddings": "embedding",
    "/ner": "token-classification",
    "/qa": "question-answering",
}
# The targets for single-input requests: server CPU per request / the bare app's.
TARGETS = {"/classify": 3.0, "/embed": 3.0, "/v1/embeddings": 3.0, "/ner": 5.0, "/qa": 5.0}
# The windows of the MiniLM packages (benchmarks.packages), so rows are as long as there.
MAX_SEQ = {"classification": 128, "embedding": 256, "token-classification": 256}
MAX_SEQ["question-answering"] = 384
DISTINCT = 2000  # distinct inputs cycled
# Run in the server process before the service with --backend null: OrtBackend.run returns views
# of random arrays in the graph's output shapes (named dims: the first is the batch, the second
# the sequence), never calling session.run. Random, so NER finds entities and QA spans as with
# a real model's logits; views, so making them costs nothing.
NULL_BACKEND = """
import numpy as _np, service.runtime as _runtime
_open = _runtime.OrtBackend.__init__
def _null_open(self, *args, **kwargs):
    _open(self, *args, **kwargs)
    rng = _np.random.default_rng(0)
    self._null = {
        o.name: (rng.standard_normal([512 if isinstance(d, str) else d for d in o.shape])
                 .astype(_np.float32), [isinstance(d, str) for d in o.shape])
        for o in self.session.get_outputs()
    }
def _null_run(self, feeds, alone=True, wants=frozenset()):
    size = _np.shape(feeds["input_ids"])
    out = {}
    for name in self._outputs + [o for o in self._on_request if o in wants]:  # as run() answers
        table, named = self._null[name]
        dims = iter(size)
        out[name] = table[tuple(slice(next(dims)) if n else slice(None) for n in named)]
    return out
_runtime.OrtBackend.__init__ = _null_open
_runtime.OrtBackend.run = _null_run
"""


def build_null(task: str, out: Path) -> Path:
    """A random 1-layer, hidden-32 BERT for `task` with MiniLM's tokenizer, exported into
    out/null-<task> (reused when already there); returns the package folder."""
    package = out / f"null-{task}"
    if (package / MANIFEST).is_file():
        return package
    import torch

    from benchmarks.packages import minilm_path
    from training.config import BertConfig
    from training.export import export_package
    from training.model import HEADS
    from training.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(minilm_path())
    labels = {"classification": SST2_LABELS, "token-classification": CONLL_LABELS}.get(task)
    config = BertConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=512,
        id2label=dict(enumerate(labels)) if labels else None,
    )
    torch.manual_seed(0)
    export_package(HEADS[task](config).eval(), task, package, tokenizer=tokenizer,
                   name=package.name, max_seq_length=MAX_SEQ[task], verbose=False,
                   source={"benchmark": "near-null model (server cost)"})  # fmt: skip
    return package


def bodies(endpoint: str, inputs: list[Any], shape: int) -> list[dict[str, Any]]:
    """Request bodies of `shape` inputs each (1: the single-input form users send) from
    `inputs` (texts, or (question, context) for /qa), cycled in order."""
    groups = [
        [inputs[(k * shape + j) % len(inputs)] for j in range(shape)]
        for k in range(max(1, len(inputs) // shape))
    ]
    out = []
    for group in groups:
        x: Any = group[0] if shape == 1 else group
        if endpoint == "/qa":
            pairs = [{"question": q, "context": c} for q, c in group]
            out.append(pairs[0] if shape == 1 else {"inputs": pairs})
        elif endpoint == "/v1/embeddings":
            out.append({"input": x})
        elif endpoint == "/ner":
            out.append({"inputs": x, "aggregation_strategy": "simple"})
        else:
            out.append({"inputs": x})
    return out


class Target:
    """A server being measured: its process(es) (with --workers: each worker), thread maps."""

    def __init__(self, servers: list[_server.Server], threads: list[ThreadMap]) -> None:
        self.servers, self.threads = servers, threads


@contextmanager
def start_service(
    package: Path, variant: str, threads: int, root: Path, workers: int = 1, null: bool = False
) -> Iterator[Target]:
    """`python -m service --workers N` from `root` on `package`, threads mapped. Workers are
    spawned without the prelude: their CPU counts whole (main thread = event loop, the rest
    'other'), which is all the layouts report."""
    extra = ["--workers", str(workers)] if workers > 1 else []
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "threads.log"
        with _server.serve(
            package, variant, threads, False, extra,
            root=root, prelude=PRELUDE + (NULL_BACKEND if null else ""),
            env={"BENCH_THREAD_LOG": str(log)},
        ) as server:  # fmt: skip
            pids = _server.worker_pids(server.process.pid) if workers > 1 else [server.process.pid]
            yield Target([server], [ThreadMap.at_start(pid, log) for pid in pids])


@contextmanager
def start_bare() -> Iterator[Target]:
    """The bare ASGI app (benchmarks._bare); its threads: the main one is the event loop."""
    with serve_bare() as server, tempfile.TemporaryDirectory() as tmp:
        yield Target([server], [ThreadMap.at_start(server.process.pid, Path(tmp) / "none")])


def _in_window(warmup: float, duration: float, begin: Callable[[], Any],
               end: Callable[[Any], Any]) -> Callable[[], Any]:  # fmt: skip
    """Call begin() `warmup` s from now and end(begin's value) `duration` s later, from a
    thread, while the load runs in this one; the returned function waits for end's value."""
    result: list[Any] = []

    def run() -> None:
        time.sleep(warmup)
        started = begin()
        time.sleep(duration)
        result.append(end(started))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def wait() -> Any:
        thread.join()
        return result[0]

    return wait


def measure(target: Target, path: str, sent: list[dict[str, Any]], shape: int,
            args: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    """Drive `target` at `path` with `sent` at saturation; CPU and /metrics over the window."""
    metrics = path != "/"  # the bare app has none

    def begin() -> tuple:
        scraped = [s.metrics() for s in target.servers] if metrics else []
        return scraped, [CpuSplit(m) for m in target.threads], CpuMeter()

    def end(started: tuple) -> dict[str, Any]:
        scraped, splits, meter = started
        cpu = dict.fromkeys([*CLASSES, "total"], 0.0)
        for split in splits:
            for k, v in split.read().items():
                cpu[k] += v
        machine = meter.read()  # its 'others' still hold the servers
        profile = _server.stage_profile(scraped[0], target.servers[0].metrics()) if metrics else {}
        return {"cpu": cpu, "machine": machine, "profile": profile}

    wait = _in_window(args.warmup, args.duration, begin, end)
    level = _load.run_level(
        " ".join(s.base_url + path for s in target.servers),
        sent, [shape] * len(sent), [0] * len(sent), args.clients,
        warmup=args.warmup, duration=args.duration,
    )  # fmt: skip
    window = wait()
    cpu, wall = window["cpu"], window["machine"]["wall_s"]
    n = max(level.requests, 1)
    return {
        "requests_per_s": round(level.requests / level.seconds, 1),
        "inputs_per_s": round(level.rows / level.seconds, 1),
        "errors": level.errors,
        "latency_ms": level.latency_ms,
        "server_cpu_us": {k: round(1e6 * v / n, 1) for k, v in cpu.items()},
        "server_cores": round(cpu["total"] / wall, 3),
        "client_cores": round(level.client_cpu, 3),
        "others_cores": round(
            max(0.0, window["machine"]["others_cpu_cores"] - cpu["total"] / wall), 3
        ),
        "tokenization_stage_us": round(1000 * window["profile"].get("tokenization_ms", 0), 1),
        "rows_per_batch": window["profile"].get("rows_per_batch"),
    }


def log(msg: str) -> None:
    print(f"[server_cost {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Median (and spread) over rounds: other people's work on a shared machine moves
    throughput a lot and CPU per request little, so both are shown with their range."""
    cpu = [r["server_cpu_us"]["total"] for r in rounds]
    rps = [r["requests_per_s"] for r in rounds]
    return {
        "requests_per_s": statistics.median(rps),
        "requests_per_s_best": max(rps),
        "cpu_us": statistics.median(cpu),
        "cpu_us_range": [min(cpu), max(cpu)],
        "split_us": {k: statistics.median(r["server_cpu_us"][k] for r in rounds) for k in CLASSES},
        "tokenization_stage_us": statistics.median(r["tokenization_stage_us"] for r in rounds),
        "requests_per_s_per_core": round(1e6 / statistics.median(cpu), 1),
        "rows_per_batch": rounds[-1]["rows_per_batch"],
        "others_cores": max(r["others_cores"] for r in rounds),
        "errors": sum(sum(r["errors"].values()) for r in rounds),
    }


def run_table(args: argparse.Namespace, data: Path) -> list[dict[str, Any]]:
    """Every endpoint x shape, service then bare app on the same bodies, `args.rounds` times."""
    tasks = list(dict.fromkeys(ENDPOINT_TASKS[e] for e in args.endpoints))
    packages = {t: build_null(t, args.packages) for t in tasks}
    inputs = {t: [x for x, _ in texts(t, data)[:DISTINCT]] for t in tasks}
    cases = [(e, n) for e in args.endpoints for n in args.shapes]
    sent = {(e, n): bodies(e, inputs[ENDPOINT_TASKS[e]], n) for e, n in cases}
    results: dict[tuple, dict[str, list]] = {c: {"service": [], "bare": []} for c in cases}
    with ExitStack() as stack:
        root = args.server_root
        services = {
            t: stack.enter_context(
                start_service(packages[t], "fp32", args.threads, root, null=args.backend == "null")
            )
            for t in tasks
        }
        bare = stack.enter_context(start_bare())
        for k in range(args.rounds):
            for endpoint, shape in cases:
                service = services[ENDPOINT_TASKS[endpoint]]
                s = measure(service, endpoint, sent[endpoint, shape], shape, args)
                b = measure(bare, "/", sent[endpoint, shape], shape, args)
                results[endpoint, shape]["service"].append(s)
                results[endpoint, shape]["bare"].append(b)
                split = ", ".join(f"{c} {s['server_cpu_us'][c]}" for c in CLASSES)
                log(
                    f"round {k + 1} {endpoint} x{shape}: {s['requests_per_s']} req/s, "
                    f"{s['server_cpu_us']['total']} us CPU/req ({split}); bare "
                    f"{b['requests_per_s']} req/s, {b['server_cpu_us']['total']} us; "
                    f"errors {s['errors'] or 'none'}, others {s['others_cores']} cores"
                )
    rows = []
    for (endpoint, shape), r in results.items():
        service, bare_ = summary(r["service"]), summary(r["bare"])
        ratios = [s["server_cpu_us"]["total"] / b["server_cpu_us"]["total"]
                  for s, b in zip(r["service"], r["bare"], strict=True)]  # fmt: skip
        row = {
            "endpoint": endpoint,
            "inputs": shape,
            "service": service,
            "bare": bare_,
            "x_bare": round(service["cpu_us"] / bare_["cpu_us"], 2),
            "x_bare_range": [round(min(ratios), 2), round(max(ratios), 2)],
            "rounds": r,
        }
        if shape == 1:
            row["target"] = TARGETS[endpoint]
            row["met"] = row["x_bare"] <= TARGETS[endpoint]
        rows.append(row)
    return rows


def run_layouts(args: argparse.Namespace, data: Path) -> dict[str, Any]:
    """Worker processes x ORT threads on one package (`--workers`, one port), single-input
    requests, all layouts up at once and measured in turn."""
    from heads.package import read_package

    package = args.layout_package or build_null("embedding", args.packages)
    task = read_package(package).task
    endpoint = next(e for e, t in ENDPOINT_TASKS.items() if t == task)
    sent = bodies(endpoint, [x for x, _ in texts(task, data)[:DISTINCT]], 1)
    layouts = [tuple(int(v) for v in layout.split("x")) for layout in args.layouts]
    results: dict[str, list] = {layout: [] for layout in args.layouts}
    with ExitStack() as stack:
        targets = {
            name: stack.enter_context(
                start_service(package, args.layout_variant, threads, args.server_root, workers)
            )
            for name, (workers, threads) in zip(args.layouts, layouts, strict=True)
        }
        for k in range(args.rounds):
            for name, target in targets.items():
                x = measure(target, endpoint, sent, 1, args)
                results[name].append(x)
                log(
                    f"round {k + 1} layout {name} ({endpoint}): {x['requests_per_s']} req/s, "
                    f"{x['server_cpu_us']['total']} us CPU/req, p50 {x['latency_ms'].get('p50')} "
                    f"ms, others {x['others_cores']} cores"
                )
    return {
        "package": str(package),
        "variant": args.layout_variant,
        "endpoint": endpoint,
        "layouts": [
            {
                "layout": name,
                "workers": r,
                "threads": t,
                **summary(results[name]),
                "p50_ms": statistics.median(x["latency_ms"].get("p50", 0) for x in results[name]),
                "rounds": results[name],
            }
            for name, (r, t) in zip(args.layouts, layouts, strict=True)
        ],  # fmt: skip
    }


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    backend = ("null (no session.run)" if result["settings"].get("backend") == "null"
               else "ONNX Runtime on the near-null packages")  # fmt: skip
    lines = [
        "# Server cost per request (issue 18)",
        "",
        f"`{result['command']}` on {m['cpu']}, {m['cores']} cores (shared; load "
        f"{m['load_before']} before, {m['load_after']} after), {result['started']}; server "
        f"code from `{result['server_root']}`; backend: {backend}. "
        f"{result['settings']['clients']} closed-loop "
        f"clients, {result['settings']['warmup']} s warm-up + {result['settings']['duration']} s "
        f"measured, {result['settings']['rounds']} interleaved rounds: medians, [min-max] "
        "over rounds. CPU is the server process's only, over the measured window, per request.",
        "",
    ]
    if result["table"]:
        lines += [
            "| endpoint | inputs | req/s (best) | server CPU us/req [range] | event loop | "
            "tokenizers pool | executor | ORT pool | other | tok. stage wall us | req/s per "
            "server core | rows/batch | bare app req/s | bare us/req | x bare [range] | target |",
            "|" + "---|" * 16,
        ]
        for r in result["table"]:
            s, b = r["service"], r["bare"]
            split = " | ".join(f"{s['split_us'][c]:.0f}" for c in CLASSES)
            target = (f"<= {r['target']:.0f}x {'met' if r['met'] else 'MISSED'}"
                      if "target" in r else "")  # fmt: skip
            lines.append(
                f"| {r['endpoint']} | {r['inputs']} | {s['requests_per_s']:.0f} "
                f"({s['requests_per_s_best']:.0f}) | {s['cpu_us']:.0f} "
                f"[{s['cpu_us_range'][0]:.0f}-{s['cpu_us_range'][1]:.0f}] | {split} | "
                f"{s['tokenization_stage_us']:.0f} | {s['requests_per_s_per_core']:.0f} | "
                f"{s['rows_per_batch']} | {b['requests_per_s']:.0f} | {b['cpu_us']:.0f} | "
                f"{r['x_bare']} [{r['x_bare_range'][0]}-{r['x_bare_range'][1]}] | {target} |"
            )
        errors = sum(r["service"]["errors"] for r in result["table"])
        others = max(r["service"]["others_cores"] for r in result["table"])
        lines += ["", f"Errors: {errors}. Other processes used up to {others} cores during "
                  "a measurement."]  # fmt: skip
    if result["layouts"]:
        x = result["layouts"]
        lines += [
            "",
            f"## Many cores: worker processes x ORT threads, `{x['package']}` ({x['variant']}), "
            f"{x['endpoint']}, one input per request",
            "",
            "| layout | workers | ORT threads each | req/s (best) | p50 ms | server CPU us/req "
            "[range] | server cores used | others cores (max) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in x["layouts"]:
            cores = statistics.median(k["server_cores"] for k in r["rounds"])
            lines.append(
                f"| {r['layout']} | {r['workers']} | {r['threads']} | "
                f"{r['requests_per_s']:.0f} ({r['requests_per_s_best']:.0f}) | {r['p50_ms']} | "
                f"{r['cpu_us']:.0f} [{r['cpu_us_range'][0]:.0f}-{r['cpu_us_range'][1]:.0f}] | "
                f"{cores:.2f} | {r['others_cores']} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.server_cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--endpoints", nargs="*", choices=list(ENDPOINT_TASKS), default=list(ENDPOINT_TASKS),
        help="endpoints of the table; none: skip it (layouts only)")  # fmt: skip
    add("--shapes", nargs="+", type=int, default=[1, 32], help="inputs per request")
    add("--clients", type=int, default=32, help="closed-loop clients (saturation)")
    add("--rounds", type=int, default=3, help="interleaved rounds; medians and ranges kept")
    add("--duration", type=float, default=3.0, help="measured seconds per measurement")
    add("--warmup", type=float, default=1.0, help="unmeasured seconds before each")
    add(
        "--threads",
        type=int,
        default=0,
        help="intra-op threads of the table's servers (0 = default)",
    )
    add("--server-root", type=Path, default=_server.REPO,
        help="source tree whose `service` runs (an older checkout); default: this one")  # fmt: skip
    add("--packages", type=Path, default=Path("models/bench/null"), help="near-null packages")
    add("--backend", choices=["onnx", "null"], default="onnx",
        help="null: the table's servers skip session.run (random outputs of the right shapes)")  # fmt: skip
    add("--layouts", nargs="*", default=[], metavar="WxT",
        help="worker processes (--workers) x ORT threads each to compare, e.g. 1x2 2x1")  # fmt: skip
    add("--layout-package", type=Path, help="package of the layouts (default: null embedding)")
    add("--layout-variant", default="fp32", help="its variant (fp32, int8, ...)")
    add("--data", type=Path, help="default: ../shared/data beside the repo")
    add("--out", type=Path, default=Path("benchmarks/results"), help="results folder")
    add("--tag", help="suffix of the result files")
    args = parser.parse_args(argv)
    data = shared_data(args.data)
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    load_before = [round(x, 2) for x in os.getloadavg()]
    t0 = time.perf_counter()
    table = run_table(args, data) if args.endpoints else []
    layouts = run_layouts(args, data) if args.layouts else None
    result = {
        "command": "python -m benchmarks.server_cost "
        + shlex.join(argv if argv is not None else sys.argv[1:]),
        "started": started,
        "seconds": round(time.perf_counter() - t0, 1),
        "server_root": str(args.server_root),
        "machine": {
            "cpu": cpu_name(),
            "cores": os.cpu_count(),
            "load_before": load_before,
            "load_after": [round(x, 2) for x in os.getloadavg()],
        },  # fmt: skip
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "data", "tag")},
        "table": table,
        "layouts": layouts,
    }
    result = _server.local_paths(result)
    text = markdown(result)
    path = write_results(args.out, "server_cost" + (f"-{args.tag}" if args.tag else ""),
                         result, text)  # fmt: skip
    print(text)
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
