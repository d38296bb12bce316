"""The benchmark tables of the docs, made from benchmarks/results when the site is built.

A page asks for one with a line of its own (docs/hooks.py replaces the line):

    <!-- results: serving_cpu -->                  a summary over several runs' JSON (TABLES)
    <!-- results: finetune_quality.md 1 -->        the first table of a results .md, as it is

Each table is followed by the runs it came from, linked to their full reports. A summary that
needs a file which is not there fails the build: a table is never copied by hand.

    python docs/gen_results.py                  # every summary table
    python docs/gen_results.py serving_gpu      # one
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
REFERENCE_CLIENTS = 32  # "served" in the summaries, as in benchmarks/_report.py
DIRECTIVE = re.compile(r"^<!-- results: (\S+)(?: (\d+))? -->$")


@dataclass
class Table:
    rows: list[list[str]]  # the header first
    sources: list[str]  # files under benchmarks/results

    def markdown(self, results_link: str = "benchmarks/results/") -> str:
        header, *body = self.rows
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in body]
        runs = ", ".join(f"[{_report(s)}]({results_link}{_report(s)})" for s in self.sources)
        return "\n".join(lines) + f"\n\n<small>Made from the results of {runs}.</small>\n"


def _report(source: str) -> str:
    """The run's Markdown report: the file itself, or the .md beside its JSON."""
    return source if source.endswith(".md") else source.removesuffix(".json") + ".md"


def load(name: str) -> dict[str, Any]:
    path = RESULTS / name
    if not path.is_file():
        raise FileNotFoundError(f"{path.relative_to(RESULTS.parents[1])}: the table needs it")
    result: dict[str, Any] = json.loads(path.read_text())
    return result


def n(x: float, digits: int = 0) -> str:
    """1,234 / 12.3: thousands separated, as the reports write them."""
    return f"{x:,.{digits}f}"


def at(run: dict[str, Any], clients: int) -> dict[str, Any]:
    return next(s for s in run["served"] if s["concurrency"] == clients)


TABLES: dict[str, Callable[[], Table]] = {}


def table(fn: Callable[[], Table]) -> Callable[[], Table]:
    TABLES[fn.__name__] = fn
    return fn


# -- serving ------------------------------------------------------------------------------------

CPU_SERVE = {  # run -> how the docs name the package and its requests
    "serve-minilm-embed.json": "MiniLM (/embed)",
    "serve-base-classify.json": "BERT-base (/classify)",
    "serve-minilm-ner.json": "MiniLM (/ner)",
    "serve-minilm-qa.json": "MiniLM (/qa, SQuAD contexts)",
}


@table
def serving_cpu() -> Table:
    """Each package and variant: the raw session's best, served at 32 clients, against the
    transformers / sentence-transformers peer one input per call, and idle latency."""
    rows = [["package (endpoint)", "variant", "raw best seq/s",
             f"served {REFERENCE_CLIENTS} clients seq/s (x raw)", "served / peer",
             "idle p50 (raw request p50)"]]  # fmt: skip
    for source, label in CPU_SERVE.items():
        result = load(source)
        peer = max(
            (p["inputs_per_s"] for p in result["peer"]["runs"] if p["batch_size"] == 1),
            default=None,
        )
        for run in result["runs"]:
            raw = run["raw"]["best"]["sequences_per_s"]
            served = at(run, REFERENCE_CLIENTS)
            idle = at(run, 1)["latency_ms"]["p50"]
            raw_p50 = run["raw"]["request_latency_ms"]["p50"]
            rows.append([
                label, run["variant"], n(raw),
                f"{n(served['sequences_per_s'])} ({served['sequences_per_s'] / raw:.2f})",
                f"{served['requests_per_s'] / peer:.2f}" if peer else "",
                f"{idle:.1f} ms ({raw_p50:.1f})",
            ])  # fmt: skip
    return Table(rows, list(CPU_SERVE))


VERSUS_LAYOUTS = {  # the run's layout name -> the column's
    "infinity fp32": "infinity fp32",
    "bert-heads fp32": "**fp32**",
    "bert-heads --workers 2 fp32": "`--workers 2` fp32",
    "bert-heads int8": "**int8**",
    "bert-heads --workers 2 int8": "`--workers 2` int8",
}


@table
def versus_infinity() -> Table:
    """Sequences/s at each level, best of the interleaved rounds; p50 at one client."""
    source = "versus-minilm-embed.json"
    result = load(source)
    rows = [["clients", *VERSUS_LAYOUTS.values()]]
    for level in result["levels"]:
        row = ["4 x 32 sentences" if level == "4x32" else level]
        for layout, column in VERSUS_LAYOUTS.items():
            got = result["best"][layout][level]
            cell = n(got["sequences_per_s"])
            if level == "1":
                cell += f" ({got['latency_ms']['p50']:.1f} ms)"
            row.append(f"**{cell}**" if column.startswith("**") else cell)
        rows.append(row)
    rows.append(["raw ONNX Runtime, length-sorted", "", n(result["raw"]["fp32"]["sequences_per_s"]),
                 "", n(result["raw"]["int8"]["sequences_per_s"]), ""])  # fmt: skip
    return Table(rows, [source])


CPU16 = ["1x16", "4x4", "8x2", "16x1"]


@table
def serving_cpu16() -> Table:
    """MiniLM /embed on 16 cores: workers x intra-op threads, at 32 and 128 clients."""
    sources = [f"serve-minilm-embed-cpu16-{layout}.json" for layout in CPU16]
    rows = [["workers x threads", "fp32, 32 clients", "fp32, 128", "int8, 32 clients",
             "int8, 128", "int8 p50 at 32"]]  # fmt: skip
    for layout, source in zip(CPU16, sources, strict=True):
        runs = {run["variant"]: run for run in load(source)["runs"]}
        fp32, int8 = runs["fp32"], runs["int8"]
        rows.append([
            layout.replace("x", " x "),
            n(at(fp32, 32)["sequences_per_s"]), n(at(fp32, 128)["sequences_per_s"]),
            n(at(int8, 32)["sequences_per_s"]), n(at(int8, 128)["sequences_per_s"]),
            f"{at(int8, 32)['latency_ms']['p50']:.1f} ms",
        ])  # fmt: skip
    raw = {
        run["variant"]: run["raw"]["best"]["sequences_per_s"] for run in load(sources[0])["runs"]
    }
    rows.append(["raw session, 16 threads, best batch", n(raw["fp32"]), "", n(raw["int8"]), "", ""])
    return Table(rows, sources)


# -- on a GPU ---------------------------------------------------------------------------------

GPU_CEILING = {
    "gpu-ceiling-base-classify.json": "BERT-base",
    "gpu-ceiling-minilm-embed.json": "MiniLM",
}


@table
def gpu_ceiling() -> Table:
    """The raw CUDA session at 128 real tokens a sequence, sequences/s by batch size."""
    batches = [1, 8, 32, 128, 256]
    rows = [["package", "variant", *(f"batch {b}" if b == 1 else str(b) for b in batches),
             "GPU MiB at 128"]]  # fmt: skip
    for source, label in GPU_CEILING.items():
        for variant, sweep in load(source)["variants"].items():
            by_batch = {x["batch"]: x for x in sweep}
            rows.append([label, variant, *(n(by_batch[b]["run"]) for b in batches),
                         n(by_batch[128]["gpu_mib"])])  # fmt: skip
    return Table(rows, list(GPU_CEILING))


GPU_SERVE = {  # run -> its row's name
    "serve-base-classify-gpu.json": "BERT-base /classify",
    "serve-minilm-embed-gpu.json": "MiniLM /embed",
    "serve-base-classify-gpu-workers2.json": "BERT-base, `--workers 2`",
    "serve-base-classify-gpu-workers4.json": "BERT-base, `--workers 4`",
    "serve-base-classify-gpu-cudnn1.json": "BERT-base /classify, later run, ORT's default attention",
    "serve-base-classify-gpu-cudnn0.json": "same run, cuDNN attention left out (now the service's)",
}


def server_cpu(result: dict[str, Any], run: dict[str, Any]) -> str:
    """The server process's CPU over the levels; with --workers the harness sees only the
    parent, which only accepts: not measured."""
    if any(
        a.startswith("--workers=") and a != "--workers=1" for a in result["settings"]["server_arg"]
    ):
        return ""
    low, high = (
        f"{f(s['cpu']['server_cpu_cores'] for s in run['served']):.1f}" for f in (min, max)
    )
    return (
        f"{low} core"
        if low == high == "1.0"
        else f"{low}-{high} cores"
        if low != high
        else f"{low} cores"
    )


@table
def serving_gpu() -> Table:
    """Requests/s by clients (SST-2 sentences), p50 / p99, and the server's CPU."""
    rows = [["package", "variant", "1 client req/s (p50)", "8", "32 (p50 / p99)",
             "128 (p50 / p99)", "server CPU"]]  # fmt: skip
    for source, label in GPU_SERVE.items():
        result = load(source)
        for run in result["runs"]:
            served = {s["concurrency"]: s for s in run["served"]}
            cells = []
            for clients in (1, 8, 32, 128):
                s = served.get(clients)
                if s is None:
                    cells.append("")
                    continue
                p = s["latency_ms"]
                cells.append(n(s["requests_per_s"]) + (
                    f" ({p['p50']:.1f} ms)" if clients == 1
                    else "" if clients == 8
                    else f" ({p['p50']:.1f} / {p['p99']:.1f} ms)"
                ))  # fmt: skip
            rows.append([label, run["variant"], *cells, server_cpu(result, run)])
    return Table(rows, list(GPU_SERVE))


# -- training ---------------------------------------------------------------------------------


@table
def finetune_speed() -> Table:
    """SQuAD training windows/s on the CPU: batches shuffled or grouped by length, fp32 / bf16."""
    source = "finetune_speed_squad.json"
    arms = {(a["group_by_length"], a["precision"]): a for a in load(source)["arms"]}
    rows = [["batches", "fp32", "bf16"]]
    for grouped, name in ((False, "shuffled"), (True, "grouped by length")):
        rows.append(
            [name, *(f"{arms[grouped, p]['rows_per_s']:.1f} windows/s" for p in ("fp32", "bf16"))]
        )
    return Table(rows, [source])


TASK_NAMES = {"conll": "CoNLL-2003 NER", "sst2": "SST-2"}


@table
def finetune_vs_trainer() -> Table:
    """Our fine-tuning loop against transformers' Trainer, steps/s on the same batches."""
    source = "finetune_vs_trainer.json"
    rows = [["task", "precision", "ours steps/s", "Trainer steps/s", "ours / Trainer (per round)"]]
    for r in load(source)["results"]:
        rounds = ", ".join(f"{x:.2f}" for x in r["ratios"])
        rows.append([TASK_NAMES.get(r["task"], r["task"]), r["precision"],
                     f"{r['ours_steps_per_s']:.2f}", f"{r['trainer_steps_per_s']:.2f}",
                     f"{r['ratio']:.2f} ({rounds})"])  # fmt: skip
    return Table(rows, [source])


@table
def pretrain_cpu() -> Table:
    """SST-2 dev after one epoch, from the 70-minute BERT-mini and from random weights."""
    source = "pretrain_evidence.json"
    sst2 = load(source)["sst2"]
    rates = sorted({r["lr"] for runs in sst2.values() for r in runs})
    rows = [["start from", *(f"lr {lr:.0e}".replace("e-0", "e-") for lr in rates)]]
    for start, runs in sst2.items():
        by_lr = {r["lr"]: r["accuracy"] for r in runs}
        rows.append([start, *(f"{by_lr[lr]:.1f}" for lr in rates)])
    return Table(rows, [source])


# -- a table of a results .md, as it is ----------------------------------------------------------


def md_table(name: str, index: int) -> Table:
    """The `index`-th (from 1) table of benchmarks/results/`name`."""
    path = RESULTS / name
    if not path.is_file():
        raise FileNotFoundError(f"benchmarks/results/{name}: the page asks for its table {index}")
    tables: list[list[str]] = []
    previous = ""
    for line in path.read_text().splitlines():
        if line.startswith("|"):
            if not previous.startswith("|"):
                tables.append([])
            tables[-1].append(line)
        previous = line
    if not 1 <= index <= len(tables):
        raise ValueError(f"benchmarks/results/{name} has {len(tables)} tables, not {index}")
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in tables[index - 1]]
    return Table([rows[0], *rows[2:]], [name])


def expand(markdown: str, results_link: str = "benchmarks/results/") -> str:
    """`markdown` with every results directive replaced by its table."""
    out = []
    for line in markdown.splitlines():
        m = DIRECTIVE.match(line.strip())
        if m is None:
            out.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip())]  # a table inside a list item
        name, index = m.groups()
        if name.endswith(".md"):
            made = md_table(name, int(index or 1))
        elif name in TABLES:
            made = TABLES[name]()
        else:
            raise KeyError(f"no results table {name!r}; the summaries are {sorted(TABLES)}")
        out.append(textwrap.indent(made.markdown(results_link), indent))
    return "\n".join(out) + ("\n" if markdown.endswith("\n") else "")


if __name__ == "__main__":
    for name in sys.argv[1:] or TABLES:
        print(f"## {name}\n\n{TABLES[name]().markdown()}")
