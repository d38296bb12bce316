"""Heads over a shared encoder (heads.adapters): an adapter's requests, and several heads'
answers from one encoder pass (POST /analyze).

    job = HeadJob(classify.Options().job(package, texts), adapter)  # an adapter's request
    job = AnalyzeJob({"sentiment": sentiment_job, "entities": ner_job})  # one pass, two heads

A `HeadJob` is the task's own job (classify, ner, qa) run on its encoder's batcher: its rows
are the task's, the encoder answers every row's hidden states, the adapter's head turns them
into the outputs the task's graph would have answered, and the task answers from those. Its
`adapter` is what the encoder's rows gather their LoRA update by (None for a head trained on
the frozen encoder: the encoder's own states).

An `AnalyzeJob` holds one HeadJob per named head, all of frozen-encoder heads over one
encoder: every row the heads' tasks build is run once (rows with the same tokens, as a
classifier's and a tagger's of the same short text, are one row), and each head reads its
own. The answer maps each head's name to the answer its own endpoint gives.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from tokenizers import Encoding, Tokenizer

from heads.adapters import Adapter
from heads.rows import ModelRow, Outputs


class HeadJob:
    """`job` (a task's Job) answered by `adapter_`'s head over its encoder's states."""

    def __init__(self, job: Any, adapter: Adapter) -> None:
        self.job, self.head_of = job, adapter
        self.texts: list[str] = job.texts
        # the rows' LoRA update (heads.adapters), read by the batch runner; None: none
        self.adapter = adapter if adapter.lora else None
        self.wants = frozenset(getattr(job, "wants", ())) | adapter.head.wants
        self.truncated = self.windowed = 0  # the task job's, once its rows are made

    def rows(self, tokenizer: Tokenizer, encodings: list[Encoding]) -> list[ModelRow]:
        rows = list(self.job.rows(tokenizer, encodings))
        self.truncated, self.windowed = self.job.truncated, self.job.windowed
        return rows

    def outputs(self, outputs: list[Outputs]) -> list[Outputs]:
        """Each row's outputs as the task's own graph names them."""
        head = self.head_of.head
        return [head(row) for row in outputs]

    def answer(self, outputs: list[Outputs]) -> Any:
        return self.job.answer(self.outputs(outputs))

    @staticmethod
    def answer_many(jobs: list[HeadJob], outputs: list[list[Outputs]]) -> list[Any]:
        """Jobs of one adapter and task together, as that model's own batcher would answer
        them (one softmax over all their rows, ...)."""
        groups: dict[tuple[int, Any], list[int]] = defaultdict(list)
        for k, job in enumerate(jobs):
            groups[(id(job.head_of), type(job.job))].append(k)
        answers: list[Any] = [None] * len(jobs)
        for (_, cls), ks in groups.items():
            inner = [jobs[k].job for k in ks]
            converted = [jobs[k].outputs(outputs[k]) for k in ks]
            for k, answer in zip(ks, cls.answer_many(inner, converted), strict=True):
                answers[k] = answer
        return answers


class AnalyzeJob:
    """Several frozen-encoder heads' jobs over the same texts, run as one: see the module
    docstring. `parts`: head name -> its HeadJob, in the answer's order."""

    def __init__(self, parts: dict[str, HeadJob]) -> None:
        self.parts = parts
        self.texts = [text for job in parts.values() for text in job.texts]
        self.adapter = None  # frozen heads: the encoder's own states
        self.wants = frozenset().union(*(job.wants for job in parts.values()))
        self._reads: dict[str, list[int]] = {}  # head -> the index of each of its rows
        self.truncated = self.windowed = 0  # the most of any head's, once the rows are made

    def rows(self, tokenizer: Tokenizer, encodings: list[Encoding]) -> list[ModelRow]:
        rows: list[ModelRow] = []
        seen: dict[tuple[bytes, bytes, int | None], int] = {}
        at = 0
        for name, job in self.parts.items():
            n = len(job.texts)
            reads = []
            for row in job.rows(tokenizer, encodings[at : at + n]):
                key = (row.input_ids.tobytes(), row.token_type_ids.tobytes(), row.attended)
                if key not in seen:
                    seen[key] = len(rows)
                    rows.append(row)
                reads.append(seen[key])
            self._reads[name] = reads
            at += n
        self.truncated = max(job.truncated for job in self.parts.values())
        self.windowed = max(job.windowed for job in self.parts.values())
        return rows

    def answer(self, outputs: list[Outputs]) -> dict[str, Any]:
        return {
            name: job.answer([outputs[i] for i in self._reads[name]])
            for name, job in self.parts.items()
        }

    @staticmethod
    def answer_many(jobs: list[AnalyzeJob], outputs: list[list[Outputs]]) -> list[Any]:
        return [job.answer(outs) for job, outs in zip(jobs, outputs, strict=True)]
