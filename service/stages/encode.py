"""The first stage of a model's worker: texts -> model rows. Every text of the jobs that
arrived together in one encoder call, then each job's `rows`; the rows (or the job's error) go
to the queue, and a job that needs no model (tokenize, decode) is answered at once."""

from __future__ import annotations

import logging

from tokenizers import Tokenizer

from heads.rows import InvalidInput, ModelRow
from heads.tasks import Job
from service.errors import BackendError
from service.job_queue import JobQueue, Queued
from service.metrics import ModelMetrics
from service.stages import answer

log = logging.getLogger("service.batcher")  # one logger for the worker, whichever stage

# Fewer texts than this are encoded one `encode` call each, not by `encode_batch`: waking the
# tokenizers Rust pool for a few short texts cost more than it saved. SST-2 sentences on a busy
# 2-core EPYC: 2 texts 104 vs 85 us CPU, 4 texts 185 vs 170, 8 texts 357 vs 342, 16 within
# noise.
SERIAL_BELOW = 8
# Jobs that arrive together with at most this many characters in all are tokenized on the
# event loop, whatever the model is doing; larger ones go to a thread. On 2 cores the hop to a
# thread and back (waking it, then the loop) cost about what encoding a few sentences does
# (~40 us a 106-character SST-2 sentence, 0.33 us a character), and while both lanes run the
# thread only takes a core from them: MiniLM int8 served 10-28% more at 8 clients, 0-6% at 32
# and 12% at 4 x 32 sentences than with every job under load in a thread (fp32 +1-4%;
# docs/design.md, "Short requests are tokenized on the event loop"). A larger job (up to ~1.3
# ms of encoding here) would hold the loop, and every request behind it, longer than a hop
# costs.
INLINE_CHARS = 4096

Made = list[list[ModelRow] | Exception]  # per job its rows, or the error that fails it


def short(requests: list[Queued]) -> bool:
    """Few enough characters to encode on the event loop (INLINE_CHARS)."""
    return sum(len(text) for r in requests for text in r.job.texts) <= INLINE_CHARS


def rows_of(tokenizer: Tokenizer | None, jobs: list[Job]) -> Made:
    """Every job's texts in one encoder call, then each job's rows (on the loop or in a
    thread); a job's InvalidInput in place of its rows."""
    texts = [text for job in jobs for text in job.texts]
    encodings = []
    if texts:
        assert tokenizer is not None, "a batcher that takes texts needs the tokenizer"
        if len(texts) < SERIAL_BELOW:
            encodings = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
        else:
            encodings = tokenizer.encode_batch(texts, add_special_tokens=False)
    out: Made = []
    at = 0
    for job in jobs:
        n = len(job.texts)
        try:
            out.append(job.rows(tokenizer, encodings[at : at + n]))  # type: ignore[arg-type]
        except InvalidInput as exc:
            out.append(exc)
        at += n
    return out


def encode(tokenizer: Tokenizer | None, requests: list[Queued], name: str) -> Made:
    """`rows_of` the requests' jobs; a bug there fails them all (BackendError), never the
    worker. name: the model's, for the log."""
    try:
        return rows_of(tokenizer, [r.job for r in requests])
    except Exception:  # a bug here must not kill the worker
        log.exception("%s: tokenization failed", name)
        return [BackendError("internal error while tokenizing")] * len(requests)


def hand_out(
    queue: JobQueue, metrics: ModelMetrics, requests: list[Queued], made: Made, seconds: float
) -> None:
    """Each request's rows to the queue (its error to its future), after `seconds` of
    encoding; a request with no rows (nothing for the model) gets its answer now."""
    metrics.tokenization.observe(seconds)
    truncated = windowed = 0
    for request, rows in zip(requests, made, strict=True):
        request.timing.tokenization += seconds
        if request.future.done():  # gone or expired meanwhile
            continue
        if isinstance(rows, Exception):
            queue.fail(request, rows)
            continue
        truncated += request.job.truncated
        windowed += request.job.windowed
        queue.add_rows(request, rows)
        if not rows:
            answer.deliver([request], [request.job.answer([])])
    if truncated:
        metrics.truncated.inc(truncated)
    if windowed:
        metrics.windowed.inc(windowed)
