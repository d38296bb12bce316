"""Evidence for the BERT variants (issue 10), three experiments on ../shared/data:

    python -m benchmarks.variants_evidence                       # all three: hours on a CPU
    python -m benchmarks.variants_evidence --runs distill --serve-duration 20
    python -m benchmarks.variants_evidence --budget 20s --corpus tinyshakespeare \\
        --finetune-steps 3 --max-train-examples 64 --max-eval-examples 32 --serve-duration 2 \\
        --results /tmp/ve --work /tmp/ve/runs                    # smoke test: minutes, not evidence

nsp       MLM+NSP (BERT) against MLM only on the same pretraining budget (BERT-mini, same batch,
          learning rate and data), and RoBERTa's whole recipe (`--recipe roberta`: MLM only,
          8x the batch through accumulation, lr 7e-4, beta2 0.98) on the same time; then each
          fine-tuned on SST-2 with the same settings. Liu et al. 2019 (§4.2) found NSP could
          go; we report what we measure.
distill   a MiniLM (6 layers) SST-2 teacher fine-tuned with training.finetune, a 3-layer
          student distilled from it with training.distill (one teacher layer out of two,
          triple loss); the student's SST-2 dev accuracy as a fraction of the teacher's (aim
          >= 0.97) and its throughput as a multiple of the teacher's: the raw ONNX Runtime
          session and the real server at --concurrency clients (benchmarks/_engine.py,
          _server.py, _load.py: the serving benchmark's harness), fp32, SST-2 dev sentences.
features  CoNLL-2003 (eng.train -> eng.testa) from MiniLM: full fine-tuning against the
          feature-based use of Devlin et al. §5.3 (--freeze-encoder --features last4-concat,
          a linear head where the paper had a BiLSTM), entity F1.

Results: benchmarks/results/variants_evidence.{json,md}; checkpoints and packages under --work.
The committed nsp run used `--config tiny --tokenizer runs/tok8k/tokenizer.json`, an uncased
8,000-entry WordPiece vocabulary trained on the same corpus files (training.tokenizer's
train_tokenizer then save_tokenizer); `--tokenizer train:8000` instead trains one in each arm.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from heads.contract import MANIFEST

REPO = Path(__file__).resolve().parents[1]

from benchmarks import _engine, _load, _server  # noqa: E402
from benchmarks._data import workload  # noqa: E402
from benchmarks._paths import write_results  # noqa: E402
from benchmarks.finetune_quality import minilm  # noqa: E402
from benchmarks.pretrain_evidence import (  # noqa: E402
    CORPUS,
    DATA,
    HELD_OUT,
    TRAIN_TEXT,
    VOCAB,
    finetune_sst2,
    hardware,
    random_init,
)
from heads.package import read_package  # noqa: E402
from training.distill import DistillArgs, distill  # noqa: E402
from training.export import export_package  # noqa: E402
from training.finetune import FinetuneArgs, FinetuneResult, finetune  # noqa: E402
from training.pretrain import parse_args as pretrain_args  # noqa: E402
from training.pretrain import pretrain  # noqa: E402

# arm -> the flags that make it; everything else is the same for every arm
PRETRAIN_ARMS = {
    "mlm+nsp (BERT)": ["--objective", "mlm+nsp"],
    "mlm only": ["--objective", "mlm"],
    "RoBERTa recipe": ["--recipe", "roberta"],
}


def precision() -> str:
    return "bf16" if torch.cuda.is_available() else "fp32"


# --- nsp: MLM+NSP vs MLM only ---------------------------------------------------------------


def run_nsp(cli: argparse.Namespace, work: Path) -> dict[str, Any]:
    arms = {}
    for arm, flags in PRETRAIN_ARMS.items():
        out = work / ("pretrain-" + arm.split()[0].replace("+", "-").lower())
        argv = [
            "--corpus", *(str(CORPUS / c) for c in cli.corpus),
            "--eval-corpus", str(CORPUS / HELD_OUT), "--tokenizer", cli.tokenizer,
            "--config", cli.config, "--max-seq-length", "128", "--batch-size", str(cli.batch_size),
            "--lr", str(cli.lr), "--warmup", str(cli.warmup), "--time-budget", cli.budget,
            "--eval-every", str(cli.eval_every), "--eval-batches", str(cli.eval_batches),
            "--save-every", str(cli.eval_every), "--seed", str(cli.seed), "--out", str(out),
            "--no-progress", *flags,
        ]  # fmt: skip
        if arm == "RoBERTa recipe":  # its own learning rate: the recipe's, not --lr
            i = argv.index("--lr")
            del argv[i : i + 2]
        if (out / "trainer_state.pt").is_file():
            argv.append("--resume")
        print(f"[{arm}] python -m training.pretrain {' '.join(argv)}", flush=True)
        t0 = time.perf_counter()
        result = pretrain(pretrain_args(argv))
        arms[arm] = {
            "command": "python -m training.pretrain " + " ".join(argv),
            "steps": result["step"],
            "seconds": round(time.perf_counter() - t0, 1),
            "eval": result["eval"],
            "sst2": finetune_sst2(out, work / f"sst2-{out.name}", cli),
        }
    # The baseline every arm must beat: the same architecture and vocabulary, untrained.
    first = work / ("pretrain-" + next(iter(PRETRAIN_ARMS)).split()[0].replace("+", "-").lower())
    init = random_init(first, work / "random-init", cli.seed)
    arms["no pretraining (random init)"] = {
        "command": "BertForPreTraining(config) saved untrained",
        "steps": 0,
        "seconds": 0.0,
        "eval": {},
        "sst2": finetune_sst2(init, work / "sst2-random-init", cli),
    }
    return {"budget": cli.budget, "config": cli.config, "tokenizer": cli.tokenizer, "arms": arms}


# --- distill: MiniLM teacher -> 3-layer student -------------------------------------------


def finetune_args(cli: argparse.Namespace, **kwargs: Any) -> dict[str, Any]:
    """The budget flags every fine-tuning and distillation run of this script shares."""
    return dict(
        max_steps=cli.finetune_steps,
        max_train_examples=cli.max_train_examples,
        max_eval_examples=cli.max_eval_examples,
        seed=cli.seed,
        precision=precision(),
        **kwargs,
    )


def throughput(package_dir: Path, cli: argparse.Namespace) -> dict[str, Any]:
    """Sequences/s of the fp32 graph on SST-2 dev sentences: raw session, batch 32 sorted
    by length, and the real server at --concurrency closed-loop clients."""
    package = read_package(package_dir)
    items = workload(package, DATA, limit=cli.serve_items)
    rows = [r for item in items for r in item.rows]
    backend = _engine.open_session(package.variant_path("fp32"), cli.threads, False)
    raw = _engine.throughput(backend, rows, 32, "sorted", cli.serve_duration)
    with _server.serve(package_dir, "fp32", cli.threads, False, []) as server:
        served = _load.run_level(
            server.base_url + "/classify",
            [i.body for i in items],
            [len(i.rows) for i in items],
            [i.tokens for i in items],
            cli.concurrency,
            warmup=min(2.0, cli.serve_duration / 2),
            duration=cli.serve_duration,
        ).summary()
    return {"raw_sequences_per_s": raw["sequences_per_s"], "served": served}


def run_distill(cli: argparse.Namespace, work: Path) -> dict[str, Any]:
    sst2 = {"train": str(DATA / "sst2" / "train.tsv"), "eval": str(DATA / "sst2" / "dev.tsv")}
    if cli.teacher:  # a teacher already fine-tuned with training.finetune (its run folder)
        teacher, teacher_args = _finished_run(Path(cli.teacher), "classification"), None
        print(f"[distill] teacher: {cli.teacher} (an earlier training.finetune run)", flush=True)
    else:
        teacher_args = FinetuneArgs(
            task="classification", init=str(minilm()), out=str(work / "sst2-teacher"),
            epochs=cli.epochs, export=True, **sst2, **finetune_args(cli),
        )  # fmt: skip
        print("[distill] teacher: training.finetune from all-MiniLM-L6-v2", flush=True)
        teacher = finetune(teacher_args)
    student_args = DistillArgs(
        task="classification", teacher=str(teacher.best_dir), student_layers=3,
        out=str(work / "sst2-student"), epochs=cli.epochs, export=True, **sst2,
        **finetune_args(cli),
    )  # fmt: skip
    student = distill(student_args)
    record = json.loads((student.out / "metrics.json").read_text())["distillation"]
    speed = {}
    for name, result in (("teacher", teacher), ("student", student)):
        assert result.package_dir is not None
        speed[name] = throughput(result.package_dir, cli)
        print(f"[distill] {name} throughput: {speed[name]}", flush=True)
    t, s = speed["teacher"], speed["student"]
    return {
        "teacher": {"accuracy": teacher.best["metrics"].get("accuracy"), "layers": 6,
                    "args": asdict(teacher_args) if teacher_args else {"run": cli.teacher}},
        "student": {"accuracy": student.best["metrics"].get("accuracy"), "layers": 3,
                    "from_teacher_layers": record["student_layers_from"],
                    "args": asdict(student_args)},
        "student_over_teacher": record.get("student_over_teacher"),
        "throughput": speed,
        "raw_speedup": round(s["raw_sequences_per_s"] / t["raw_sequences_per_s"], 2),
        "served_speedup": round(
            s["served"]["sequences_per_s"] / max(t["served"]["sequences_per_s"], 1e-9), 2
        ),
    }  # fmt: skip


# --- features: frozen MiniLM features vs fine-tuning on CoNLL ----------------------------


def run_features(cli: argparse.Namespace, work: Path) -> dict[str, Any]:
    conll = {
        "train": str(DATA / "conll2003" / "eng.train"),
        "eval": str(DATA / "conll2003" / "eng.testa"),
    }
    arms = {
        "fine-tuning (last layer)": {},
        "feature-based (last4-concat, frozen)": {
            "freeze_encoder": True, "features": "last4-concat", "lr": cli.feature_lr,
        },
    }  # fmt: skip
    out = {}
    if cli.finetuned_conll:  # the fine-tuning arm from an earlier training.finetune run
        run = _finished_run(Path(cli.finetuned_conll), "token-classification")
        summary = json.loads((run.out / "metrics.json").read_text())
        out["fine-tuning (last layer)"] = {
            "f1": run.best["metrics"].get("f1"),
            "seconds": summary["train_seconds"] + summary.get("eval_seconds", 0.0),
            "args": {"run": cli.finetuned_conll, **summary.get("args", {})},
        }
        del arms["fine-tuning (last layer)"]
    for arm, extra in arms.items():
        name = "conll-features" if extra else "conll-finetune"
        args = FinetuneArgs(
            task="token-classification", init=str(minilm()), out=str(work / name),
            epochs=cli.epochs, **conll, **finetune_args(cli), **extra,
        )  # fmt: skip
        print(f"[features] {arm}", flush=True)
        t0 = time.perf_counter()
        result = finetune(args)
        out[arm] = {
            "f1": result.best["metrics"].get("f1"),
            "seconds": round(time.perf_counter() - t0, 1),
            "args": asdict(args),
        }
    return out


def _finished_run(out: Path, task: str) -> Any:
    """An earlier training.finetune run folder, as finetune() would have returned it."""
    summary = json.loads((out / "metrics.json").read_text())
    package = out / "package"
    if not (package / MANIFEST).is_file():  # the throughput needs the served package
        export_package(out / "best", task, package)
    return FinetuneResult(
        out=out,
        best_dir=out / "best",
        package_dir=package,
        best=summary["best"],
        final=summary["final"],
        steps=summary["steps"],
        train_seconds=summary["train_seconds"],
    )


# --- the report ---------------------------------------------------------------------------


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# BERT variants: evidence",
        "",
        f"Hardware: {report['hardware']}. Produced by:",
        "",
        *(
            f"- {name}: `python -m benchmarks.variants_evidence {' '.join(args)}`"
            for name, args in report["argv"].items()
        ),
    ]
    if report["smoke"]:
        lines.append("\n**Smoke run** (step limits or example caps): the figures are not evidence.")
    if "nsp" in report:
        n = report["nsp"]
        lines += ["", f"## MLM+NSP vs MLM only ({n['budget']} pretraining each, "
                  f"BERT-{n.get('config', 'mini')}, tokenizer {n.get('tokenizer', 'bert-base-uncased')})", "",
                  "| pretraining | steps | held-out MLM accuracy | SST-2 dev accuracy |",
                  "|---|---|---|---|"]  # fmt: skip
        for arm, r in report["nsp"]["arms"].items():
            mlm = r["eval"].get("mlm_accuracy", float("nan")) if r["eval"] else float("nan")
            lines.append(f"| {arm} | {r['steps']} | {mlm:.3f} | {r['sst2']['accuracy']:.1f} |")
    if "distill" in report:
        d = report["distill"]
        ratio = d["student_over_teacher"]
        cap = d["student"]["args"].get("max_train_examples")
        lines += ["", "## Distillation: MiniLM SST-2 teacher -> 3-layer student", "",
                  f"Student: {d['student']['args'].get('epochs')} epoch(s) of distillation on "
                  + (f"the first {cap:,} SST-2 train sentences." if cap else "SST-2 train."), "",
                  "| model | layers | SST-2 dev accuracy | raw seq/s | served seq/s |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for name in ("teacher", "student"):
            t = d["throughput"][name]
            lines.append(
                f"| {name} | {d[name]['layers']} | {d[name]['accuracy']:.1f} | "
                f"{t['raw_sequences_per_s']:.0f} | {t['served']['sequences_per_s']:.0f} |"
            )
        lines += ["", f"Student / teacher accuracy: **{ratio:.3f}** (aim >= 0.97); speed-up: "
                  f"**{d['raw_speedup']:.2f}x** raw, **{d['served_speedup']:.2f}x** served."]  # fmt: skip
    if "features" in report:
        lines += ["", "## CoNLL-2003 dev: feature-based vs fine-tuning (MiniLM)", "",
                  "| run | entity F1 | time |", "|---|---|---|"]  # fmt: skip
        for arm, r in report["features"].items():
            lines.append(f"| {arm} | {r['f1']:.2f} | {r['seconds']:.0f}s |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--runs", nargs="+", choices=("nsp", "distill", "features"),
                   default=["nsp", "distill", "features"])  # fmt: skip
    g = p.add_argument_group("nsp: pretraining")
    g.add_argument("--budget", default="30m", help="pretraining time per arm (90s, 30m, 2h)")
    g.add_argument("--corpus", nargs="+", default=TRAIN_TEXT, help="folders under corpus/")
    g.add_argument("--config", choices=("tiny", "mini", "small"), default="mini")
    g.add_argument(
        "--tokenizer",
        default=str(VOCAB),
        help="vocab.txt / tokenizer.json, or train:N (a WordPiece vocabulary trained on the corpus)",
    )
    g.add_argument("--batch-size", type=int, default=32)
    g.add_argument("--lr", type=float, default=5e-4, help="peak lr of the BERT and MLM arms")
    g.add_argument("--warmup", type=int, default=200)
    g.add_argument("--eval-every", type=int, default=500)
    g.add_argument("--eval-batches", type=int, default=50)
    g.add_argument("--finetune-epochs", type=int, default=2, help="SST-2 after pretraining")
    g.add_argument("--finetune-lr", type=float, default=1e-4)
    g = p.add_argument_group("fine-tuning and distillation budgets")
    g.add_argument("--epochs", type=int, default=3, help="teacher, student and CoNLL runs")
    g.add_argument("--feature-lr", type=float, default=1e-3, help="the frozen-encoder head's")
    g.add_argument("--finetune-steps", type=int, default=0, help="cap every run (0: epochs)")
    g.add_argument("--max-train-examples", type=int, help="first N training examples (smoke)")
    g.add_argument("--max-eval-examples", type=int, help="first N evaluation examples (smoke)")
    g.add_argument("--teacher", help="distill: an earlier SST-2 training.finetune run folder")
    g.add_argument(
        "--finetuned-conll", help="features: an earlier CoNLL training.finetune run folder"
    )
    g = p.add_argument_group("distill: throughput")
    g.add_argument("--concurrency", type=int, default=32, help="served: closed-loop clients")
    g.add_argument("--serve-duration", type=float, default=20.0, help="seconds per measurement")
    g.add_argument("--serve-items", type=int, default=512, help="SST-2 dev sentences used")
    g.add_argument("--threads", type=int, default=0, help="ORT intra-op threads (0: ORT's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", type=Path, default=REPO / "runs" / "variants_evidence")
    p.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    cli = p.parse_args(argv)
    if not (DATA / "sst2" / "train.tsv").is_file():
        print(f"error: {DATA} is absent (../shared/data beside the repository)", file=sys.stderr)
        return 2

    smoke = bool(cli.finetune_steps)  # example caps are recorded with each experiment
    results = cli.results / "variants_evidence.json"
    runs = {"nsp": run_nsp, "distill": run_distill, "features": run_features}
    # Experiments can be run one invocation at a time: the others' results are kept.
    earlier = json.loads(results.read_text()) if results.is_file() and not smoke else {}
    report: dict[str, Any] = {k: v for k, v in earlier.items() if k in runs and k not in cli.runs}
    report["argv"] = earlier.get("argv", {}) if isinstance(earlier.get("argv"), dict) else {}
    report |= {"hardware": hardware(), "smoke": smoke}
    for name in cli.runs:
        report["argv"][name] = sys.argv[1:] if argv is None else argv
        report[name] = runs[name](cli, cli.work)
        # written after each experiment: an interrupted run leaves its partial results
        write_results(cli.results, "variants_evidence", report, markdown(report))
    print((cli.results / "variants_evidence.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
