"""Score a checkpoint or an exported package on a task's evaluation data.

    python -m training.evaluate --checkpoint runs/sst2/best --task classification \\
        --eval ../shared/data/sst2/dev.tsv
    python -m training.evaluate --package runs/sst2/package --eval ../shared/data/sst2/dev.tsv

Metrics, all in percent: classification accuracy (+ precision / recall / F1 of label 1 when
binary); token classification entity precision / recall / F1 (strict IOB2, per type too);
question answering SQuAD exact_match / f1; embedding Spearman of cosine vs gold score (or,
for anchor/positive pairs, recall@1 of each anchor's positive among all positives).

A PyTorch model and an ONNX Runtime session run through the same code (`Runner`: padded
numpy feeds in, outputs out), and question answering decodes spans with the service's
`heads.tasks.qa.postprocess`, so the figures are those of the answers the service gives.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from tokenizers import Tokenizer
from torch import nn
from tqdm.auto import tqdm

from heads.contract import OUTPUT_NAMES as TASK_OUTPUTS
from heads.contract import TASKS as PACKAGE_TASKS
from heads.rows import ModelRow, Outputs, TextInput, encode_texts
from heads.rows import pad as pad_sequences
from heads.tasks import qa
from training.cli import option, parse
from training.config import DEFAULT_MAX_SEQ_LENGTH, DOC_STRIDE, MAX_ANSWER_LENGTH
from training.data.batch import IGNORE
from training.data.classification import encode_classification, read_classification
from training.data.pairs import ScoredPair, TextPair, read_pairs
from training.data.records import DataError
from training.data.squad import QAExample, prepare, read_squad
from training.data.token_classification import TaggedSentence, encode_tagged, read_tagged
from training.metrics import classification_scores, ner_scores, spearman, squad_scores
from training.trainer import DTYPES, autocast

# One padded batch of feeds (input_ids, attention_mask, token_type_ids: (B, T) int64) ->
# outputs by name: logits (B, C) or (B, T, C), start_logits / end_logits (B, T), embeddings (B, H).
Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
OUTPUT_NAMES = tuple(dict.fromkeys(n for names in TASK_OUTPUTS.values() for n in names))
# The heads evaluated (and fine-tuned: training.finetune offers these) on a labelled data set;
# fill-mask has none here (pretraining's MLM loss is its measure).
TASKS = tuple(t for t in PACKAGE_TASKS if t not in ("fill-mask", "late-interaction"))


def torch_runner(model: nn.Module, precision: str = "fp32") -> Runner:
    """Run a head from training.model in eval mode, without gradients, on its own device."""
    device = next(model.parameters()).device

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        model.eval()
        with torch.inference_mode(), autocast(device, precision):
            out = model(**{k: torch.from_numpy(v).to(device) for k, v in feeds.items()})
        return {
            name: getattr(out, name).float().cpu().numpy()
            for name in OUTPUT_NAMES
            if getattr(out, name, None) is not None
        }

    return run


def onnx_runner(package_dir: str | Path, variant: str = "fp32") -> tuple[Runner, Any]:
    """(runner, ModelPackage) for an exported package, on ONNX Runtime's CPU provider."""
    from heads.package import read_package
    from training.export import onnx_run

    package = read_package(Path(package_dir))
    return onnx_run(package.variant_path(variant)), package


def run_rows(
    runner: Runner, sequences: list[ModelRow], batch_size: int, desc: str | None = "eval"
) -> list[Outputs]:
    """Each row's outputs with the batch axis removed and per-token outputs cut to the row's
    length, as the service's batcher hands them to `postprocess`. Rows are batched by length,
    so that little compute goes to padding."""
    order = np.argsort([len(s) for s in sequences], kind="stable")
    results: list[Outputs] = [{} for _ in sequences]
    starts = range(0, len(order), batch_size)
    # disable None: a bar only on a terminal, so that service and CI logs stay plain
    for start in tqdm(starts, desc=desc, leave=False, disable=None if desc else True, unit="batch"):
        idx = order[start : start + batch_size]
        out = runner(pad_sequences([sequences[i] for i in idx]))
        for j, i in enumerate(idx):
            n = len(sequences[i])
            results[i] = {
                name: arr[j, :n] if (arr.ndim == 3 or name.endswith("_logits")) else arr[j]
                for name, arr in out.items()
            }
    return results


def _cross_entropy(logits: np.ndarray, golds: np.ndarray) -> float:
    """Mean cross-entropy of (N, C) logits against (N,) ids."""
    z = logits - logits.max(-1, keepdims=True)
    log_probs = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return float(-log_probs[np.arange(len(golds)), golds].mean())


def _percent(scores: dict[str, float]) -> dict[str, float]:
    return {k: 100 * v for k, v in scores.items()}


# --- one evaluator per task, built once (data read and encoded), called after each epoch ----


class Evaluator(Protocol):
    main_metric: str  # the figure the best checkpoint is chosen by (higher is better)

    def __call__(self, runner: Runner, batch_size: int) -> dict[str, float]: ...


@dataclass
class ClassificationEval:
    rows: list[dict]
    num_labels: int
    main_metric: str = "accuracy"

    def __call__(self, runner: Runner, batch_size: int) -> dict[str, float]:
        outs = run_rows(runner, [r["sequence"] for r in self.rows], batch_size)
        logits = np.stack([o["logits"] for o in outs])  # (N, C)
        golds = np.asarray([r["labels"] for r in self.rows])
        scores = classification_scores(logits.argmax(-1), golds, self.num_labels)
        return {"loss": _cross_entropy(logits, golds), **_percent(scores)}


@dataclass
class TaggingEval:
    rows: list[dict]
    sentences: list[TaggedSentence]
    tags: list[str]
    main_metric: str = "f1"

    def __call__(self, runner: Runner, batch_size: int) -> dict[str, float]:
        outs = run_rows(runner, [r["sequence"] for r in self.rows], batch_size)
        # The first word piece of every word carries a label, so the labelled positions of all
        # rows, in order, are the words of all sentences, in order.
        first = [r["labels"] != IGNORE for r in self.rows]
        logits = np.concatenate([o["logits"][m] for o, m in zip(outs, first, strict=True)])
        golds = np.concatenate([r["labels"][m] for r, m in zip(self.rows, first, strict=True)])
        bounds = np.cumsum([len(s.words) for s in self.sentences])[:-1]
        preds = [[self.tags[i] for i in ids] for ids in np.split(logits.argmax(-1), bounds)]
        scores = ner_scores([s.tags for s in self.sentences], preds, strict=True)
        return {"loss": _cross_entropy(logits, golds), **_percent(scores)}


@dataclass
class QuestionAnsweringEval:
    examples: list[QAExample]
    prepared: list[qa.WindowedContext]
    max_answer_len: int = MAX_ANSWER_LENGTH
    main_metric: str = "f1"
    predictions: dict[str, str] = field(default_factory=dict)  # id -> answer, of the last call

    def __call__(self, runner: Runner, batch_size: int) -> dict[str, float]:
        outs = run_rows(runner, [s for p in self.prepared for s in p.sequences], batch_size)
        # SQuAD 2.0 data (some question without an answer) lets the model answer "".
        impossible = any(not e.answers for e in self.examples)
        k = 0
        for e, p in zip(self.examples, self.prepared, strict=True):
            n = len(p.windows)
            answers = qa.postprocess(
                p, outs[k : k + n], 1, self.max_answer_len, handle_impossible_answer=impossible
            )
            k += n
            self.predictions[e.id] = answers[0]["answer"] if answers else ""
        golds = [[text for text, _ in e.answers] for e in self.examples]
        return squad_scores([self.predictions[e.id] for e in self.examples], golds)


@dataclass
class EmbeddingEval:
    pairs: list[ScoredPair] | list[TextPair]
    sequences: list[ModelRow]  # all first sentences, then all second sentences
    main_metric: str = "spearman"

    def __call__(self, runner: Runner, batch_size: int) -> dict[str, float]:
        outs = run_rows(runner, self.sequences, batch_size)
        emb = np.stack([o["embeddings"] for o in outs]).astype(np.float64)
        emb /= np.maximum(np.linalg.norm(emb, axis=-1, keepdims=True), 1e-12)
        a, b = np.split(emb, 2)
        if isinstance(self.pairs[0], ScoredPair):
            cosine = (a * b).sum(-1)
            return {"spearman": 100 * spearman(cosine, [p.score for p in self.pairs])}
        hits = 0
        for start in range(0, len(a), 1024):  # (1024, N) similarities at a time
            best = (a[start : start + 1024] @ b.T).argmax(-1)
            hits += int((best == np.arange(start, start + len(best))).sum())
        return {"recall_at_1": 100 * hits / len(a)}


def make_evaluator(
    task: str,
    path: str | Path,
    tokenizer: Tokenizer,
    *,
    labels: list[str] | None = None,
    max_seq_length: int | None = None,
    doc_stride: int = DOC_STRIDE,
    max_answer_len: int = MAX_ANSWER_LENGTH,
    limit: int | None = None,
) -> Evaluator:
    """Read and encode `path` for `task` once. `labels`: the model's id -> label list
    (classification, token classification); a gold label outside it is a DataError."""
    max_seq_length = max_seq_length or DEFAULT_MAX_SEQ_LENGTH[task]
    if task in ("classification", "token-classification") and not labels:
        raise ValueError(f"{task} evaluation needs the model's labels")
    if task == "classification":
        assert labels is not None  # checked above
        examples = read_classification(path)[:limit]
        rows = encode_classification(examples, tokenizer, labels, max_seq_length)
        return ClassificationEval(rows, len(labels))
    if task == "token-classification":
        assert labels is not None  # checked above
        sentences = read_tagged(path)[:limit]
        return TaggingEval(
            encode_tagged(sentences, tokenizer, labels, max_seq_length), sentences, labels
        )
    if task == "question-answering":
        qa_examples = read_squad(path)[:limit]
        prepared = [prepare(e, tokenizer, max_seq_length, doc_stride) for e in qa_examples]
        return QuestionAnsweringEval(qa_examples, prepared, max_answer_len)
    if task == "embedding":
        pairs = read_pairs(path)[:limit]
        if len(pairs) < 2:
            raise DataError(f"{path}: embedding evaluation needs at least 2 pairs")
        first: list[TextInput] = [
            p.sentence1 if isinstance(p, ScoredPair) else p.anchor for p in pairs
        ]
        second: list[TextInput] = [
            p.sentence2 if isinstance(p, ScoredPair) else p.positive for p in pairs
        ]
        sequences = encode_texts(tokenizer, first + second, max_seq_length).sequences
        main = "spearman" if isinstance(pairs[0], ScoredPair) else "recall_at_1"
        return EmbeddingEval(pairs, sequences, main)
    raise ValueError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")


# --- command line -----------------------------------------------------------------------


@dataclass
class EvaluateArgs:
    checkpoint: str | None = option(None, "a checkpoint folder (HF layout; needs --task)")
    package: str | None = option(None, "an exported package folder (ONNX Runtime, CPU)")
    task: str | None = option(None, "the head, with --checkpoint", choices=TASKS)
    eval: str = option(None, "evaluation data, in the format finetune reads", required=True)
    max_seq_length: int | None = option(None, "tokens per row (default: the package's, else 128; QA 384)")  # fmt: skip
    doc_stride: int = option(DOC_STRIDE, "QA: context tokens consecutive windows share")
    max_answer_length: int = option(MAX_ANSWER_LENGTH, "QA: longest answer in tokens")
    batch_size: int = option(64, "rows per batch")
    limit: int | None = option(None, "evaluate on the first N examples only")
    variant: str = option("fp32", "package variant to run: fp32, fp16, int8")
    precision: str = option("fp32", "checkpoint on a GPU: autocast dtype", choices=tuple(DTYPES))
    output: str | None = option(None, "also write the metrics to this JSON file")


def main(argv: list[str] | None = None) -> int:
    args = parse(
        EvaluateArgs,
        argv,
        prog="python -m training.evaluate",
        summary="Score a checkpoint or an exported package on a task's evaluation data.",
        examples=[
            "python -m training.evaluate --package models/sst2 --eval examples/data/sentiment/dev.tsv"
        ],  # fmt: skip
    )
    if bool(args.checkpoint) == bool(args.package) or (args.checkpoint and not args.task):
        print("error: give --package, or --checkpoint with --task", file=sys.stderr)
        return 2
    if args.package:
        from heads.rows import load_package_tokenizer

        runner, package = onnx_runner(args.package, args.variant)
        task, labels = args.task or package.task, package.labels
        tokenizer = load_package_tokenizer(package.tokenizer_path)
        max_seq_length = args.max_seq_length or package.max_seq_length
    else:
        from training.checkpoint import load_model, read_max_seq_length
        from training.tokenizer import load_tokenizer

        assert args.checkpoint is not None  # checked above: --package or --checkpoint
        model = load_model(args.checkpoint, task=args.task)
        if torch.cuda.is_available():
            model.cuda()
        runner, task = torch_runner(model, args.precision), args.task
        labels, tokenizer = model.config.labels, load_tokenizer(args.checkpoint)
        # the window it was trained with (finetune's best/ records it), as export reads it
        max_seq_length = args.max_seq_length or read_max_seq_length(args.checkpoint)
    try:
        evaluator = make_evaluator(
            task,
            args.eval,
            tokenizer,
            labels=labels,
            max_seq_length=max_seq_length,
            doc_stride=args.doc_stride,
            max_answer_len=args.max_answer_length,
            limit=args.limit,
        )
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    metrics = evaluator(runner, args.batch_size)
    text = json.dumps({k: round(v, 4) for k, v in metrics.items()}, indent=2)
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
