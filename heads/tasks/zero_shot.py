"""Zero-shot classification with an NLI model: texts and labels chosen per request -> each
label's score, best first, as transformers' `zero-shot-classification` pipeline answers.

    job = Job(package, ["the match ended 2-1"], ["sports", "politics"])
    # the batcher runs job.rows(...): one row `[CLS] text [SEP] This example is sports. [SEP]`
    # per (text, label); each row's Outputs has the NLI `logits` (C,)
    job.answer(outputs)   # [{"sequence": ..., "labels": ["sports", "politics"], "scores": [...]}]

Semantics of the pipeline: the hypothesis is `hypothesis_template.format(label)`; the
entailment label is the first of the package's labels whose name starts with "entail" (any
case), the contradiction label the first label (the last, when entailment is the first); with
one candidate label or `multi_label`, each label scores softmax(contradiction, entailment)'s
entailment on its own, else the entailment logits are softmaxed over the labels. Texts too long
for the window beside a hypothesis are cut, the hypothesis never (the pipeline's only_first).
Different on purpose: a package with no entailment label is refused (the pipeline warns and
reads the last logit), and so is a template that does not take the label.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Encoding, Tokenizer

from heads.package import ModelPackage
from heads.rows import InvalidInput, ModelRow, Outputs, row, template
from heads.tasks import TaskOptions, one_by_one

__all__ = ["DEFAULT_TEMPLATE", "Job", "entailment_id", "hypotheses", "is_nli"]

DEFAULT_TEMPLATE = "This example is {}."


def _entailment(labels: list[str]) -> int | None:
    return next((i for i, label in enumerate(labels) if label.lower().startswith("entail")), None)


def is_nli(package: ModelPackage) -> bool:
    """Its labels name entailment: an NLI model, which /zero-shot can use."""
    return _entailment(package.labels or []) is not None


def entailment_id(package: ModelPackage) -> int:
    """The pipeline's entailment label: the first whose name starts with "entail"; an
    InvalidInput naming the labels when none does."""
    labels = package.labels or []
    found = _entailment(labels)
    if found is not None:
        return found
    raise InvalidInput(
        f"model {package.name!r} has no entailment label (its labels: {', '.join(labels)}): "
        "zero-shot classification needs an NLI model whose labels name entailment"
    )


def hypotheses(labels: list[str], hypothesis_template: str) -> list[str]:
    """One hypothesis per label; InvalidInput for a template that does not take the label."""
    try:
        made = [hypothesis_template.format(label) for label in labels]
    except (IndexError, KeyError, ValueError) as e:
        raise InvalidInput(
            f"hypothesis_template {hypothesis_template!r} cannot be formatted ({e}); "
            "put {} where the label goes"
        ) from None
    if made[0] == hypothesis_template:
        raise InvalidInput(
            f"hypothesis_template {hypothesis_template!r} has no {{}} for the label to go in"
        )
    return made


@dataclass(frozen=True, kw_only=True)
class Options(TaskOptions):
    """A zero-shot request's labels (a list, or the pipeline's comma-separated text) and
    options, the zero-shot-classification pipeline's names; `allow_single_text`: a
    single-text classifier allowed (service.selection)."""

    task = "classification"
    use = "zero-shot"

    candidate_labels: list[str] | str
    hypothesis_template: str = DEFAULT_TEMPLATE
    multi_label: bool = False
    allow_single_text: bool = False

    @property
    def labels(self) -> list[str]:
        """The candidate labels as a list: a text is split at its commas, as the pipeline
        splits it."""
        labels = self.candidate_labels
        if isinstance(labels, str):
            return [label.strip() for label in labels.split(",") if label.strip()]
        return list(labels)

    def job(self, package: ModelPackage, inputs: list[Any]) -> Job:
        return Job(package, inputs, self)

    def sized(self, inputs: list[Any]) -> dict[str, list[Any]]:
        return {"inputs": inputs, "candidate_labels": self.labels}


class Job:
    """One /zero-shot request for an NLI classification package's batcher: per text one row
    per candidate label; per text `{sequence, labels, scores}`, best first."""

    windowed = 0

    def __init__(self, package: ModelPackage, sequences: list[str], options: Options) -> None:
        candidate_labels = options.labels
        hypothesis_template, multi_label = options.hypothesis_template, options.multi_label
        if not candidate_labels:
            raise InvalidInput("candidate_labels is empty; send at least one label")
        self.entailment = entailment_id(package)
        self.contradiction = -1 if self.entailment == 0 else 0
        self.sequences, self.labels = sequences, candidate_labels
        self.texts = [*sequences, *hypotheses(candidate_labels, hypothesis_template)]
        self.independent = multi_label or len(candidate_labels) == 1
        self.max_seq_length = package.max_seq_length
        self.truncated = 0

    def rows(self, tokenizer: Tokenizer, encodings: list[Encoding]) -> list[ModelRow]:
        layout = template(tokenizer)
        texts, hyps = encodings[: len(self.sequences)], encodings[len(self.sequences) :]
        rows = []
        for text in texts:
            cut = False
            for h in hyps:
                room = self.max_seq_length - layout.pair.n_special - len(h.ids)
                if room < 0:
                    raise InvalidInput(
                        f"a hypothesis is {len(h.ids)} tokens, more than this model's window "
                        f"of {self.max_seq_length} leaves; shorten the label or the template"
                    )
                cut |= len(text.ids) > room
                rows.append(row(layout, text.ids[:room], h.ids))
            self.truncated += cut
        return rows

    def answer(self, outputs: list[Outputs]) -> list[dict[str, Any]]:
        n = len(self.labels)
        logits = np.stack([out["logits"] for out in outputs]).reshape(len(self.sequences), n, -1)
        if self.independent:  # each label alone: entailment against contradiction
            pair = logits[..., [self.contradiction, self.entailment]]
            e = np.exp(pair - pair.max(-1, keepdims=True))
            scores = (e / e.sum(-1, keepdims=True))[..., 1]
        else:  # the labels compete: softmax of the entailment logits over them
            entail = logits[..., self.entailment]
            e = np.exp(entail - entail.max(-1, keepdims=True))
            scores = e / e.sum(-1, keepdims=True)
        answers = []
        for text, s in zip(self.sequences, scores, strict=True):
            order = list(reversed(s.argsort()))  # the pipeline's order, ties included
            answers.append(
                {
                    "sequence": text,
                    "labels": [self.labels[i] for i in order],
                    "scores": [float(s[i]) for i in order],
                }
            )
        return answers

    @staticmethod
    def answer_many(jobs: list[Job], outputs: list[list[Outputs]]) -> list[Any]:
        return one_by_one(jobs, outputs)
