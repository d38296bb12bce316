"""One module per head, each in the same two steps around the model: `preprocess` (text ->
model rows) and `postprocess` (the rows' outputs -> answer), as transformers' pipelines name
them. Both are plain functions over `tokenizers` encodings and numpy arrays (rows and their
outputs are `heads.rows` types), so `training.evaluate` scores exactly what the service
answers.

Each task's request options are one frozen dataclass, its module's `Options` (a
`TaskOptions`): the HTTP body's field names and defaults (service.schemas checks the bodies
against them), which the engine, the batch command and v2's parameters pass as they are.
`options.job(package, inputs)` makes the service's `Job`, one per request: the batcher encodes the texts of the jobs that arrived together
(`encode_batch`, Rust, off the GIL; on the event loop when they are short, see
service.stages.encode.INLINE_CHARS), asks each job for its rows, and, once a job's last row has run,
for its answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from tokenizers import Encoding, Tokenizer

from heads.package import ModelPackage
from heads.rows import ModelRow, Outputs


class Job(Protocol):
    """One request's work for a model's batcher."""

    texts: list[str]  # what to encode (without special tokens), in the order rows() reads them
    truncated: int  # inputs cut to the window, known after rows()
    windowed: int  # inputs split into several windows, known after rows()

    def rows(self, tokenizer: Tokenizer, encodings: list[Encoding]) -> list[ModelRow]:
        """The model rows for `encodings` (one per text); InvalidInput when they cannot be."""
        ...

    def answer(self, outputs: list[Outputs]) -> Any:
        """The answer from each row's outputs, in rows() order."""
        ...

    @staticmethod
    def answer_many(jobs: list[Any], outputs: list[list[Outputs]]) -> list[Any]:
        """The answers of several jobs of this class and one model, in order: where a task can,
        one computation over all their rows (classify: one softmax; embed: one normalisation);
        else `one_by_one`. It may raise: the batcher then asks each job alone."""
        ...


def one_by_one(jobs: list[Any], outputs: list[list[Outputs]]) -> list[Any]:
    """`answer_many` for a task with nothing to share between jobs: each job's own answer."""
    return [job.answer(outs) for job, outs in zip(jobs, outputs, strict=True)]


@dataclass(frozen=True, kw_only=True)
class TaskOptions:
    """One request's options for one task, and which packages answer it. Each task module's
    `Options` declares its fields (the HTTP body's names and defaults) and its `job`."""

    task: ClassVar[str | None] = None  # the package task that answers it; None: any package
    use: ClassVar[str | None] = None  # the request task when it is not `task` (REQUEST_TASKS)

    def job(self, package: ModelPackage, inputs: list[Any]) -> Job:
        """The Job that answers `inputs` with `package`; InvalidInput for an option the package
        cannot serve (checked before any compute)."""
        raise NotImplementedError

    def sized(self, inputs: list[Any]) -> dict[str, list[Any]]:
        """What the size limits count (max_client_batch_size, max_text_chars), by the name the
        request gives it."""
        return {"inputs": inputs}
