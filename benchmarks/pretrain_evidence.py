"""Evidence that pretraining works: pretrain BERT-mini on ../shared/data/corpus for a fixed time
budget, then fine-tune SST-2 from it and from a random initialisation with the same settings.
The gap between the two SST-2 dev accuracies is what pretraining bought.

    python -m benchmarks.pretrain_evidence                       # 60 min pretraining + 8 x SST-2
    python -m benchmarks.pretrain_evidence --config small --budget 4m --batch-size 256 --jobs 8
    python -m benchmarks.pretrain_evidence --budget 3h --batch-size 64
    python -m benchmarks.pretrain_evidence --throughput          # GPU only: + base at 128, seq/s, MFU
    python -m benchmarks.pretrain_evidence --throughput-only     # GPU only: just that, compile off/on
    python -m benchmarks.pretrain_evidence --budget 20s --finetune-steps 5 \\
        --max-eval-examples 64 --results /tmp/pe --work /tmp/pe/runs   # smoke test: minutes

Pretraining: `training.pretrain --config mini --objective mlm+nsp --max-seq-length 128` on every
corpus file but WikiText-2 (Gutenberg, the public-domain books, Tiny Shakespeare: 4.0 M tokens
with the bert-base-uncased vocabulary), WikiText-2 valid held out for the MLM / NSP figures.
The device is the GPU when there is one (bf16 autocast), else the CPU (fp32, or --precision bf16).

The held-out MLM figures come with a unigram baseline: every masked token predicted from the
pretraining corpus's token frequencies, on the same batches and masks. A model below its loss
has learned something from context; a model at it has only learned how common words are.

Fine-tuning: `training.finetune --task classification` on SST-2 train -> dev, the same arguments
for both starting points (AdamW, batch 32, --finetune-epochs epochs, 10% warm-up), on all of
train and on its first --low-data sentences (2,000, for --low-data-epochs), once per
learning rate in --finetune-lr (default 1e-4 and 3e-4: Turc et al. use 1e-4 for the small BERTs,
and a briefly pretrained model fine-tunes best at a higher rate than a random one). The gap
compares each start's best rate, as Devlin et al. pick the best of a grid on dev; every run is
in the table. Random init is BertForPreTraining(config) with the pretrained model's config and
vocabulary, saved untrained.

Published context (../shared/data/README.md): BERT-Mini fine-tuned on SST-2 reaches 85.9
(Turc et al. 2019, GLUE test, after 1M pretraining steps on BookCorpus + Wikipedia); BERT-Base
without pretraining about 80 (Cramming, 2022). An hour on a CPU is a small fraction of that.

Results: benchmarks/results/pretrain_evidence.{json,md}; checkpoints under --work.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]

from benchmarks._paths import write_results  # noqa: E402
from training.checkpoint import save_model  # noqa: E402
from training.config import BertConfig  # noqa: E402
from training.data.corpus import corpus_files  # noqa: E402
from training.finetune import FinetuneArgs, finetune  # noqa: E402
from training.model import BertForPreTraining  # noqa: E402
from training.plots import read_log  # noqa: E402
from training.pretrain import (  # noqa: E402
    H100_BF16_TFLOPS,
    held_out_batches,
    make_streams,
    parse_args,
    pretrain,
)
from training.tokenizer import load_tokenizer  # noqa: E402
from training.trainer import PRECISIONS, Dist, resolve_precision  # noqa: E402

DATA = REPO.parent / "shared" / "data"
CORPUS = DATA / "corpus"
TRAIN_TEXT = ["gutenberg_nltk", "misc_pd_books", "tinyshakespeare"]  # all but WikiText-2
HELD_OUT = "wikitext-2/wiki.valid.tokens"
VOCAB = DATA / "vocab" / "bert-base-uncased" / "vocab.txt"  # SST-2 is lower-cased text


def hardware() -> str:
    if torch.cuda.is_available():
        return (
            f"{torch.cuda.get_device_name()} (CUDA {torch.version.cuda}), torch {torch.__version__}"
        )
    return f"CPU {platform.processor() or platform.machine()} x {torch.get_num_threads()} threads, torch {torch.__version__}"


def pretrain_model(cli: argparse.Namespace, out: Path) -> dict:
    argv = [
        "--corpus",
        *(str(CORPUS / c) for c in TRAIN_TEXT),
        "--eval-corpus",
        str(CORPUS / HELD_OUT),
        "--tokenizer",
        cli.tokenizer,
        "--config",
        cli.config,
        "--objective",
        "mlm+nsp",
        "--documents",
        cli.documents,
        "--max-seq-length",
        "128",
        "--batch-size",
        str(cli.batch_size),
        "--lr",
        str(cli.lr),
        "--warmup",
        str(cli.warmup),
        "--time-budget",
        cli.budget,
        "--eval-every",
        str(cli.eval_every),
        "--eval-batches",
        str(cli.eval_batches),
        "--save-every",
        str(cli.eval_every),
        "--out",
        str(out),
        "--seed",
        str(cli.seed),
        "--precision",
        cli.precision,
    ]
    if cli.dropout is not None:
        argv += ["--dropout", str(cli.dropout)]
    if (out / "trainer_state.pt").is_file():
        argv.append("--resume")  # an interrupted benchmark continues where it stopped
    print("pretraining: python -m training.pretrain " + " ".join(argv), flush=True)
    t0 = time.perf_counter()
    args = parse_args(argv)
    result = pretrain(args)
    rows = read_log(out / "log.jsonl")
    train = [r for r in rows if r["split"] == "train"]
    return {
        "steps": result["step"],
        "seconds": round(time.perf_counter() - t0, 1),
        "eval": result["eval"],
        "first_eval": next((r for r in rows if r["split"] == "eval"), {}),
        "seq_per_s": sum(r["seq_per_s"] for r in train[-5:]) / max(len(train[-5:]), 1),
        "unigram": unigram_baseline(args, out),
        "command": "python -m training.pretrain " + " ".join(argv),
    }


def unigram_baseline(args: argparse.Namespace, out: Path) -> dict:
    """What MLM scores without context: every masked token predicted from the pretraining
    corpus's token frequencies (add-half smoothed), over the very batches and masks the
    held-out evaluation uses. Below its loss, the model has learned something from context."""
    tokenizer = load_tokenizer(out / "tokenizer.json")
    train, held_out = make_streams(args, Dist(), tokenizer, corpus_files(args.corpus))
    counts = np.bincount(np.asarray(train.corpus.tokens), minlength=tokenizer.get_vocab_size())
    log_p = np.log((counts + 0.5) / (counts + 0.5).sum())
    labels = [b["labels"] for b in held_out_batches(held_out, args.eval_batches)]
    chosen = np.concatenate([y[y != -100].numpy() for y in labels])
    return {
        "mlm_loss": float(-log_p[chosen].mean()),
        "mlm_accuracy": float((chosen == log_p.argmax()).mean()),
    }


def random_init(pretrained: Path, out: Path, seed: int) -> Path:
    """The same architecture and vocabulary, untrained."""
    torch.manual_seed(seed)
    model = BertForPreTraining(BertConfig.load(pretrained))
    save_model(model, out, load_tokenizer(pretrained / "tokenizer.json"))
    return out


def finetune_sst2(
    init: Path, out: Path, cli: argparse.Namespace, lr: float, examples: int | None
) -> dict:
    """One fine-tuning run: on all of SST-2 train, or on its first `examples` sentences for
    --low-data-epochs. A finished run's result is kept beside its checkpoints and reused, so
    an interrupted benchmark (a lent GPU's time running out) resumes with the runs left."""
    done = out / "evidence.json"
    if done.is_file():
        return json.loads(done.read_text())
    if cli.jobs > 1:  # the runs share the machine's cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // cli.jobs))
    args = FinetuneArgs(
        task="classification",
        init=str(init),
        train=str(DATA / "sst2" / "train.tsv"),
        eval=str(DATA / "sst2" / "dev.tsv"),
        out=str(out),
        epochs=cli.low_data_epochs if examples else cli.finetune_epochs,
        lr=lr,
        batch_size=32,
        max_steps=cli.finetune_steps,
        max_train_examples=examples,
        max_eval_examples=cli.max_eval_examples,
        seed=cli.seed,
        precision=cli.precision,
        group_by_length=True,
    )
    print(f"fine-tuning SST-2 ({examples or 'all'} sentences) from {init} at lr {lr:g}", flush=True)
    t0 = time.perf_counter()
    result = finetune(args)
    report = {
        "accuracy": result.best["metrics"].get("accuracy"),
        "best_step": result.best["step"],
        "steps": result.steps,
        "seconds": round(time.perf_counter() - t0, 1),
        "lr": lr,
        "examples": examples,
        "args": asdict(args),
    }
    done.write_text(json.dumps(report, indent=2) + "\n")
    return report


def finetune_all(starts: dict[str, Path], cli: argparse.Namespace) -> dict[str, dict[str, list]]:
    """Every start x arm x learning rate, --jobs of them at a time (separate processes: on a
    GPU one small model's fine-tuning is bound by its host thread, so runs side by side share
    the device instead of queueing for it). {arm: {start: [run, ...]}}."""
    arms = {"all": None} | ({f"first {cli.low_data:,}": cli.low_data} if cli.low_data else {})
    plan = [
        (arm, name, (start, cli.work / f"sst2-{name.split()[0]}-{examples or 'all'}-lr{lr:g}", cli, lr, examples))
        for arm, examples in arms.items()
        for name, start in starts.items()
        for lr in cli.finetune_lr
    ]  # fmt: skip
    if cli.jobs > 1:
        with ProcessPoolExecutor(cli.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            results = list(pool.map(finetune_sst2, *zip(*(job for _, _, job in plan), strict=True)))
    else:
        results = [finetune_sst2(*job) for _, _, job in plan]
    table: dict[str, dict[str, list]] = {arm: {name: [] for name in starts} for arm in arms}
    for (arm, name, _), result in zip(plan, results, strict=True):
        table[arm][name].append(result)
    return table


def best(runs: list[dict]) -> dict:
    return max(runs, key=lambda r: r["accuracy"])


def gpu_throughput(cli: argparse.Namespace, work: Path) -> dict:
    """BERT-base at sequence length 128, bf16: sequences/s and MFU over the last log windows."""
    out = work / "base-throughput"
    argv = [
        "--corpus",
        *(str(CORPUS / c) for c in TRAIN_TEXT),
        "--tokenizer",
        str(VOCAB),
        "--config",
        "base",
        "--max-seq-length",
        "128",
        "--batch-size",
        str(cli.throughput_batch),
        "--steps",
        str(cli.throughput_steps),
        "--log-every",
        "10",
        "--save-every",
        "1000000",
        "--documents",
        "files",
        "--out",
        str(out),
        "--no-progress",
    ] + (["--compile"] if cli.compile else [])
    if out.exists():
        import shutil

        shutil.rmtree(out)
    pretrain(parse_args(argv))
    return throughput_summary(out / "log.jsonl") | {
        "config": "base",
        "batch_size": cli.throughput_batch,
        "compiled": cli.compile,
        "command": "python -m training.pretrain " + " ".join(argv),
    }


def throughput_summary(log: Path) -> dict:
    """Mean sequences/s, tokens/s and MFU of a pretraining log's train windows, the first two
    left out (CUDA start-up, torch.compile's compilation)."""
    rows = [r for r in read_log(log) if r["split"] == "train"][2:]
    if not rows:
        raise ValueError(f"{log}: fewer than three logged windows; raise --throughput-steps")
    return {
        key: sum(r[key] for r in rows) / len(rows) for key in ("seq_per_s", "tokens_per_s", "mfu")
    } | {"windows": [round(r["seq_per_s"]) for r in rows]}


def throughput_markdown(report: dict) -> str:
    lines = [
        "# Pretraining throughput on the GPU: BERT-base, sequence 128, bf16",
        "",
        f"{report['hardware']}. MFU against {H100_BF16_TFLOPS} TFLOP/s (dense bf16 peak of the H100 SXM "
        "and of the H200, NVIDIA datasheets). Means over the logged windows after the first two.",
        "",
        "| torch.compile | batch | sequences/s | tokens/s | MFU | per window (seq/s) |",
        "|---|---|---|---|---|---|",
    ]
    for t in report["runs"]:
        lines.append(
            f"| {'on' if t['compiled'] else 'off'} | {t['batch_size']} | {t['seq_per_s']:,.0f} | "
            f"{t['tokens_per_s']:,.0f} | {100 * t['mfu']:.1f}% | {', '.join(map(str, t['windows']))} |"
        )
    lines += ["", *(f"`{t['command']}`" for t in report["runs"])]
    return "\n".join(lines) + "\n"


def markdown(report: dict) -> str:
    p, ev = report["pretraining"], report["pretraining"]["eval"]
    first = p["first_eval"]
    ft = report["sst2"]
    lines = [
        f"# Does pretraining help? BERT-{report.get('config', 'mini')}, fixed budget, then SST-2",
        "",
        f"Hardware: {report['hardware']}. Produced by `python -m benchmarks.pretrain_evidence "
        f"{' '.join(report['argv'])}`.",
    ]
    if report["smoke"]:
        lines.append("\n**Smoke run** (tiny budget or step limits): not evidence.")
    lines += [
        "",
        f"Pretraining: {p['steps']} steps in {report['budget']} ({p['seq_per_s']:.1f} sequences/s), "
        f"held-out WikiText-2 valid:",
        "",
        "| | MLM loss | MLM accuracy | NSP accuracy |",
        "|---|---|---|---|",
        f"| step 0 | {first.get('mlm_loss', float('nan')):.3f} | {first.get('mlm_accuracy', 0):.3f} "
        f"| {first.get('nsp_accuracy', 0):.3f} |",
        f"| unigram baseline (no context) | {p['unigram']['mlm_loss']:.3f} | "
        f"{p['unigram']['mlm_accuracy']:.3f} | 0.5 |",
        f"| step {p['steps']} | {ev.get('mlm_loss', float('nan')):.3f} | "
        f"{ev.get('mlm_accuracy', 0):.3f} | {ev.get('nsp_accuracy', 0):.3f} |",
        "",
        "SST-2 dev accuracy, same fine-tuning settings for both starts (AdamW, batch 32, 10% "
        f"warm-up; {report.get('finetune_epochs', 1)} epoch(s) on all of train, "
        f"{report.get('low_data_epochs', '-')} on the low-data arm):",
        "",
        "| train sentences | start from | lr | accuracy | steps | time |",
        "|---|---|---|---|---|---|",
    ]
    arms = ft if "all" in ft else {"all": ft}  # results written before the low-data arm
    for arm, starts in arms.items():
        for name, runs in starts.items():
            for r in runs:
                lines.append(
                    f"| {arm} | {name} | {r['lr']:g} | {r['accuracy']:.1f} | {r['steps']} | {r['seconds']:.0f}s |"
                )
    lines.append("")
    for arm, starts in arms.items():
        gap = (
            best(starts["pretrained"])["accuracy"] - best(starts["random init"])["accuracy"]
        )  # in %
        lines.append(
            f"**Gap, {arm} sentences: {gap:+.1f} points** for pretraining (best learning rate against best)."
        )
    if report.get("throughput"):
        t = report["throughput"]
        lines += [
            "",
            f"GPU throughput, BERT-base at 128, batch {t['batch_size']}, bf16"
            f"{', compiled' if t['compiled'] else ''}: {t['seq_per_s']:.0f} sequences/s, "
            f"{t['tokens_per_s']:.0f} tokens/s, MFU {100 * t['mfu']:.1f}% (of {H100_BF16_TFLOPS} TFLOP/s, bf16 dense).",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--budget", default="60m", help="pretraining time budget (90s, 30m, 2h)")
    p.add_argument(
        "--config",
        choices=("tiny", "mini", "small"),
        default="mini",
        help="model preset to pretrain (tiny 2x128 runs ~10x more sequences/s than mini on a CPU)",
    )
    p.add_argument(
        "--tokenizer",
        default=str(VOCAB),
        help="vocab.txt / tokenizer.json, or train:N for an uncased WordPiece vocabulary of N "
        "trained on the pretraining corpus (default: bert-base-uncased's 30,522)",
    )
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument(
        "--lr",
        type=float,
        default=1e-3,
        help="pretraining peak learning rate (BERT-mini, batch 32, 250 steps: MLM loss 6.45 at "
        "1e-3, 6.52 at 5e-4; 2e-3 stalls NSP)",
    )
    p.add_argument("--warmup", type=int, default=300)
    p.add_argument("--documents", choices=("blocks", "files"), default="blocks")
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--eval-batches", type=int, default=50)
    p.add_argument("--finetune-epochs", type=int, default=2)
    p.add_argument(
        "--finetune-lr",
        type=float,
        nargs="+",
        default=[1e-4, 3e-4],
        help="fine-tuning peak learning rates: each start point is fine-tuned at every one, and "
        "the gap compares each one's best (Devlin et al. pick the best of a grid on dev)",
    )
    p.add_argument(
        "--finetune-steps", type=int, default=0, help="cap fine-tuning steps (0: epochs)"
    )
    p.add_argument(
        "--low-data",
        type=int,
        default=2000,
        help="also fine-tune both starts on the first N train sentences only (0: not)",
    )
    p.add_argument("--low-data-epochs", type=int, default=5, help="epochs of the low-data arm")
    p.add_argument(
        "--jobs", type=int, default=1, help="fine-tuning runs side by side, each its own process"
    )
    p.add_argument("--max-eval-examples", type=int, help="evaluate SST-2 on the first N (smoke)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dropout", type=float, help="pretraining's dropout (fine-tuning keeps 0.1)")
    p.add_argument(  # both stages: pretraining and the SST-2 fine-tuning
        "--precision", choices=PRECISIONS, default="auto", help="auto: bf16 on a GPU, else fp32"
    )
    p.add_argument("--throughput", action="store_true", help="also measure base on the GPU")
    p.add_argument("--throughput-batch", type=int, default=128)
    p.add_argument("--throughput-steps", type=int, default=60)
    p.add_argument("--compile", action="store_true", help="torch.compile the throughput run")
    p.add_argument(
        "--throughput-only",
        action="store_true",
        help="only BERT-base's GPU throughput, compile off and on: pretrain_throughput.{json,md}",
    )
    p.add_argument("--work", type=Path, default=REPO / "runs" / "pretrain_evidence")
    p.add_argument("--name", default="pretrain_evidence", help="results file name under --results")
    p.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    cli = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cli.precision = resolve_precision(cli.precision, device)
    if not CORPUS.is_dir():
        print(f"error: {CORPUS} is absent (../shared/data beside the repository)", file=sys.stderr)
        return 2
    if cli.throughput_only:
        if not torch.cuda.is_available():
            print("error: --throughput-only needs a CUDA GPU", file=sys.stderr)
            return 2
        runs = [gpu_throughput(argparse.Namespace(**{**vars(cli), "compile": c}), cli.work)
                for c in (False, True)]  # fmt: skip
        report = {"hardware": hardware(), "runs": runs}
        path = write_results(
            cli.results, "pretrain_throughput", report, throughput_markdown(report)
        )
        print(path.read_text())
        return 0

    pretrained = cli.work / cli.config
    report: dict = {
        "hardware": hardware(),
        "argv": sys.argv[1:] if argv is None else argv,
        "budget": cli.budget,
        "smoke": bool(cli.finetune_steps or cli.max_eval_examples),
        "config": cli.config,
        "tokenizer": cli.tokenizer,
        "finetune_epochs": cli.finetune_epochs,
        "low_data_epochs": cli.low_data_epochs,
        "pretraining": pretrain_model(cli, pretrained),
    }
    init = random_init(pretrained, cli.work / "random-init", cli.seed)
    report["sst2"] = finetune_all({"pretrained": pretrained, "random init": init}, cli)
    if cli.throughput:
        if torch.cuda.is_available():
            report["throughput"] = gpu_throughput(cli, cli.work)
        else:
            print("--throughput needs a GPU: skipped", file=sys.stderr)

    print(write_results(cli.results, cli.name, report, markdown(report)).read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
