"""Our fine-tuning loop beside transformers' `Trainer` on the same rows, batches and settings
(issue 34): training steps per second of all-MiniLM-L6-v2, interleaved ours / Trainer's.

    python -m benchmarks.finetune_vs_trainer                        # CoNLL-2003 and SST-2, fp32 and bf16
    python -m benchmarks.finetune_vs_trainer --tasks conll --precisions fp32 --rounds 3
    python -m benchmarks.finetune_vs_trainer --steps 6 --skip 2 --rounds 1 --examples 64 \\
        --results /tmp/fvt                                          # smoke test

Ours is a real `training.finetune` run; Trainer's is `AutoModelForTokenClassification` /
`AutoModelForSequenceClassification` with `DataCollatorForTokenClassification` /
`DataCollatorWithPadding` (first word piece labelled, -100 elsewhere: our rows, handed over as
they are). Both: lr 5e-5, batch 16, max length 128, 10% warm-up, weight decay 0.01, grad-norm
clip 1.0, seed 42, --steps optimizer steps (the schedule ends there), no evaluation, no
saving. Trainer's sampler is replaced by a sequential one over the rows in our first epoch's
batch order, so each step of both pads the same 16 rows to the same length.

Each arm runs in its own process (thread settings and allocator state do not leak), arms
alternate ours, Trainer's, ours, ... for --rounds rounds. A step is timed from one forward to
the next (batch, forward, backward, clip, optimizer, logging): steps/s is over the steps after
the first --skip. "final loss" is each loop's logged mean over the last 10 steps. Results:
benchmarks/results/finetune_vs_trainer.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]

from benchmarks._machine import cpu_name  # noqa: E402
from benchmarks._paths import write_results  # noqa: E402
from benchmarks.finetune_quality import DATA, RUNS, minilm  # noqa: E402

TASKS = ("conll", "sst2")
PRECISIONS = ("fp32", "bf16")
LOG_EVERY = 10  # both loops log the mean loss of the last 10 steps


def settings(cli: argparse.Namespace) -> dict[str, Any]:
    """The settings both loops share (issue 34)."""
    return {"lr": 5e-5, "batch_size": cli.batch_size, "max_seq_length": 128, "warmup_ratio": 0.1,
            "weight_decay": 0.01, "max_grad_norm": 1.0, "seed": cli.seed, "steps": cli.steps}  # fmt: skip


def timed(stamps: list[float], skip: int) -> tuple[int, float]:
    """(steps, seconds) between the start of step `skip` and that of the last step."""
    steps = len(stamps) - 1 - skip
    return steps, stamps[-1] - stamps[skip]


# --- the two arms (each in its own process) --------------------------------------------


def ours(task: str, precision: str, init: Path, cli: argparse.Namespace, work: Path) -> dict:
    from training.finetune import FinetuneArgs, compute_loss, finetune
    from training.plots import read_log

    s, spec, stamps = settings(cli), RUNS[task], []

    def loss(model: torch.nn.Module, head: str, batch: dict) -> torch.Tensor:
        stamps.append(time.perf_counter())  # one forward per step: a step starts here
        return compute_loss(model, head, batch)

    args = FinetuneArgs(
        task=spec["task"], init=str(init), train=str(cli.data / spec["train"]), out=str(work),
        lr=s["lr"], batch_size=s["batch_size"], max_seq_length=s["max_seq_length"],
        warmup_ratio=s["warmup_ratio"], weight_decay=s["weight_decay"],
        max_grad_norm=s["max_grad_norm"], seed=s["seed"], max_steps=s["steps"],
        max_train_examples=cli.examples, precision=precision, log_every=LOG_EVERY,
    )  # fmt: skip
    finetune(args, loss_fn=loss)
    rows = [r for r in read_log(work / "log.jsonl") if r["split"] == "train"]
    # the window Trainer's last log row covers: steps up to the last multiple of LOG_EVERY
    windows = [r for r in rows if r["step"] % LOG_EVERY == 0] or rows
    return {"stamps": stamps, "final_loss": windows[-1]["loss"]}


def trainer_rows(task: str, init: Path, cli: argparse.Namespace) -> tuple[list[dict], int]:
    """Our encoded rows, in the order of our first epoch's batches, as Trainer features; and
    the number of labels."""
    from training.data.epochs import EpochBatches, epoch_batches
    from training.data.tasks import training_rows
    from training.tokenizer import load_tokenizer

    spec = RUNS[task]
    rows, labels, _ = training_rows(spec["task"], cli.data / spec["train"], load_tokenizer(init),
                                    128, limit=cli.examples, log=lambda _: None)  # fmt: skip
    sampler = EpochBatches(rows, cli.batch_size, cli.seed).sampler  # ours draws the same
    indices = [i for b in epoch_batches(sampler, 0, cli.batch_size) for i in b]
    features = []
    for i in indices:
        seq, target = rows[i]["sequence"], rows[i]["labels"]
        features.append({
            "input_ids": seq.input_ids.tolist(), "token_type_ids": seq.token_type_ids.tolist(),
            "attention_mask": [1] * len(seq), "labels": target.tolist() if task == "conll" else int(target),
        })  # fmt: skip
    return features, len(labels or [])


def reference(task: str, precision: str, init: Path, cli: argparse.Namespace, work: Path) -> dict:
    import transformers as tf
    from torch.utils.data import SequentialSampler

    s, stamps = settings(cli), []
    features, n_labels = trainer_rows(task, init, cli)
    tokenizer = tf.AutoTokenizer.from_pretrained(init)
    if task == "conll":
        auto, collator = tf.AutoModelForTokenClassification, tf.DataCollatorForTokenClassification
    else:
        auto, collator = tf.AutoModelForSequenceClassification, tf.DataCollatorWithPadding
    tf.set_seed(s["seed"])
    model = auto.from_pretrained(init, num_labels=n_labels)

    class Stamps(tf.TrainerCallback):
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            stamps.append(time.perf_counter())

    class InOurOrder(tf.Trainer):  # the rows come already in our batch order
        def _get_train_sampler(self, train_dataset: Any = None) -> SequentialSampler:
            return SequentialSampler(train_dataset or self.train_dataset)

    args = tf.TrainingArguments(
        output_dir=str(work), per_device_train_batch_size=s["batch_size"], learning_rate=s["lr"],
        max_steps=s["steps"], warmup_ratio=s["warmup_ratio"], weight_decay=s["weight_decay"],
        max_grad_norm=s["max_grad_norm"], seed=s["seed"], bf16=precision == "bf16",
        use_cpu=True, logging_steps=LOG_EVERY, save_strategy="no", report_to="none",
    )  # fmt: skip
    trainer = InOurOrder(model=model, args=args, train_dataset=features,
                         data_collator=collator(tokenizer), callbacks=[Stamps()])  # fmt: skip
    trainer.train()
    # fewer steps than LOG_EVERY log no window: then the run's mean ("train_loss")
    losses = [r[k] for r in trainer.state.log_history for k in ("loss", "train_loss") if k in r]
    return {"stamps": stamps, "final_loss": losses[0 if len(losses) == 1 else -2]}


ARMS = {"ours": ours, "trainer": reference}


def run_arm(arm: str, task: str, precision: str, cli: argparse.Namespace) -> dict:
    """One arm in a fresh process; its timing and loss."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        command = [sys.executable, "-m", "benchmarks.finetune_vs_trainer", "--arm", arm,
                   "--tasks", task, "--precisions", precision, "--steps", str(cli.steps),
                   "--batch-size", str(cli.batch_size), "--examples", str(cli.examples),
                   "--seed", str(cli.seed), "--skip", str(cli.skip), "--data", str(cli.data),
                   "--arm-out", str(result)]  # fmt: skip
        subprocess.run(command, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        raw = json.loads(result.read_text())
    steps, seconds = timed(raw["stamps"], cli.skip)
    return {"steps": steps, "steps_per_s": steps / seconds, "final_loss": raw["final_loss"]}


def compare(task: str, precision: str, cli: argparse.Namespace) -> dict:
    """--rounds rounds of ours then Trainer's; ratio = ours / Trainer's, per round."""
    runs: dict[str, list[dict]] = {"ours": [], "trainer": []}
    for r in range(cli.rounds):
        for arm in ARMS:
            runs[arm].append(run_arm(arm, task, precision, cli))
            print(f"{task} {precision} round {r + 1} {arm}: "
                  f"{runs[arm][-1]['steps_per_s']:.3f} steps/s", file=sys.stderr)  # fmt: skip
    ratios = [o["steps_per_s"] / t["steps_per_s"] for o, t in zip(runs["ours"], runs["trainer"], strict=True)]  # fmt: skip
    row: dict[str, Any] = {"task": task, "precision": precision, "rounds": cli.rounds}
    for arm, rs in runs.items():
        row[f"{arm}_steps_per_s"] = round(statistics.median(r["steps_per_s"] for r in rs), 3)
        row[f"{arm}_final_loss"] = [round(r["final_loss"], 4) for r in rs]
    row["ratio"] = round(statistics.median(ratios), 3)
    row["ratios"] = [round(x, 3) for x in ratios]
    return row


def markdown(report: dict) -> str:
    lines = [
        "# Our fine-tuning loop vs transformers' Trainer (issue 34)",
        "",
        f"CPU {report['cpu']}, {report['threads']} torch threads, torch {report['torch']}, "
        f"transformers {report['transformers']}. Produced by `python -m "
        f"benchmarks.finetune_vs_trainer {' '.join(report['argv'])}`. all-MiniLM-L6-v2, "
        f"batch {report['settings']['batch_size']}, {report['settings']['steps']} steps, the first "
        f"{report['skip']} not timed; the same batches for both; medians over interleaved rounds.",
        "",
        "| task | precision | ours steps/s | Trainer steps/s | ours / Trainer (per round) "
        "| final loss ours | final loss Trainer |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        per_round = ", ".join(f"{x:.2f}" for x in r["ratios"])
        lines.append(
            f"| {r['task']} | {r['precision']} | {r['ours_steps_per_s']:.2f} "
            f"| {r['trainer_steps_per_s']:.2f} | **{r['ratio']:.2f}** ({per_round}) "
            f"| {', '.join(f'{x:.3f}' for x in r['ours_final_loss'])} "
            f"| {', '.join(f'{x:.3f}' for x in r['trainer_final_loss'])} |"
        )
    return "\n".join(lines) + "\n"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.finetune_vs_trainer",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS), help="runs to compare")  # fmt: skip
    p.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS), help="fp32 and/or bf16 autocast")  # fmt: skip
    p.add_argument("--steps", type=int, default=150, help="optimizer steps per arm (the schedule's length)")  # fmt: skip
    p.add_argument("--skip", type=int, default=10, help="first steps of each arm not timed (warm-up)")  # fmt: skip
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds of ours then Trainer's")  # fmt: skip
    p.add_argument("--batch-size", type=int, default=16, help="rows per step")
    p.add_argument("--examples", type=int, default=0, help="first N training examples (0: steps x batch)")  # fmt: skip
    p.add_argument("--seed", type=int, default=42, help="data order, dropout, head weights")
    p.add_argument("--data", type=Path, default=DATA, help="../shared/data or a copy of its sst2/ and conll2003/")  # fmt: skip
    p.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results", help="where the .json and .md go")  # fmt: skip
    p.add_argument("--arm", choices=tuple(ARMS), help=argparse.SUPPRESS)  # a child process
    p.add_argument("--arm-out", type=Path, help=argparse.SUPPRESS)
    cli = p.parse_args(argv)
    cli.examples = cli.examples or cli.steps * cli.batch_size
    if cli.steps <= cli.skip + 1:
        p.error(f"--steps {cli.steps} leaves nothing to time after --skip {cli.skip}")
    return cli


def main(argv: list[str] | None = None) -> int:
    cli = parse(argv)
    if not cli.data.is_dir():
        raise SystemExit(f"{cli.data} is absent: this benchmark needs ../shared/data")
    if cli.arm:  # child: one arm, its stamps to --arm-out
        with tempfile.TemporaryDirectory() as work:
            raw = ARMS[cli.arm](cli.tasks[0], cli.precisions[0], minilm(), cli, Path(work))
        cli.arm_out.write_text(json.dumps(raw))
        return 0
    import transformers

    results = [compare(t, p, cli) for t in cli.tasks for p in cli.precisions]
    report = {
        "cpu": cpu_name(), "threads": torch.get_num_threads(), "torch": torch.__version__,
        "transformers": transformers.__version__, "argv": sys.argv[1:] if argv is None else argv,
        "settings": settings(cli), "skip": cli.skip, "results": results,
    }  # fmt: skip
    print(write_results(cli.results, "finetune_vs_trainer", report, markdown(report)).read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
