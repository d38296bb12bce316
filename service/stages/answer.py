"""The last stage of a model's worker: the answers of the requests a batch completed (each
job's `answer`, or `answer_many` for jobs of one task together), and the futures they go to."""

from __future__ import annotations

import logging
from typing import Any

from heads.rows import InvalidInput
from heads.tasks import Job
from service.errors import BackendError
from service.job_queue import Queued

log = logging.getLogger("service.batcher")  # what the worker's log says, whichever stage


def answers(done: list[Queued], name: str) -> list[Any]:
    """The answers of `done`, in order (an exception in place of an answer fails only its
    request). Jobs of one class answer together (`answer_many`: one softmax or normalisation
    over all their rows, where the task has one); an exception there falls back to one job at
    a time, so it fails only the job that raises it. name: the model's, for the log."""
    out: list[Any] = [None] * len(done)
    groups: dict[type[Job], list[int]] = {}
    for k, request in enumerate(done):
        if request.nonfinite:
            out[k] = BackendError("the model produced a NaN or infinite value for this input")
        else:
            groups.setdefault(type(request.job), []).append(k)
    for cls, ks in groups.items():
        if len(ks) > 1:
            try:
                jobs, results = [done[k].job for k in ks], [done[k].results for k in ks]
                together = cls.answer_many(jobs, results)  # type: ignore[arg-type]
            except Exception:  # retried one by one below, to find the job that fails
                pass
            else:
                for k, answer in zip(ks, together, strict=True):
                    out[k] = answer
                continue
        for k in ks:
            out[k] = answer_of(done[k], name)
    return out


def answer_of(request: Queued, name: str) -> Any:
    """One request's answer, or the exception that fails it."""
    try:
        return request.job.answer(request.results)  # type: ignore[arg-type]
    except InvalidInput as exc:
        return exc
    except Exception as exc:  # a bug in one job's post-processing fails only that job
        log.exception("%s: post-processing failed", name)
        return BackendError(f"post-processing failed ({type(exc).__name__})")


def deliver(requests: list[Queued], answers: list[Any]) -> None:
    """Each request's future gets its answer (or its exception), unless it is done already
    (its caller gave it up, or its deadline passed)."""
    for request, answer in zip(requests, answers, strict=True):
        if request.future.done():
            continue
        if isinstance(answer, Exception):
            request.future.set_exception(answer)
        else:
            request.future.set_result(answer)
