"""OpenTelemetry traces of the inference requests, sent over OTLP/HTTP (protobuf); off unless
otlp_endpoint is set:

    pip install 'bert-heads[otel]'
    python -m service --otlp-endpoint http://localhost:4318     # spans to <URL>/v1/traces

One SERVER span per inference request ("POST /classify"), a child of the caller's span when
the request carries a W3C `traceparent`, with four children: queue, tokenization, inference,
postprocess. Every span is made after the answer has gone, from times the request path keeps
anyway (its start, the job's `Timing`, the moment its answer was built): nothing here runs
while a request waits, and nothing in the batch worker. The stages are laid end to end from
the moment the job was queued, as the x-*-time headers count them: queue (the waits for the
worker and for a batch, tokenization left out), tokenization, inference (the forward passes of
the batches its rows ran in, added up; attributes bert_heads.batches, .batch_rows and
.batch_tokens: those batches' count, rows and padded tokens, other jobs' rows included), then postprocess up to the built answer (the task's
answer from the outputs, its way back to the request and the JSON; for a job whose rows ran
in several batches, also the waits between those).

Spans leave in batches from the SDK's own thread (BatchSpanProcessor); shutdown sends what is
left. Sampling follows the caller's `traceparent` flag; OTEL_TRACES_SAMPLER, OTEL_BSP_* and
OTEL_RESOURCE_ATTRIBUTES work as the SDK documents them.

This module imports the SDK: service.app imports it only when tracing is on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from itertools import accumulate
from typing import TYPE_CHECKING, Protocol

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue
from starlette.types import Scope

from service.job_queue import Timing

if TYPE_CHECKING:
    from service.engine import Call

__all__ = ["SERVICE_NAME", "Answered", "Tracing", "traces_url"]

SERVICE_NAME = "bert-heads"
TRACES_PATH = "/v1/traces"  # OTLP/HTTP's path for spans
STAGES = ("queue", "tokenization", "inference", "postprocess")
_CONTEXT_HEADERS = (b"traceparent", b"tracestate")

log = logging.getLogger(__name__)


class Answered(Protocol):
    """What an answered request's record holds for its spans (service.lifecycle.RequestRecord),
    read once its answer has gone."""

    scope: Scope
    route: str  # the path's template where it has parameters (/v2/models/{name}/infer)
    status: int
    error_type: str | None  # its error body's, if it has one
    start: float  # perf_counter() at its arrival
    built: float  # perf_counter() when its answer was built; 0.0 if none was

    @property
    def call(self) -> Call | None:
        """Its call through the engine; None if it never became one (a body over the limit, a
        client gone first)."""

    def labels(self) -> tuple[str, str]:
        """The (model, task) it is counted under."""


def traces_url(endpoint: str) -> str:
    """The collector's URL for spans: the base URL OTEL_EXPORTER_OTLP_ENDPOINT would take
    (http://collector:4318), or one that already ends with /v1/traces."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith(TRACES_PATH) else endpoint + TRACES_PATH


class Tracing:
    """The tracer provider of one server process, and how a request becomes its spans."""

    def __init__(self, endpoint: str) -> None:
        self.url = traces_url(endpoint)
        self.provider = TracerProvider(resource=Resource.create({"service.name": SERVICE_NAME}))
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=self.url)))
        self.tracer = self.provider.get_tracer("service")
        self.propagator = TraceContextTextMapPropagator()

    def record(self, answered: Answered) -> None:
        """The spans of one answered request."""
        try:
            self._record(answered)
        except Exception:  # the answer has gone: a bug here must not close its connection
            log.exception("tracing: the spans of a request to %s are lost", answered.scope["path"])

    def _record(self, answered: Answered) -> None:
        now = time.perf_counter()
        offset = time.time_ns() - int(now * 1e9)  # perf_counter seconds -> epoch ns

        def ns(t: float) -> int:
            return offset + int(t * 1e9)

        scope, route, status = answered.scope, answered.route, answered.status
        start, built, call = answered.start, answered.built, answered.call
        attributes: dict[str, AttributeValue] = {
            "http.request.method": scope["method"],
            "http.route": route,
            "url.path": scope["path"],
            "http.response.status_code": status,
        }
        if call is not None and call.model is not None:
            attributes["bert_heads.model"], attributes["bert_heads.task"] = answered.labels()
        if call is not None and call.inputs:
            attributes["bert_heads.inputs"] = call.inputs
        error = answered.error_type or str(status)
        if status >= 400:
            attributes["error.type"] = error
        span = self.tracer.start_span(
            f"{scope['method']} {route}",
            context=self.propagator.extract(_context_headers(scope)),
            kind=SpanKind.SERVER,
            attributes=attributes,
            start_time=ns(start),
        )
        if not span.is_recording():  # sampled out (OTEL_TRACES_SAMPLER): nothing more to make
            return
        if status >= 400:
            # Every error answer, a 4xx too (OpenTelemetry's HTTP conventions leave a server's
            # 4xx unset): here each is a request that got no answer, what traces are read for.
            span.set_status(Status(StatusCode.ERROR, error))
        if call is not None and call.enqueued:
            t = call.timing
            # Anchored so that the stages end by the answer's build: they could add up to a
            # little more than enqueued -> built (this clock is read after the job's), and cut
            # at `built` an inference span would come out short.
            queued = max(start, min(call.enqueued, built - t.queue - t.tokenization - t.inference))
            self._stages(span, t, queued, max(built, queued), ns)
        span.end(end_time=ns(now))

    def _stages(
        self, parent: Span, timing: Timing, queued: float, built: float, ns: Callable[[float], int]
    ) -> None:
        """The stage spans under `parent`, end to end from `queued` to `built`."""
        context = set_span_in_context(parent)
        seconds = (timing.queue, timing.tokenization, timing.inference)
        edges = [min(t, built) for t in accumulate(seconds, initial=queued)] + [built]
        # A job that failed in tokenization (or had no rows) ran no batch: no later stages.
        count = len(STAGES) if timing.inference else 2
        batches: dict[str, AttributeValue] = {
            "bert_heads.batches": timing.batches,
            "bert_heads.batch_rows": timing.batch_rows,
            "bert_heads.batch_tokens": timing.batch_tokens,
        }
        for name, begin, end in zip(STAGES[:count], edges, edges[1:], strict=False):
            attributes = batches if name == "inference" else None
            span = self.tracer.start_span(
                name, context=context, start_time=ns(begin), attributes=attributes
            )
            span.end(ns(end))

    def shutdown(self) -> None:
        """Send the spans still buffered (waits for the exporter: at most its 10 s timeout
        when the collector does not answer), then stop the exporter's thread."""
        self.provider.shutdown()


def _context_headers(scope: Scope) -> dict[str, str]:
    """The request's W3C trace context headers, for the propagator."""
    return {
        key.decode("latin-1"): value.decode("latin-1")
        for key, value in scope["headers"]
        if key in _CONTEXT_HEADERS
    }
