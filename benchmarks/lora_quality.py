"""LoRA against full fine-tuning and a frozen encoder from the real all-MiniLM-L6-v2 (issue 52):
the dev figure each way reaches, how many parameters it trains, how long it takes.

    python -m benchmarks.lora_quality                        # on a GPU: a few minutes
    python -m benchmarks.lora_quality --device cpu --max-train-examples 300 \\
        --max-eval-examples 300 --results /tmp/lora --out /tmp/lora/runs   # CPU smoke run

| task  | train -> dev                              | metric              |
|-------|-------------------------------------------|---------------------|
| sst2  | SST-2 train -> dev (classification)       | accuracy            |
| conll | CoNLL-2003 eng.train -> eng.testa (NER)   | entity F1 (strict)  |

Each way is one `training.finetune` run, in-process, with the same data, epochs, batch, seed and
precision (batches grouped by length, as benchmarks.finetune_quality runs them):

    full     every weight trains, lr 5e-5 (BERT's recipe)
    lora     --lora-rank 8 --lora-alpha 16 on query,value (peft's default targets for BERT),
             lr 2e-3: at 5e-4 (Hu et al. 2021, Table 9: RoBERTa-base's rate on SST-2) CoNLL
             stayed under-trained (4,000 sentences, 2 epochs, CPU: F1 52.8 against full's 72.0;
             2e-3: 73.0; SST-2 82.0 -> 83.6, full 83.6)
    frozen   --freeze-encoder, the head alone, lr 1e-3; CoNLL's head reads the last four layers
             concatenated (training.config.FEATURES: Devlin et al. §5.3's best feature-based
             choice)

SST-2's classifier reads the tokens' mean every way (--pooling mean: all-MiniLM-L6-v2 was tuned
for mean-pooled embeddings, and a frozen encoder has no trained [CLS] pooler). "train s" is the
optimizer steps' time (log.jsonl's elapsed_s), without tokenization and evaluation.
Results: benchmarks/results/lora_quality.{json,md} (--results); checkpoints under --out.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]

from benchmarks._data import shared_data  # noqa: E402
from benchmarks._machine import cpu_name  # noqa: E402
from benchmarks._paths import write_results  # noqa: E402
from benchmarks.finetune_quality import RUNS, minilm  # noqa: E402
from training import finetune as ft  # noqa: E402
from training.plots import read_log  # noqa: E402

TASKS = ("sst2", "conll")
WAYS = ("full", "lora", "frozen")
LORA = {"lora_rank": 8, "lora_alpha": 16.0, "lora_targets": "query,value"}
FROZEN_FEATURES = "last4-concat"  # CoNLL's frozen head; a key of training.config.FEATURES


def way_args(task: str, way: str, cli: argparse.Namespace) -> dict[str, Any]:
    """The finetune options that make `way` on `task`, beyond what every run shares."""
    extra: dict[str, Any] = {"lr": getattr(cli, f"lr_{way}")}
    if task == "sst2":
        extra["pooling"] = "mean"
    if way == "lora":
        extra |= LORA
    if way == "frozen":
        extra["freeze_encoder"] = True
        if task == "conll":
            extra["features"] = FROZEN_FEATURES
    return extra


def run_one(task: str, way: str, init: Path, data: Path, cli: argparse.Namespace) -> dict:
    spec = RUNS[task]
    args = ft.FinetuneArgs(
        task=spec["task"], init=str(init), train=str(data / spec["train"]),
        eval=str(data / spec["eval"]), out=str(cli.out / f"{task}-{way}"), epochs=cli.epochs,
        batch_size=cli.batch_size, seed=cli.seed, group_by_length=True, device=cli.device,
        precision=cli.precision, max_train_examples=cli.max_train_examples,
        max_eval_examples=cli.max_eval_examples, **way_args(task, way, cli),
    )  # fmt: skip
    built: dict[str, nn.Module] = {}

    def build(a: ft.FinetuneArgs, source: Path, labels: list[str] | None) -> nn.Module:
        built["model"] = ft.build_model(a, source, labels)  # LoRA is added to it in place
        return built["model"]

    print(f"[lora_quality] {task} {way}", flush=True)
    t0 = time.perf_counter()
    result = ft.finetune(args, build=build)
    params = list(built["model"].parameters())
    steps = [r for r in read_log(result.out / "log.jsonl") if r["split"] == "train"]
    return {
        "task": task, "way": way, "metric": spec["metric"],
        "value": result.best["metrics"].get(spec["metric"]),
        "trainable": sum(p.numel() for p in params if p.requires_grad),
        "parameters": sum(p.numel() for p in params),
        "steps": result.steps, "train_seconds": round(steps[-1]["elapsed_s"], 1),
        "wall_seconds": round(time.perf_counter() - t0, 1), "args": asdict(args),
    }  # fmt: skip


def device_name(device: str | None) -> str:
    if (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda"):
        return torch.cuda.get_device_name()
    return f"CPU {cpu_name()}, {torch.get_num_threads()} threads"


def count(n: int) -> str:
    """2,146 or 0.29M."""
    return f"{n:,}" if n < 100_000 else f"{n / 1e6:.2f}M"


def markdown(rows: list[dict], cli: argparse.Namespace, device: str) -> str:
    subset = [
        f"the first {n:,} {what} examples"
        for n, what in ((cli.max_train_examples, "training"), (cli.max_eval_examples, "dev"))
        if n
    ]
    lines = [
        "# LoRA against full fine-tuning and a frozen encoder (all-MiniLM-L6-v2)",
        "",
        f"Produced by `python -m benchmarks.lora_quality`: {cli.epochs} epoch(s), batch "
        f"{cli.batch_size}, seed {cli.seed}, {cli.precision}, batches grouped by length; lr "
        f"full {cli.lr_full:g}, LoRA {cli.lr_lora:g} (rank {LORA['lora_rank']}, alpha "
        f"{LORA['lora_alpha']:g}, {LORA['lora_targets']}), frozen {cli.lr_frozen:g} (CoNLL: "
        f"{FROZEN_FEATURES} features). SST-2: mean pooling.",
    ]
    if subset:
        lines.append(f"**Small run** on {' and '.join(subset)}: not quality figures.")
    lines += [
        "",
        "| task | way | trainable params | dev metric | train s | device |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        value = "n/a" if r["value"] is None else f"{r['metric']} {r['value']:.2f}"
        share = r["trainable"] / r["parameters"]
        trainable = f"{count(r['trainable'])} of {count(r['parameters'])} ({share:.2%})"
        lines.append(
            f"| {r['task']} | {r['way']} | {trainable} | {value} | {r['train_seconds']:.1f} "
            f"| {device} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=lambda prog: argparse.RawDescriptionHelpFormatter(
            prog, max_help_position=30
        ),
    )
    add = p.add_argument
    add("--tasks", nargs="+", choices=TASKS, default=list(TASKS), help="data sets (default: both)")
    add("--ways", nargs="+", choices=WAYS, default=list(WAYS), help="what trains (default: all)")
    add("--epochs", type=int, default=1, metavar="N", help="passes over the data (default 1)")
    add("--batch-size", type=int, default=32, metavar="N", help="examples per step (default 32)")
    add("--seed", type=int, default=42, help="data order, dropout, new weights (default 42)")
    add("--lr-full", type=float, default=5e-5, metavar="LR", help="full fine-tuning's (5e-5)")
    add("--lr-lora", type=float, default=2e-3, metavar="LR", help="LoRA's peak lr (2e-3)")
    add(
        "--lr-frozen", type=float, default=1e-3, metavar="LR", help="the frozen way's head's (1e-3)"
    )
    add("--max-train-examples", type=int, metavar="N", help="train on the first N examples only")
    add("--max-eval-examples", type=int, metavar="N", help="score the first N dev examples only")
    add("--device", help="cuda or cpu (default: cuda when present)")
    add("--precision", choices=("fp32", "bf16"), help="default: bf16 on a GPU, fp32 on a CPU")
    add("--init", type=Path, metavar="DIR", help="HF folder to start from (all-MiniLM-L6-v2)")
    add("--data", type=Path, metavar="DIR", help="data root (default: ../shared/data)")
    add("--out", type=Path, default=REPO / "runs" / "lora_quality", metavar="DIR",
        help="run folders (default: runs/lora_quality)")  # fmt: skip
    add("--results", type=Path, default=REPO / "benchmarks" / "results", metavar="DIR",
        help="lora_quality.json and .md (default: benchmarks/results)")  # fmt: skip
    cli = p.parse_args(argv)
    cuda = (cli.device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    cli.precision = cli.precision or ("bf16" if cuda else "fp32")
    data = shared_data(cli.data)
    init = cli.init or minilm()
    device = device_name(cli.device)

    rows = []
    for task in cli.tasks:
        for way in cli.ways:
            rows.append(run_one(task, way, init, data, cli))
            report = {"device": device, "init": str(init), "rows": rows}
            write_results(cli.results, "lora_quality", report, markdown(rows, cli, device))
    print((cli.results / "lora_quality.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
