"""Pretrain BERT from raw text: masked LM + next-sentence prediction (or SOP, or MLM alone).

    # two minutes on a laptop CPU: a tiny model and a vocabulary trained on the corpus itself
    python -m training.pretrain --corpus ../shared/data/corpus/gutenberg_nltk \\
        --tokenizer train:8000 --config tiny --steps 300 --batch-size 32 --lr 5e-4 --out runs/tiny

    # BERT-mini for an hour, WikiText-2 valid held out for evaluation, bert-base-uncased vocab
    python -m training.pretrain --corpus ../shared/data/corpus/{gutenberg_nltk,misc_pd_books,tinyshakespeare} \\
        --eval-corpus ../shared/data/corpus/wikitext-2 \\
        --tokenizer ../shared/data/vocab/bert-base-uncased/vocab.txt \\
        --config mini --time-budget 1h --batch-size 64 --lr 5e-4 --out runs/mini

    # RoBERTa's recipe (Liu et al. 2019): MLM only on full-length packed segments, masks drawn
    # anew for every batch, 8x the batch through accumulation at lr 7e-4, Adam beta2 0.98
    python -m training.pretrain --recipe roberta --corpus ... --tokenizer ... --config mini \
        --steps 10000 --batch-size 32 --out runs/roberta-mini     # 256 sequences per step

    # after an interruption (Ctrl-C saves a checkpoint; so does every --save-every): same command
    python -m training.pretrain ... --out runs/mini --resume

    # BERT-base on 8 GPUs of one machine (DDP; bf16 autocast; compiled)
    torchrun --nproc_per_node 8 -m training.pretrain ... --config base --batch-size 32 --compile

What it does. The corpus is read, split into documents and sentences and tokenized once into a
memory-mapped cache (training/data/corpus.py); every epoch makes new segment pairs from it and
every batch draws new masks (training/data/pretraining.py). The model is training.model's
BertForPreTraining, trained with AdamW (no weight decay on biases and LayerNorm), linear
warm-up then linear decay to zero, gradient clipping and accumulation.

What it writes into --out, and rewrites at every checkpoint:
    config.json, model.safetensors, tokenizer.json, vocab.txt   Hugging Face layout:
        transformers.BertForPreTraining.from_pretrained(out) and `--init out` of
        training.finetune both load it
    trainer_state.pt     optimizer, step, data position and every RNG state, for --resume
    log.jsonl, loss.png  train rows every --log-every steps, eval rows every --eval-every
    pretrain_args.json   the arguments of the run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tokenizers import Tokenizer
from torch import nn
from tqdm import tqdm

from training.checkpoint import CheckpointError, load_model, save_model
from training.config import PRESETS, BertConfig, ConfigError
from training.data.corpus import (
    DOCUMENT_UNITS,
    CorpusError,
    corpus_files,
    read_text,
    tokenize_corpus,
)
from training.data.pretraining import (
    MASKED_LM_PROB,
    OBJECTIVES,
    SHORT_SEQ_PROB,
    PretrainingStream,
)
from training.model import BertForPreTraining
from training.optim import adamw
from training.plots import plot_curves, read_log, write_log_row
from training.tokenizer import TokenizerError, load_tokenizer, save_tokenizer, train_tokenizer

H100_BF16_TFLOPS = 989.5  # dense bf16 peak of an H100 SXM (NVIDIA H100 datasheet; 1979 sparse)
EVAL_SEED = 20181011  # fixed: every evaluation sees the same pairs and the same masks
STATE_FILE = "trainer_state.pt"
# --recipe: the defaults each paper changes; any flag given on the command line still wins.
RECIPES: dict[str, dict[str, Any]] = {
    "bert": {},  # Devlin et al. 2018: the defaults as the options below state them
    # Liu et al. 2019 (RoBERTa): no NSP, full-length segments packed across documents (§4.2);
    # dynamic masking (§4.1) is what this script always does; 8x the batch at lr 7e-4 where
    # BERT's 256 took 1e-4 (§4.3, Table 3: 2K sequences, same passes over the data); Adam
    # beta2 0.98 for large-batch stability (§3.1).
    "roberta": {"objective": "mlm", "grad_accum": 8, "lr": 7e-4, "adam_beta2": 0.98},
    # Lan et al. 2019 (ALBERT): factorised embeddings, shared layers, sentence-order prediction.
    "albert": {"objective": "mlm+sop", "config": "albert-base"},
}
DATA_ARGS = (
    "corpus",
    "documents",
    "objective",
    "max_seq_length",
    "short_seq_prob",
    "mlm_probability",
    "whole_word_masking",
    "batch_size",
    "grad_accum",
    "seed",
)


# --- arguments --------------------------------------------------------------------------


def parse_duration(text: str) -> float:
    """'90' or '90s', '30m', '2h', '1h30m' -> seconds."""
    parts = re.fullmatch(
        r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*", text
    )
    if not text.strip() or not parts or not any(parts.groups()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 90s, 30m, 2h or 1h30m")
    h, m, s = (float(g) if g else 0.0 for g in parts.groups())
    return 3600 * h + 60 * m + s


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The description (this module's docstring) kept as written, so the example commands read
    as commands; each option's default after its help, when it has one worth showing."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
            text += " (default: %(default)s)"
        return text


def build_parser(recipe: str = "bert") -> argparse.ArgumentParser:
    """The command line, with `recipe`'s defaults (RECIPES) in place of BERT's."""
    p = argparse.ArgumentParser(
        prog="python -m training.pretrain",
        description=__doc__,
        epilog="Recipe defaults are BERT's (Devlin et al. 2018) unless noted.",
        formatter_class=HelpFormatter,
    )
    data = p.add_argument_group("data")
    data.add_argument(
        "--corpus",
        nargs="+",
        required=True,
        metavar="PATH",
        help="UTF-8 text files, or folders of them. Each file and each blank-line-separated "
        "block is a document; documents are split into sentences.",
    )
    data.add_argument(
        "--eval-corpus",
        nargs="+",
        metavar="PATH",
        help="held-out text for evaluation (MLM loss and accuracy, NSP/SOP accuracy), e.g. "
        "WikiText-2 valid. Keep it out of --corpus.",
    )
    data.add_argument(
        "--documents",
        choices=DOCUMENT_UNITS,
        default="blocks",
        help="what a document is: every blank-line-separated block (create_pretraining_data's "
        "format), or every file (prose whose blank lines only end paragraphs gives longer "
        "segment pairs this way)",
    )
    data.add_argument(
        "--tokenizer",
        required=True,
        metavar="{vocab.txt|tokenizer.json|train:SIZE}",
        help="a WordPiece vocab.txt, a tokenizer.json, a folder holding one, or train:SIZE to "
        "learn a SIZE-entry WordPiece vocabulary from --corpus (saved into --out)",
    )
    data.add_argument(
        "--cased",
        action="store_true",
        help="with train:SIZE, keep case (default: lower-case, like bert-base-uncased)",
    )
    data.add_argument(
        "--max-seq-length",
        type=int,
        default=128,
        help="tokens per example, [CLS] and [SEP]s included. BERT trains 90%% of steps at 128, "
        "the last 10%% at 512",
    )
    data.add_argument(
        "--short-seq-prob",
        type=float,
        default=SHORT_SEQ_PROB,
        help="how often a pair aims at a random shorter length, so the model also sees short "
        "inputs (create_pretraining_data)",
    )
    data.add_argument(
        "--mlm-probability",
        type=float,
        default=MASKED_LM_PROB,
        help="fraction of tokens chosen for prediction (80%% [MASK], 10%% random, 10%% kept)",
    )
    data.add_argument(
        "--whole-word-masking",
        action="store_true",
        help="choose whole words: a word's ## pieces are masked together",
    )
    data.add_argument(
        "--cache-dir",
        type=Path,
        help="where the tokenized corpus is cached (default: $XDG_CACHE_HOME or ~/.cache, "
        "under bert-heads/pretraining)",
    )
    data.add_argument(
        "--skip-bad-files",
        action="store_true",
        help="skip binary or non-UTF-8 files (counted in the log) instead of stopping",
    )

    model = p.add_argument_group("model and objective")
    model.add_argument(
        "--recipe",
        choices=RECIPES,
        default=recipe,
        help="a paper's defaults: bert (MLM+NSP); roberta (MLM only, no NSP, --grad-accum 8 "
        "with --lr 7e-4, --adam-beta2 0.98: Liu et al. 2019); albert (--config albert-base, "
        "MLM+SOP: Lan et al. 2019). Flags given explicitly override the recipe's",
    )
    model.add_argument(
        "--config",
        default="mini",
        metavar="{" + ",".join(PRESETS) + "}|PATH",
        help="a size preset (layers/hidden: tiny 2/128, mini 4/256, small 4/512, medium 8/512, "
        "base 12/768, large 24/1024; albert-base / albert-large: the same shapes with ALBERT's "
        "E=128 factorised embeddings and shared layers, use with --objective mlm+sop) or a "
        "config.json; vocab_size comes from the tokenizer",
    )
    model.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default="mlm+nsp",
        help="mlm+nsp: BERT (B is the next segment or one from another document); mlm+sop: "
        "ALBERT (B follows A, or the two are swapped); mlm: RoBERTa (full-length packed "
        "segments, no second task)",
    )

    opt = p.add_argument_group("optimisation")
    length = opt.add_mutually_exclusive_group(required=True)
    length.add_argument("--steps", type=int, help="optimizer steps to train for")
    length.add_argument(
        "--time-budget",
        type=parse_duration,
        metavar="DURATION",
        help="train for this long (90s, 30m, 2h), evaluation and checkpoints not counted; "
        "the learning rate decays over the budget (Geiping & Goldstein 2022, 'Cramming')",
    )
    opt.add_argument(
        "--batch-size",
        type=int,
        default=32,
        help="sequences per micro-batch per process; the optimizer step sees "
        "batch-size x grad-accum x processes (BERT: 256)",
    )
    opt.add_argument(
        "--grad-accum",
        type=int,
        default=1,
        help="micro-batches whose gradients add up to one step (a large batch in small memory)",
    )
    opt.add_argument(
        "--lr", type=float, default=1e-4, help="peak learning rate (BERT: 1e-4 at batch 256)"
    )
    opt.add_argument(
        "--warmup",
        type=int,
        help="linear warm-up steps (default: 1%% of --steps, as BERT's 10k of 1M; 100 with --time-budget)",
    )
    opt.add_argument(
        "--weight-decay", type=float, default=0.01, help="AdamW decoupled weight decay"
    )
    opt.add_argument(
        "--adam-beta2",
        type=float,
        default=0.999,
        help="AdamW's second-moment decay (BERT 0.999; RoBERTa 0.98, steadier at large batches)",
    )
    opt.add_argument(
        "--max-grad-norm", type=float, default=1.0, help="clip the global gradient norm"
    )
    opt.add_argument(
        "--seed", type=int, default=0, help="model init, example order, masks, dropout"
    )

    run = p.add_argument_group("run")
    run.add_argument("--out", type=Path, required=True, help="checkpoint, log and plot folder")
    run.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out exactly where its last checkpoint left it",
    )
    run.add_argument(
        "--stop-at",
        type=int,
        metavar="STEP",
        help="checkpoint and stop at this step without changing the schedule (split one run "
        "into jobs; --resume continues it)",
    )
    run.add_argument(
        "--save-every", type=int, default=1000, help="checkpoint every N steps (and at the end)"
    )
    run.add_argument(
        "--eval-every",
        type=int,
        default=500,
        help="evaluate every N steps (and at the start and end)",
    )
    run.add_argument(
        "--eval-batches", type=int, default=50, help="batches per evaluation (at most one pass)"
    )
    run.add_argument("--log-every", type=int, default=10, help="write a train row every N steps")
    run.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    add_precision_option(run)
    run.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the model (GPU: faster after a warm-up)",
    )
    run.add_argument(
        "--peak-tflops",
        type=float,
        default=H100_BF16_TFLOPS,
        help="the accelerator's peak, the denominator of MFU (default: H100 SXM bf16 dense)",
    )
    run.add_argument("--no-progress", action="store_true", help="no tqdm bar (logs only)")
    p.set_defaults(**RECIPES[recipe])
    return p


def add_precision_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--precision {auto,fp32,bf16}; `bf16_autocast` reads it."""
    parser.add_argument(
        "--precision",
        choices=("auto", "fp32", "bf16"),
        default="auto",
        help="bf16 autocast (fp32 master weights) or plain fp32; auto: bf16 on a GPU, fp32 on a "
        "CPU. bf16 also pays on CPUs with bf16 units (AVX512-BF16 / AMX): 1.6-1.9x a step here",
    )


def bf16_autocast(precision: str, cuda: bool) -> bool:
    return precision == "bf16" or (precision == "auto" and cuda)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse with the defaults of the --recipe named in argv (BERT's without one)."""
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--recipe", choices=RECIPES, default="bert")
    known, _ = first.parse_known_args(argv)
    return build_parser(known.recipe).parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
    def positive(name: str) -> None:
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise SystemExit(f"error: --{name.replace('_', '-')} must be positive, not {value}")

    for name in (
        "steps",
        "time_budget",
        "batch_size",
        "grad_accum",
        "lr",
        "max_seq_length",
        "save_every",
        "eval_every",
        "eval_batches",
        "log_every",
    ):
        positive(name)
    if args.max_seq_length < 8:
        raise SystemExit("error: --max-seq-length must be at least 8")
    if not 0 < args.mlm_probability < 1 or not 0 <= args.short_seq_prob <= 1:
        raise SystemExit("error: --mlm-probability must be in (0, 1), --short-seq-prob in [0, 1]")
    if args.warmup is None:
        args.warmup = max(1, args.steps // 100) if args.steps else 100


# --- schedule, optimizer, FLOPs ---------------------------------------------------------


def get_lr(step: int, progress: float, lr: float, warmup: int) -> float:
    """Linear warm-up to `lr` over `warmup` steps, then linear decay to 0 at progress 1, where
    progress is step / steps (or elapsed / time budget). As in BERT's optimization.py the
    decay is measured from step 0, so the rate at the end of warm-up is lr x (1 - progress)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    return lr * max(0.0, 1.0 - progress)


def flops_per_token(config: BertConfig, seq_len: int, mlm_probability: float) -> float:
    """Training FLOPs per token, forward + backward (3 x forward, 2 FLOPs per multiply-add):

        6 * L * (4 H^2 + 2 H F)       the encoder's matmuls (Q, K, V, output; FFN in and out)
      + 6 * p * (H E + V E)           the MLM head, run only at the fraction p of chosen tokens
      + 12 * L * H * T                attention: scores Q K^T and the weighted sum over T keys

    i.e. nanoGPT's / PaLM's 6 N + 12 L H T with N the weights a token passes through;
    embedding lookups, LayerNorms, softmax and the per-sequence pooler/NSP head are left out.
    E = H for BERT; ALBERT adds its E -> H projection (6 E H), and its shared layers cost
    what unshared ones do: a token still passes through L of them."""
    H, L = config.hidden_size, config.num_hidden_layers
    F, V = config.intermediate_size, config.vocab_size
    E = config.embedding_size or H
    projection = E * H if config.embedding_size else 0
    return (
        6 * (L * (4 * H * H + 2 * H * F) + projection)
        + 6 * mlm_probability * (H * E + V * E)
        + 12 * L * H * seq_len
    )


# --- setup ------------------------------------------------------------------------------


class Run:
    """Who this process is: rank, world size, device."""

    def __init__(self, device: str) -> None:
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
        if cuda and not torch.cuda.is_available():
            raise SystemExit("error: --device cuda but no CUDA device is visible")
        self.device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
        if cuda:
            torch.cuda.set_device(self.device)
        if self.world > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if cuda else "gloo")

    @property
    def main(self) -> bool:
        return self.rank == 0

    def log(self, message: str) -> None:
        if self.main:
            tqdm.write(message, file=sys.stderr)

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def agree(self, value: float) -> float:
        """The largest of every rank's value (the value itself on one process)."""
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    def first_then_others(self, make: Any) -> Any:
        """Rank 0 makes a file-backed thing (a cache, a tokenizer); the others then reuse it."""
        result = make() if self.main else None
        self.barrier()
        return result if self.main else make()


def get_tokenizer(args: argparse.Namespace, run: Run, files: list[Path]) -> Tokenizer:
    if args.resume and (args.out / "tokenizer.json").is_file():
        return load_tokenizer(args.out / "tokenizer.json")
    if not args.tokenizer.startswith("train:"):
        return load_tokenizer(args.tokenizer)
    try:
        size = int(args.tokenizer.removeprefix("train:"))
    except ValueError:
        raise SystemExit(
            f"error: --tokenizer {args.tokenizer}: expected train:VOCAB_SIZE"
        ) from None

    def train() -> Tokenizer:
        if run.main:
            run.log(
                f"tokenizer: training a {size}-entry WordPiece vocabulary on {len(files)} files"
            )
            good = []
            for f in files:  # the tokenizer trainer itself would read bad bytes silently
                try:
                    read_text(f)
                    good.append(f)
                except CorpusError:
                    if not args.skip_bad_files:
                        raise
            tok = train_tokenizer(good, size, lowercase=not args.cased)
            save_tokenizer(tok, args.out)
            return tok
        return load_tokenizer(args.out / "tokenizer.json")

    return run.first_then_others(train)


def get_config(args: argparse.Namespace, tokenizer: Tokenizer) -> BertConfig:
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    pad = tokenizer.token_to_id("[PAD]")
    if args.config in PRESETS:
        config = BertConfig.preset(args.config, vocab_size=vocab_size)
    else:
        config = BertConfig.load(args.config).replace(vocab_size=vocab_size)
    config = config.replace(pad_token_id=pad if pad is not None else 0)
    if args.max_seq_length > config.max_position_embeddings:
        raise SystemExit(
            f"error: --max-seq-length {args.max_seq_length} exceeds the model's "
            f"max_position_embeddings {config.max_position_embeddings}"
        )
    return config


# --- evaluation -------------------------------------------------------------------------


@torch.no_grad()
def held_out_batches(stream: PretrainingStream, batches: int) -> Iterator[dict[str, torch.Tensor]]:
    """The evaluation's first `batches` batches (at most one pass), the same pairs and masks
    every time: the stream is rewound to its start and its masking reseeded."""
    stream.epoch, stream.position = 0, 0
    stream.generator.manual_seed(EVAL_SEED)
    for _ in range(min(batches, stream.batches_per_epoch)):
        yield stream.next_batch()


def evaluate(
    model: BertForPreTraining, stream: PretrainingStream, batches: int, run: Run, autocast: Any
) -> dict[str, float]:
    """MLM loss and accuracy over the chosen tokens, NSP/SOP accuracy over the pairs, always on
    the same batches and masks (held_out_batches)."""
    was_training = model.training
    model.eval()
    mlm_loss = mlm_correct = chosen = nsp_correct = pairs = 0.0
    for held_out in held_out_batches(stream, batches):
        batch = {k: v.to(run.device) for k, v in held_out.items()}
        with autocast:
            out = model(**batch)
        targets = batch["labels"][batch["labels"] != -100]
        mlm_loss += out.mlm_loss.item() * len(targets)
        mlm_correct += (out.prediction_logits.argmax(-1) == targets).sum().item()
        chosen += len(targets)
        if "next_sentence_label" in batch:
            nsp = batch["next_sentence_label"]
            nsp_correct += (out.seq_relationship_logits.argmax(-1) == nsp).sum().item()
            pairs += len(nsp)
    model.train(was_training)
    metrics = {"mlm_loss": mlm_loss / chosen, "mlm_accuracy": mlm_correct / chosen}
    if pairs:
        metrics["nsp_accuracy" if stream.objective == "mlm+nsp" else "sop_accuracy"] = (
            nsp_correct / pairs
        )
    return metrics


# --- checkpoints ------------------------------------------------------------------------


def rng_state(device: torch.device) -> dict[str, Any]:
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def save_checkpoint(
    args: argparse.Namespace,
    run: Run,
    model: BertForPreTraining,
    tokenizer: Tokenizer,
    optimizer: torch.optim.Optimizer,
    stream: PretrainingStream,
    step: int,
    elapsed: float,
) -> None:
    """Every rank's data position and RNG go to rank 0, which writes the folder: files land in
    a temporary folder first and are moved in with trainer_state.pt last, so a crash mid-save
    leaves the previous checkpoint readable."""
    per_rank = {"data": stream.state_dict(), "rng": rng_state(run.device)}
    if run.world > 1:
        gathered: list[Any] = [None] * run.world
        dist.all_gather_object(gathered, per_rank)
    else:
        gathered = [per_rank]
    if run.main:
        tmp = args.out / ".checkpoint.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        save_model(model, tmp, tokenizer)
        state = {
            "step": step,
            "elapsed": elapsed,
            "world_size": run.world,
            "ranks": gathered,
            "optimizer": optimizer.state_dict(),
        }
        torch.save(state, tmp / STATE_FILE)
        for f in sorted(tmp.iterdir(), key=lambda f: f.name == STATE_FILE):
            os.replace(f, args.out / f.name)
        tmp.rmdir()
        plot_log(args.out)
    run.barrier()


def plot_log(out: Path) -> None:
    """loss.png from log.jsonl, without the throughput columns: thousands of tokens/s on the
    metrics panel's axis would flatten the accuracy curves beside them."""
    rows = read_log(out / "log.jsonl")
    plotted = out / ".plotted.jsonl"
    skip = ("seq_per_s", "tokens_per_s", "mfu", "grad_norm", "elapsed_s")
    plotted.write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k not in skip}) + "\n" for r in rows)
    )
    plot_curves(plotted, out / "loss.png", title=f"pretraining {out.name}")
    plotted.unlink()


def load_checkpoint(
    args: argparse.Namespace,
    run: Run,
    model: BertForPreTraining,
    optimizer: torch.optim.Optimizer,
    stream: PretrainingStream,
) -> tuple[int, float]:
    path = args.out / STATE_FILE
    if not path.is_file():
        raise SystemExit(f"error: --resume but {path} does not exist: nothing to resume")
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(load_model(args.out, task="pretraining").state_dict())
    optimizer.load_state_dict(state["optimizer"])
    if state["world_size"] == run.world:
        mine = state["ranks"][run.rank]
        stream.load_state_dict(mine["data"])
        set_rng_state(mine["rng"], run.device)
    else:  # same place in the data, new per-rank order: no longer bit-for-bit reproducible
        run.log(f"warning: resuming {state['world_size']} processes' run on {run.world}")
        data = state["ranks"][0]["data"]
        data["position"] = data["position"] * state["world_size"] // run.world
        stream.load_state_dict(data)
    # Rows logged after this checkpoint belong to the steps about to be redone.
    log_path = args.out / "log.jsonl"
    if run.main and log_path.is_file():
        rows = [r for r in read_log(log_path) if r.get("step", 0) <= state["step"]]
        log_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return int(state["step"]), float(state["elapsed"])


def check_resume_args(args: argparse.Namespace, run: Run) -> None:
    path = args.out / "pretrain_args.json"
    if not path.is_file():
        return
    saved = json.loads(path.read_text())
    now = json.loads(json.dumps(vars(args), default=str))
    changed = [k for k in DATA_ARGS if saved.get(k) != now.get(k)]
    if changed:
        run.log(f"warning: --resume with changed {', '.join(changed)}: not an exact continuation")


# --- training ---------------------------------------------------------------------------


class StopRequest:
    """Ctrl-C or SIGTERM (a scheduler's preemption) finishes the current step, checkpoints and
    stops; a second Ctrl-C stops at once."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True
        signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def agreed(self, run: Run) -> bool:
        """Every rank stops at the same step (one of them may have been signalled alone)."""
        return bool(run.agree(float(self.requested)))


class Meter:
    """Losses and throughput since the last log row. Losses are summed on the device, so a
    step costs no host-device synchronisation until the row is written."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.reset()

    def reset(self) -> None:
        self.losses = torch.zeros(3, device=self.device)  # loss, mlm_loss, nsp_loss
        self.micro_batches = self.steps = 0
        self.counts = [0.0, 0.0, 0.0]  # sequences, real tokens, model FLOPs
        self.seconds = 0.0

    def add(self, out: Any, batch: dict[str, torch.Tensor], flops_per_token: float) -> None:
        nsp = out.nsp_loss if out.nsp_loss is not None else out.loss.new_zeros(())
        self.losses += torch.stack([out.loss, out.mlm_loss, nsp]).detach()
        self.micro_batches += 1
        tokens = float(batch["attention_mask"].sum())
        for i, n in enumerate((len(batch["input_ids"]), tokens, tokens * flops_per_token)):
            self.counts[i] += n

    def row(self, args: argparse.Namespace, run: Run, step: int) -> dict[str, Any]:
        """Mean losses over the window; sequences/s and tokens/s over all processes; on GPU the
        model FLOPs utilisation against --peak-tflops per process."""
        loss, mlm_loss, nsp_loss = (self.losses / self.micro_batches).tolist()
        counts = torch.tensor(self.counts, dtype=torch.float64, device=run.device)
        if run.world > 1:
            dist.all_reduce(counts)
        seqs, tokens, flops = counts.tolist()
        seconds = max(self.seconds, 1e-9)
        row: dict[str, Any] = {"split": "train", "step": step, "loss": loss, "mlm_loss": mlm_loss}
        if args.objective != "mlm":
            row["nsp_loss" if args.objective == "mlm+nsp" else "sop_loss"] = nsp_loss
        row |= {"seq_per_s": seqs / seconds, "tokens_per_s": tokens / seconds}
        if run.device.type == "cuda":
            row["mfu"] = flops / seconds / (args.peak_tflops * 1e12 * run.world)
        self.reset()
        return row


def make_streams(
    args: argparse.Namespace, run: Run, tokenizer: Tokenizer, files: list[Path]
) -> tuple[PretrainingStream, PretrainingStream | None]:
    """The training stream (this process's share) and the evaluation stream (fixed seed)."""

    def stream(paths: list[Any], seed: int, rank: int, world: int) -> PretrainingStream:
        corpus = run.first_then_others(
            lambda: tokenize_corpus(
                paths, tokenizer, args.cache_dir, args.documents, args.skip_bad_files, run.log
            )
        )
        return PretrainingStream(
            corpus,
            tokenizer,
            args.objective,
            args.max_seq_length,
            args.batch_size,
            seed=seed,
            rank=rank,
            world_size=world,
            short_seq_prob=args.short_seq_prob,
            whole_word_masking=args.whole_word_masking,
            mlm_probability=args.mlm_probability,
            pad_to_max_length=args.compile,  # one input shape: no recompilation per length
        )

    train = stream(files, args.seed, run.rank, run.world)
    held_out = stream(args.eval_corpus, EVAL_SEED, 0, 1) if args.eval_corpus else None
    return train, held_out


def pretrain(args: argparse.Namespace) -> dict[str, Any]:
    """Train as the arguments say; returns the final step, train row and evaluation."""
    check_args(args)
    run = Run(args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.resume and (args.out / STATE_FILE).is_file():
        raise SystemExit(
            f"error: {args.out} holds a run already: add --resume, or pick another --out"
        )
    if args.resume:
        check_resume_args(args, run)
    files = corpus_files(args.corpus)
    tokenizer = get_tokenizer(args, run, files)
    stream, eval_stream = make_streams(args, run, tokenizer, files)

    torch.manual_seed(args.seed)
    config = get_config(args, tokenizer)
    model = BertForPreTraining(config).to(run.device)
    if run.world > 1:  # the same initial weights on every rank; dropout masks of its own
        torch.manual_seed(args.seed + run.rank)
    if args.objective == "mlm":
        # No second-segment task: the pooler and NSP head get no gradient. Frozen, so that
        # DDP does not wait for one (they stay at their initialisation in the checkpoint).
        for module in (model.bert.pooler, model.cls.seq_relationship):
            module.requires_grad_(False)
    cuda = run.device.type == "cuda"
    optimizer = adamw(model, args.lr, args.weight_decay, fused=cuda, beta2=args.adam_beta2)
    step, elapsed = 0, 0.0
    if args.resume:
        step, elapsed = load_checkpoint(args, run, model, optimizer, stream)
        run.log(f"resumed at step {step} ({elapsed:.0f}s trained)")
    elif run.main:
        (args.out / "log.jsonl").unlink(missing_ok=True)
    if run.main:
        text = json.dumps(vars(args), indent=2, default=str)
        (args.out / "pretrain_args.json").write_text(text + "\n")

    ddp = None
    train_model: nn.Module = model
    if run.world > 1:
        device_ids = [run.device.index] if cuda else None
        train_model = ddp = nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    if args.compile:
        train_model = torch.compile(train_model)
    bf16 = bf16_autocast(args.precision, cuda)
    autocast = (
        torch.autocast(run.device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    )
    if cuda:
        torch.set_float32_matmul_precision("high")  # TF32 for what autocast leaves in fp32
    run.log(
        f"model: {config.num_hidden_layers} layers, hidden {config.hidden_size}, vocab "
        f"{config.vocab_size}: {model.num_parameters() / 1e6:.1f}M parameters | {args.objective} "
        f"| {args.batch_size * args.grad_accum * run.world} sequences of <= "
        f"{args.max_seq_length} tokens per step ({args.batch_size} x {args.grad_accum} "
        f"accumulated x {run.world} processes) | {run.device}"
        + (" bf16 autocast" if bf16 else " fp32")
        + (", fused AdamW" if cuda else "")
        + (", compiled" if args.compile else "")
    )

    result: dict[str, Any] = {"train": {}, "eval": {}}

    def log_eval() -> None:
        if eval_stream is not None and run.main:
            metrics = evaluate(model, eval_stream, args.eval_batches, run, autocast)
            result["eval"] = {"split": "eval", "step": step, **metrics}
            write_log_row(args.out / "log.jsonl", result["eval"])
            run.log(f"eval step {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
        run.barrier()

    def log_train(lr: float, grad_norm: torch.Tensor) -> None:
        row = meter.row(args, run, step)
        row |= {"lr": lr, "grad_norm": float(grad_norm), "epoch": stream.epoch}
        result["train"] = row | {"elapsed_s": elapsed}
        if run.main:
            write_log_row(args.out / "log.jsonl", result["train"])
        bar.set_postfix(loss=f"{row['loss']:.3f}", lr=f"{lr:.2e}", seq_s=f"{row['seq_per_s']:.0f}")

    def done() -> bool:
        return (args.steps is not None and step >= args.steps) or (
            args.time_budget is not None and elapsed >= args.time_budget
        )

    if step == 0:
        log_eval()
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    meter = Meter(run.device)
    bar = tqdm(
        total=args.steps,
        initial=step,
        unit="step",
        dynamic_ncols=True,
        file=sys.stderr,
        disable=not run.main or args.no_progress,
    )
    with StopRequest() as stop:
        while True:
            if args.time_budget is not None:
                elapsed = run.agree(elapsed)  # every rank must see the budget run out together
            if done() or (args.stop_at is not None and step >= args.stop_at):
                break
            # With DDP every rank must agree to stop; asking costs a sync, so not every step.
            if (run.world == 1 or step % args.log_every == 0) and stop.agreed(run):
                run.log(f"stopping at step {step} on request")
                break
            t0 = time.perf_counter()
            progress = step / args.steps if args.steps else elapsed / args.time_budget
            lr = get_lr(step, progress, args.lr, args.warmup)
            for group in optimizer.param_groups:
                group["lr"] = lr
            for micro in range(args.grad_accum):
                batch = stream.next_batch()
                flops = flops_per_token(config, batch["input_ids"].shape[1], args.mlm_probability)
                on_device = {k: v.to(run.device, non_blocking=True) for k, v in batch.items()}
                # DDP all-reduces gradients in backward: only on a step's last micro-batch.
                accumulate = ddp is not None and micro < args.grad_accum - 1
                with ddp.no_sync() if accumulate else contextlib.nullcontext(), autocast:
                    out = train_model(**on_device)
                (out.loss / args.grad_accum).backward()
                meter.add(out, batch, flops)
            grad_norm = torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            meter.steps += 1
            if cuda and step % args.log_every == 0:
                torch.cuda.synchronize()  # so that the window's time is the GPU's time
            dt = time.perf_counter() - t0
            elapsed += dt
            meter.seconds += dt
            bar.update(1)
            if step % args.log_every == 0:
                log_train(lr, grad_norm)
            if step % args.eval_every == 0:
                log_eval()
            if step % args.save_every == 0:
                save_checkpoint(args, run, model, tokenizer, optimizer, stream, step, elapsed)
    bar.close()
    if meter.steps:  # the steps since the last row
        log_train(lr, grad_norm)
    if done() and step % args.eval_every:
        log_eval()
    if step % args.save_every or step == 0:
        save_checkpoint(args, run, model, tokenizer, optimizer, stream, step, elapsed)
    run.log(f"saved {args.out} at step {step} ({elapsed:.0f}s of training)")
    if run.world > 1:
        dist.destroy_process_group()
    return {"step": step, **result, "out": str(args.out)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        pretrain(args)
    except (CorpusError, TokenizerError, ConfigError, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
