"""Prometheus collectors, one private registry per app (tests build many apps in one process).

Names carry the `bert_heads_` prefix and base units (seconds); every series is labelled with
`model` and `task`. `Metrics.add_model` creates each label combination at zero so that
dashboards and alerts see a series from the first scrape, not from the first failure.
Errors raised before a model is chosen (bad JSON, unknown model) are counted with
`model=""`, `task=""`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import CounterMetricFamily, Metric

PREFIX = "bert_heads"
STAGES = ("tokenization", "queue_wait", "inference", "postprocess")
DROP_REASONS = ("client_gone", "deadline")
# One per ServiceError.error_type, plus what service.http adds for HTTP-level errors.
FAILURE_REASONS = (
    "validation",
    "payload_too_large",
    "unauthorized",
    "model_not_found",
    "overloaded",
    "not_ready",
    "backend",
    "timeout",
    "client_gone",
    "not_found",
    "bad_request",
    "method_not_allowed",
    "internal",
)
ENDPOINTS_BY_TASK = {
    "classification": ("/classify", "/zero-shot", "/rerank", "/v1/rerank", "/v2/rerank"),
    "token-classification": ("/ner",),
    "question-answering": ("/qa",),
    "embedding": ("/embed", "/v1/embeddings", "/similarity", "/embed_all"),
    "fill-mask": ("/fill-mask",),
    "late-interaction": ("/embed_all", "/rerank", "/v1/rerank", "/v2/rerank"),
}
SPARSE_ENDPOINTS = ("/embed_sparse",)  # an embedding package with a sparse pooling
# Served for every package, whatever its task.
ANY_TASK_ENDPOINTS = ("/tokenize", "/decode")
INFERENCE_ENDPOINTS = tuple(e for endpoints in ENDPOINTS_BY_TASK.values() for e in endpoints)

# Latency from a sub-millisecond tiny model on GPU to a long-context CPU batch.
SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BATCH_TOKENS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


@dataclass(frozen=True, slots=True)
class ModelMetrics:
    """The children one model's batcher writes to, labels already bound."""

    batch_size: Histogram
    batch_tokens: Histogram
    tokenization: Histogram
    queue_wait: Histogram
    inference: Histogram
    postprocess: Histogram
    queue_depth: Gauge
    truncated: Counter
    windowed: Counter
    dropped_client_gone: Counter
    dropped_deadline: Counter


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            f"{PREFIX}_requests",
            "Requests answered, by endpoint and HTTP status.",
            ["model", "task", "endpoint", "status"],
            registry=r,
        )
        self.failures = Counter(
            f"{PREFIX}_request_failures",
            "Requests answered with an error, by reason (the error_type of the body).",
            ["model", "task", "reason"],
            registry=r,
        )
        self.duration = Histogram(
            f"{PREFIX}_request_duration_seconds",
            "Time from the request's arrival to its response.",
            ["model", "task", "endpoint"],
            buckets=SECONDS,
            registry=r,
        )
        self.stage = Histogram(
            f"{PREFIX}_stage_duration_seconds",
            "Parts of the work: tokenization (per encoder call, over the requests that "
            "arrived together), queue_wait (per request: submit to its first batch), "
            "inference and postprocess (per batch).",
            ["model", "task", "stage"],
            buckets=SECONDS,
            registry=r,
        )
        self.batch_size = Histogram(
            f"{PREFIX}_batch_size",
            "Rows per forward pass.",
            ["model", "task"],
            buckets=BATCH_SIZES,
            registry=r,
        )
        self.batch_tokens = Histogram(
            f"{PREFIX}_batch_tokens",
            "Padded tokens per forward pass (rows x longest row).",
            ["model", "task"],
            buckets=BATCH_TOKENS,
            registry=r,
        )
        self.queue_depth = Gauge(
            f"{PREFIX}_queue_depth",
            "Rows (sequences) waiting for a batch.",
            ["model", "task"],
            registry=r,
            multiprocess_mode="livesum",  # with --workers: summed over the live workers
        )
        self.truncated = Counter(
            f"{PREFIX}_inputs_truncated",
            "Inputs cut to the model window (truncate=true).",
            ["model", "task"],
            registry=r,
        )
        self.windowed = Counter(
            f"{PREFIX}_inputs_windowed",
            "Inputs split into overlapping windows (NER, QA).",
            ["model", "task"],
            registry=r,
        )
        self.dropped = Counter(
            f"{PREFIX}_dropped_requests",
            "Requests dropped before all their rows ran: client_gone or deadline.",
            ["model", "task", "reason"],
            registry=r,
        )
        self.load_failures = Counter(
            f"{PREFIX}_model_load_failures",
            "Packages that failed to load or reload (model control); an old version serves on.",
            ["model"],
            registry=r,
        )
        self.model_info = Gauge(
            f"{PREFIX}_model_info",
            "1 for each loaded package, with the variant and provider it runs on.",
            ["model", "task", "variant", "provider"],
            registry=r,
            multiprocess_mode="max",  # with --workers: every worker loads the same packages
        )
        self.adapter_info = Gauge(
            f"{PREFIX}_adapter_info",
            "1 for each adapter package (heads.adapters), with the encoder it runs over, its kind "
            "(lora, frozen), rank and the bytes of its weights.",
            ["model", "base", "kind", "rank", "bytes"],
            registry=r,
            multiprocess_mode="max",
        )
        for reason in FAILURE_REASONS:
            self.failures.labels("", "", reason)
        self._answered: dict[tuple[str, str, str, int], tuple[Counter, Histogram]] = {}
        # With --workers: the parent's count of replacements per worker (service.workers)
        self.worker_restarts: Sequence[int] | None = None

    def add_model(self, model: str, task: str) -> ModelMetrics:
        """Create every series of `model` at zero and return the batcher's children."""
        for endpoint in ENDPOINTS_BY_TASK.get(task, ()):
            self.requests.labels(model, task, endpoint, "200")
            self.duration.labels(model, task, endpoint)
        for reason in FAILURE_REASONS:
            self.failures.labels(model, task, reason)
        for stage in STAGES:
            self.stage.labels(model, task, stage)
        self.truncated.labels(model, task)
        self.windowed.labels(model, task)
        return ModelMetrics(
            batch_size=self.batch_size.labels(model, task),
            batch_tokens=self.batch_tokens.labels(model, task),
            tokenization=self.stage.labels(model, task, "tokenization"),
            queue_wait=self.stage.labels(model, task, "queue_wait"),
            inference=self.stage.labels(model, task, "inference"),
            postprocess=self.stage.labels(model, task, "postprocess"),
            queue_depth=self.queue_depth.labels(model, task),
            truncated=self.truncated.labels(model, task),
            windowed=self.windowed.labels(model, task),
            dropped_client_gone=self.dropped.labels(model, task, "client_gone"),
            dropped_deadline=self.dropped.labels(model, task, "deadline"),
        )

    def answered(self, model: str, task: str, endpoint: str, status: int, seconds: float) -> None:
        """Count and time one request. The labelled children are looked up once per label set:
        `labels()` costs more than the increment itself."""
        key = (model, task, endpoint, status)
        children = self._answered.get(key)
        if children is None:
            children = self._answered[key] = (
                self.requests.labels(model, task, endpoint, str(status)),
                self.duration.labels(model, task, endpoint),
            )
        children[0].inc()
        children[1].observe(seconds)

    def render(self) -> bytes:
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):  # --workers: every worker's samples
            merged = CollectorRegistry()
            multiprocess.MultiProcessCollector(merged)
            if self.worker_restarts is not None:
                merged.register(WorkerRestarts(self.worker_restarts))
            return generate_latest(merged)
        return generate_latest(self.registry)


class WorkerRestarts:
    """`bert_heads_worker_restarts_total{worker}`: how many times the parent of --workers
    replaced the worker in each slot. The count lives in the parent (shared memory every
    worker reads at scrape time), so it is the same whichever worker answers and outlives
    the workers it counts; like any counter it starts again at 0 when the parent does."""

    def __init__(self, counts: Sequence[int]) -> None:
        self.counts = counts

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            f"{PREFIX}_worker_restarts",
            "Workers replaced after they died, by worker slot (--workers).",
            labels=["worker"],
        )
        for slot, count in enumerate(self.counts[:]):
            family.add_metric([str(slot)], count)
        yield family
