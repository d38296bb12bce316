"""Pretrain BERT from raw text: masked LM + next-sentence prediction (or SOP, or MLM alone).

    # two minutes on a laptop CPU: a tiny model and a vocabulary trained on the corpus itself
    python -m training.pretrain --corpus ../shared/data/corpus/gutenberg_nltk \\
        --tokenizer train:8000 --config tiny --steps 300 --batch-size 32 --lr 5e-4 --out runs/tiny
    # BERT-mini for an hour, WikiText-2 held out, bert-base-uncased's vocabulary
    python -m training.pretrain --corpus ../shared/data/corpus/{gutenberg_nltk,misc_pd_books} \\
        --eval-corpus ../shared/data/corpus/wikitext-2 --config mini --time-budget 1h \\
        --tokenizer ../shared/data/vocab/bert-base-uncased/vocab.txt --out runs/mini
    python -m training.pretrain ... --out runs/mini --resume     # after Ctrl-C or a preemption
    # continued pretraining (domain adaptation): a checkpoint's weights, config and vocabulary
    python -m training.pretrain --corpus my-domain-text/ --init runs/mini --objective mlm \\
        --steps 2000 --lr 5e-5 --out runs/mini-domain
    torchrun --nproc_per_node 8 -m training.pretrain ... --config base --compile   # DDP, bf16

The recipe: the corpus, split into documents and sentences, is tokenized once into a cache
(training/data/corpus.py); each epoch pairs segments anew, each batch draws new masks
(training/data/pretraining.py); the model is BertForPreTraining; the loop is training.trainer's.

--out holds a Hugging Face checkpoint (what `training.finetune --init` and transformers load),
trainer_state.pt for --resume, log.jsonl, loss.png and pretrain_args.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from tokenizers import Tokenizer
from torch import Tensor, nn

from training.checkpoint import CheckpointError, load_model, save_model
from training.cli import as_args, duration, in_group, make_parser
from training.config import PRESETS, BertConfig, ConfigError
from training.data.corpus import (
    DOCUMENT_UNITS,
    CorpusError,
    corpus_files,
    read_text,
    tokenize_corpus,
)
from training.data.pretraining import MASKED_LM_PROB, OBJECTIVES, SHORT_SEQ_PROB, PretrainingStream
from training.model import BertForPreTraining, set_dropout
from training.special_tokens import special_tokens
from training.tokenizer import TokenizerError, load_tokenizer, save_tokenizer, train_tokenizer
from training.trainer import PRECISIONS, Dist, LoopConfig, Trainer, autocast

H100_BF16_TFLOPS = 989.5  # dense bf16 peak of an H100 SXM (NVIDIA H100 datasheet; 1979 sparse)
EVAL_SEED = 20181011  # fixed: every evaluation sees the same pairs and the same masks
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
# Arguments that decide the data a step sees: changed on --resume, the run is no continuation.
DATA_ARGS: tuple[str, ...]  # extended below
DATA_ARGS = ("corpus", "documents", "objective", "max_seq_length", "short_seq_prob")
DATA_ARGS += ("mlm_probability", "whole_word_masking", "batch_size", "grad_accum", "seed")


_data, _model, _optim, _run = (in_group(g) for g in ("data", "model", "optimisation", "run"))


@dataclass
class PretrainArgs:
    """The options; BERT's recipe (Devlin et al. 2018) unless noted."""

    corpus: list[str] = _data(None, "text files or folders of them", required=True, metavar="PATH")
    eval_corpus: list[str] | None = _data(None, "held-out text to evaluate on", metavar="PATH")
    documents: str = _data("blocks", "a blank-line block or a file", choices=DOCUMENT_UNITS)
    tokenizer: str | None = _data(
        None, "vocab.txt, tokenizer.json or train:SIZE (default: --init's)"
    )
    cased: bool = _data(False, "with train:SIZE, keep case (default: lower-case)")
    max_seq_length: int = _data(128, "tokens per example, [CLS]/[SEP] included")
    short_seq_prob: float = _data(SHORT_SEQ_PROB, "how often a pair aims at a shorter length")
    mlm_probability: float = _data(MASKED_LM_PROB, "fraction of tokens to predict (80/10/10)")
    whole_word_masking: bool = _data(False, "mask a word's pieces together")
    cache_dir: Path | None = _data(None, "tokenized corpus cache (default ~/.cache/bert-heads)")
    skip_bad_files: bool = _data(False, "skip binary or non-UTF-8 files instead of stopping")
    recipe: str = _model("bert", "a paper's defaults: bert, roberta, albert", choices=RECIPES)
    config: str | None = _model(
        None, f"a preset ({', '.join(PRESETS)}) or a config.json (default mini; not with --init)"
    )
    init: Path | None = _model(None, "start from this checkpoint: its weights, config, vocabulary")
    objective: str = _model("mlm+nsp", "BERT, ALBERT (sop) or RoBERTa (mlm)", choices=OBJECTIVES)
    dropout: float | None = _model(
        None, "every dropout while pretraining (default the config's; fine-tuning keeps those)"
    )
    steps: int | None = _optim(None, "optimizer steps to train for (or --time-budget)")
    time_budget: float | None = _optim(None, "train this long instead: 90s, 30m, 2h", type=duration)
    batch_size: int = _optim(32, "sequences per micro-batch per process")
    grad_accum: int = _optim(1, "micro-batches per optimizer step")
    lr: float = _optim(1e-4, "peak learning rate")
    warmup: int | None = _optim(None, "warm-up steps (default 1%% of --steps, or 100)")
    weight_decay: float = _optim(0.01, "AdamW weight decay (none on biases, LayerNorm)")
    adam_beta2: float = _optim(0.999, "AdamW beta2 (RoBERTa 0.98)")
    max_grad_norm: float = _optim(1.0, "clip the global gradient norm")
    seed: int = _optim(0, "model init, example order, masks, dropout")
    out: Path = _run(None, "checkpoint, log and plot folder", required=True)
    resume: bool = _run(False, "continue the run in --out where it stopped")
    stop_at: int | None = _run(None, "checkpoint and stop at this step, schedule unchanged")
    save_every: int = _run(1000, "checkpoint every N steps (and at the end)")
    eval_every: int = _run(500, "evaluate every N steps (and at the start and end)")
    eval_batches: int = _run(50, "batches per evaluation")
    log_every: int = _run(10, "write a train row every N steps")
    device: str = _run("auto", "auto, cpu or cuda", choices=("auto", "cpu", "cuda"))
    precision: str = _run("auto", "auto: bf16 on a GPU, fp32 on a CPU", choices=PRECISIONS)
    compile: bool = _run(False, "torch.compile the model (GPU)")
    peak_tflops: float = _run(H100_BF16_TFLOPS, "accelerator peak, for MFU")
    no_progress: bool = _run(False, "no progress bar")


def build_parser(recipe: str = "bert") -> argparse.ArgumentParser:
    """The command line, with `recipe`'s defaults (RECIPES) in place of BERT's."""
    parser = make_parser(
        PretrainArgs,
        prog="python -m training.pretrain",
        summary="Pretrain BERT from raw text (MLM + NSP, SOP or MLM alone).",
        examples=[
            "python -m training.pretrain --corpus examples/data/corpus --tokenizer train:8000 "
            "--config tiny --batch-size 8 --steps 300 --lr 5e-4 --out runs/tiny",
            "torchrun --nproc_per_node 2 -m training.pretrain --corpus examples/data/corpus "
            "--tokenizer train:8000 --config tiny --batch-size 4 --steps 300 --out runs/tiny-ddp",
        ],
    )
    parser.set_defaults(**RECIPES[recipe])
    return parser


def parse_args(argv: list[str] | None = None) -> PretrainArgs:
    """Parse with the defaults of the --recipe named in argv (BERT's without one)."""
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--recipe", choices=RECIPES, default="bert")
    parser = build_parser(first.parse_known_args(argv)[0].recipe)
    return PretrainArgs(**vars(parser.parse_args(argv)))


def check_args(args: PretrainArgs) -> None:
    positive: tuple[str, ...]  # extended below
    positive = ("steps", "time_budget", "batch_size", "grad_accum", "lr", "max_seq_length")
    positive += ("save_every", "eval_every", "eval_batches", "log_every")
    for name in positive:
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise SystemExit(f"error: --{name.replace('_', '-')} must be positive, not {value}")
    if (args.steps is None) == (args.time_budget is None):
        raise SystemExit("error: give one of --steps and --time-budget")
    if args.max_seq_length < 8:
        raise SystemExit("error: --max-seq-length must be at least 8")
    if args.dropout is not None and not 0 <= args.dropout < 1:
        raise SystemExit(f"error: --dropout must be in [0, 1), not {args.dropout}")
    if not 0 < args.mlm_probability < 1 or not 0 <= args.short_seq_prob <= 1:
        raise SystemExit("error: --mlm-probability must be in (0, 1), --short-seq-prob in [0, 1]")
    if args.init is not None and args.config not in (None, RECIPES[args.recipe].get("config")):
        raise SystemExit("error: --init brings its own config.json: leave out --config")
    if args.init is None and args.tokenizer is None:
        raise SystemExit("error: give --tokenizer (vocab.txt, tokenizer.json or train:SIZE)")
    if args.init is not None and not args.resume:
        args.tokenizer = args.tokenizer or str(args.init)
    if args.warmup is None:  # BERT: 10k warm-up steps of 1M
        args.warmup = max(1, args.steps // 100) if args.steps else 100


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


# --- data and model ---------------------------------------------------------------------


def get_tokenizer(args: PretrainArgs, d: Dist, files: list[Path]) -> Tokenizer:
    if args.resume and (args.out / "tokenizer.json").is_file():
        return load_tokenizer(args.out / "tokenizer.json")
    assert args.tokenizer is not None  # check_args: --tokenizer, else --init's folder
    if not args.tokenizer.startswith("train:"):
        return load_tokenizer(args.tokenizer)
    try:
        size = int(args.tokenizer.removeprefix("train:"))
    except ValueError:
        raise SystemExit(
            f"error: --tokenizer {args.tokenizer}: expected train:VOCAB_SIZE"
        ) from None

    def train() -> Tokenizer:
        if not d.main:
            return load_tokenizer(args.out / "tokenizer.json")
        d.log(f"tokenizer: training a {size}-entry WordPiece vocabulary on {len(files)} files")
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

    return d.first_then_others(train)


def get_config(args: PretrainArgs, tokenizer: Tokenizer) -> BertConfig:
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    if args.tokenizer is None:  # --init with --resume: get_tokenizer read the run's own
        tokenizer_folder: str | None = str(args.out)
    else:
        tokenizer_folder = None if args.tokenizer.startswith("train:") else args.tokenizer
    pad = special_tokens(tokenizer_folder, tokenizer).ids.get("pad")
    if args.init is not None:  # its own architecture, whatever the recipe's preset
        config = BertConfig.load(Path(args.init) / "config.json")
        if config.vocab_size < vocab_size:
            raise SystemExit(
                f"error: the tokenizer has {vocab_size} entries but {args.init}'s embeddings "
                f"{config.vocab_size}: pass the tokenizer it was trained with"
            )
        return _check_length(args, config)
    name = args.config or "mini"
    if name in PRESETS:
        config = BertConfig.preset(name, vocab_size=vocab_size)
    else:
        config = BertConfig.load(name).replace(vocab_size=vocab_size)
    return _check_length(args, config.replace(pad_token_id=pad if pad is not None else 0))


def _check_length(args: PretrainArgs, config: BertConfig) -> BertConfig:
    if args.max_seq_length > config.max_position_embeddings:
        raise SystemExit(
            f"error: --max-seq-length {args.max_seq_length} exceeds the model's "
            f"max_position_embeddings {config.max_position_embeddings}"
        )
    return config


def make_streams(
    args: PretrainArgs, d: Dist, tokenizer: Tokenizer, files: list[Path]
) -> tuple[PretrainingStream, PretrainingStream | None]:
    """The training stream (this process's share) and the evaluation stream (fixed seed)."""

    def stream(paths: list[Any], seed: int, rank: int, world: int) -> PretrainingStream:
        corpus = d.first_then_others(
            lambda: tokenize_corpus(
                paths, tokenizer, args.cache_dir, args.documents, args.skip_bad_files, d.log
            )
        )
        a = args  # pad_to_max_length with --compile: one input shape, no recompilation per length
        return PretrainingStream(
            corpus, tokenizer, a.objective, a.max_seq_length, a.batch_size, seed, rank, world,
            a.short_seq_prob, a.whole_word_masking, a.mlm_probability, pad_to_max_length=a.compile,
        )  # fmt: skip

    train = stream(files, args.seed, d.rank, d.world)
    held_out = stream(args.eval_corpus, EVAL_SEED, 0, 1) if args.eval_corpus else None
    return train, held_out


def reshard(data: dict[str, Any], saved_world: int, world: int) -> dict[str, Any]:
    """Rank 0's position scaled to a new process count: each process's share of an epoch is
    saved_world / world times what it was."""
    return {**data, "position": data["position"] * saved_world // world}


def pretraining_loss(objective: str, max_predictions: int | None = None) -> Any:
    """(model, batch) -> loss, mlm_loss and the second task's loss (none for mlm alone).
    max_predictions: the MLM head's fixed slice a row (BertForPreTraining), for a GPU."""
    second = {"mlm+nsp": "nsp_loss", "mlm+sop": "sop_loss"}.get(objective)
    fixed = {"max_predictions": max_predictions} if max_predictions else {}

    def loss(model: nn.Module, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        out = model(**batch, **fixed)
        parts = {"loss": out.loss, "mlm_loss": out.mlm_loss}
        return parts | ({second: out.nsp_loss} if second else {})

    return loss


# --- evaluation -------------------------------------------------------------------------


@torch.no_grad()
def held_out_batches(stream: PretrainingStream, batches: int) -> Iterator[dict[str, Tensor]]:
    """The evaluation's first `batches` batches (at most one pass), the same pairs and masks
    every time: the stream is rewound to its start and its masking reseeded."""
    stream.epoch, stream.position = 0, 0
    stream.generator.manual_seed(EVAL_SEED)
    for _ in range(min(batches, stream.batches_per_epoch)):
        yield stream.next_batch()


def evaluate(
    model: nn.Module, stream: PretrainingStream, batches: int, device: torch.device, precision: str
) -> dict[str, float]:
    """MLM loss and accuracy over the chosen tokens, NSP/SOP accuracy over the pairs, always on
    the same batches and masks (held_out_batches)."""
    model.eval()
    mlm_loss = mlm_correct = chosen = nsp_correct = pairs = 0.0
    for held_out in held_out_batches(stream, batches):
        batch = {k: v.to(device) for k, v in held_out.items()}
        with autocast(device, precision):
            out = model(**batch)
        targets = batch["labels"][batch["labels"] != -100]
        mlm_loss += out.mlm_loss.item() * len(targets)
        mlm_correct += (out.prediction_logits.argmax(-1) == targets).sum().item()
        chosen += len(targets)
        if "next_sentence_label" in batch:
            nsp = batch["next_sentence_label"]
            nsp_correct += (out.seq_relationship_logits.argmax(-1) == nsp).sum().item()
            pairs += len(nsp)
    metrics = {"mlm_loss": mlm_loss / chosen, "mlm_accuracy": mlm_correct / chosen}
    if pairs:
        second = "nsp_accuracy" if stream.objective == "mlm+nsp" else "sop_accuracy"
        metrics[second] = nsp_correct / pairs
    return metrics


# --- the run ----------------------------------------------------------------------------


def pretrain(args: PretrainArgs | argparse.Namespace) -> dict[str, Any]:
    """Train as the arguments say; returns the final step, train row and evaluation."""
    args = as_args(PretrainArgs, args)
    check_args(args)
    d = Dist.start(args.device)
    return d.run(lambda: _pretrain(args, d))


def _pretrain(args: PretrainArgs, d: Dist) -> dict[str, Any]:
    args.out.mkdir(parents=True, exist_ok=True)
    state = Trainer.load_state(args.out)
    if state is not None and not args.resume:
        raise SystemExit(
            f"error: {args.out} holds a run already: add --resume, or pick another --out"
        )
    if args.resume and state is None:
        raise SystemExit(f"error: --resume but {args.out} holds no trainer_state.pt to resume")
    now = json.loads(json.dumps(dataclasses.asdict(args), default=str))
    if state is not None and (args.out / "pretrain_args.json").is_file():
        saved = json.loads((args.out / "pretrain_args.json").read_text())
        if changed := [k for k in DATA_ARGS if saved.get(k) != now.get(k)]:
            d.log(f"warning: --resume with changed {', '.join(changed)}: not an exact continuation")
    files = corpus_files(args.corpus)
    tokenizer = get_tokenizer(args, d, files)
    stream, eval_stream = make_streams(args, d, tokenizer, files)

    torch.manual_seed(args.seed)
    config = get_config(args, tokenizer)
    if args.init is not None and state is None:  # a fresh head where the checkpoint has none
        # task "pretraining" loads a BertForPreTraining
        model = cast(
            BertForPreTraining, load_model(args.init, task="pretraining").train().to(d.device)
        )
    else:
        model = BertForPreTraining(config).to(d.device)
    if args.dropout is not None:
        set_dropout(model, args.dropout)
    if d.world > 1:  # the same initial weights on every rank; dropout masks of its own
        torch.manual_seed(args.seed + d.rank)
    if args.objective == "mlm":
        # No second-segment task: the pooler and NSP head get no gradient. Frozen, so that
        # DDP does not wait for one (they stay at their initialisation in the checkpoint).
        for module in (model.bert.pooler, model.cls.seq_relationship):
            module.requires_grad_(False)
    if state is not None:
        model.load_state_dict(load_model(args.out, task="pretraining").state_dict())
    if d.main:
        (args.out / "pretrain_args.json").write_text(json.dumps(now, indent=2) + "\n")
    d.log(
        f"model: {config.num_hidden_layers} layers, hidden {config.hidden_size}, vocab "
        f"{config.vocab_size}: {model.num_parameters() / 1e6:.1f}M parameters | {args.objective} "
        f"| {args.batch_size * args.grad_accum * d.world} sequences of <= {args.max_seq_length} "
        f"tokens a step ({args.batch_size} x {args.grad_accum} accumulated x {d.world} processes)"
    )
    loop = LoopConfig.from_args(args, eval_at_start=True, progress=not args.no_progress)
    trainer = Trainer(
        d,
        model,
        stream,
        # On a GPU the MLM head runs on a fixed slice (no host sync a step); on a CPU on the
        # chosen positions alone: the slice is ~1.8x their count with blank-line blocks, and
        # the head is a quarter of BERT-mini's FLOPs.
        pretraining_loss(
            args.objective, stream.max_predictions if d.device.type == "cuda" else None
        ),
        loop,
        out=args.out,
        checkpoint=args.out,
        write_model=lambda folder: save_model(model, folder, tokenizer),
        evaluate=(
            lambda: evaluate(model, eval_stream, args.eval_batches, d.device, trainer.precision)
        )
        if eval_stream
        else None,
        flops_per_token=lambda seq_len: flops_per_token(config, seq_len, args.mlm_probability),
        reshard=reshard,
        plot="loss.png",
        title=f"pretraining {args.out.name}",
    )
    trainer.start(state)
    trainer.fit()
    d.log(f"saved {args.out} at step {trainer.step} ({trainer.elapsed:.0f} s of training)")
    result = {"step": trainer.step, "train": trainer.last_train, "eval": trainer.last_eval}
    return result | {"out": str(args.out)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        pretrain(args)
    except (CorpusError, TokenizerError, ConfigError, CheckpointError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
