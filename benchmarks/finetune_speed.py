"""Fine-tuning speed on this machine, measured side by side in one run: training steps of
all-MiniLM-L6-v2 on SQuAD (384-token windows) or SST-2, with fp32 or bf16 autocast, and with
shuffled or length-grouped batches (`training.finetune --precision --group-by-length`).

    python -m benchmarks.finetune_speed                    # SQuAD, 4 arms x 30 steps (~6 min on 2 cores)
    python -m benchmarks.finetune_speed --task sst2 --steps 60
    python -m benchmarks.finetune_speed --steps 4 --results /tmp/fs   # smoke test

Each arm is a real `training.finetune` run from the same checkpoint, seed and data (the first
--examples training examples) with no evaluation. The figure is training rows per second over
the steps after the first --skip (warm-up: allocator, oneDNN kernels), taken from the run's
log.jsonl. bf16 needs a CPU with bf16 units (AVX512-BF16 or AMX) to pay; elsewhere it can be
slower than fp32. Results: benchmarks/results/finetune_speed.{json,md}.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]

from benchmarks._paths import write_results  # noqa: E402
from benchmarks.finetune_quality import DATA, RUNS, minilm  # noqa: E402
from training.finetune import FinetuneArgs, finetune  # noqa: E402
from training.plots import read_log  # noqa: E402

ARMS = [("fp32", False), ("fp32", True), ("bf16", False), ("bf16", True)]


def measure(
    task_run: str, init: Path, precision: str, grouped: bool, cli: argparse.Namespace, work: Path
) -> dict:
    spec = RUNS[task_run]
    out = work / f"{precision}-{'grouped' if grouped else 'shuffled'}"
    args = FinetuneArgs(
        task=spec["task"],
        init=str(init),
        train=str(DATA / spec["train"]),
        out=str(out),
        batch_size=cli.batch_size,
        max_steps=cli.steps,
        max_train_examples=cli.examples,
        precision=precision,
        group_by_length=grouped,
        log_every=1,
        max_seq_length=spec["args"].get("max_seq_length"),
        seed=cli.seed,
    )
    finetune(args)
    rows = [r for r in read_log(out / "log.jsonl") if r["split"] == "train"][cli.skip :]
    seconds = sum(1 / r["steps_per_s"] for r in rows)
    return {
        "precision": precision,
        "group_by_length": grouped,
        "steps": len(rows),
        "seconds": round(seconds, 2),
        "rows_per_s": round(len(rows) * cli.batch_size / seconds, 2),
        "first_loss": rows[0]["loss"],
        "last_loss": rows[-1]["loss"],
    }


def markdown(report: dict) -> str:
    base = report["arms"][0]["rows_per_s"]
    lines = [
        f"# Fine-tuning speed: {report['run']}, all-MiniLM-L6-v2",
        "",
        f"Hardware: {report['hardware']}. Produced by `python -m benchmarks.finetune_speed "
        f"{' '.join(report['argv'])}`. Batch {report['batch_size']}; the steps after the first "
        f"{report['skip']} of each arm; all arms in one run, one after another.",
        "",
        "| precision | batches | steps timed | rows/s | vs fp32 shuffled |",
        "|---|---|---|---|---|",
    ]
    for a in report["arms"]:
        batches = "grouped by length" if a["group_by_length"] else "shuffled"
        lines.append(
            f"| {a['precision']} | {batches} | {a['steps']} | {a['rows_per_s']:.1f} "
            f"| {a['rows_per_s'] / base:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--task", choices=("squad", "sst2", "conll"), default="squad")
    p.add_argument("--steps", type=int, default=30, help="optimizer steps per arm")
    p.add_argument("--skip", type=int, default=3, help="first steps of each arm not timed")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--examples", type=int, default=2000, help="first N training examples")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    cli = p.parse_args(argv)
    if cli.steps <= cli.skip:
        p.error(f"--steps {cli.steps} leaves nothing to time after --skip {cli.skip}")
    if not DATA.is_dir():
        raise SystemExit(f"{DATA} is absent: this benchmark needs ../shared/data")
    init = minilm()
    with tempfile.TemporaryDirectory() as tmp:
        arms = [measure(cli.task, init, prec, grp, cli, Path(tmp)) for prec, grp in ARMS]
    report = {
        "run": cli.task,
        "hardware": f"CPU {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}",
        "argv": sys.argv[1:] if argv is None else argv,
        "batch_size": cli.batch_size,
        "skip": cli.skip,
        "arms": arms,
    }
    print(
        write_results(
            cli.results, f"finetune_speed_{cli.task}", report, markdown(report)
        ).read_text()
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
