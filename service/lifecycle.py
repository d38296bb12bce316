"""One request's lifecycle, the same for every protocol front (the native inference routes,
service.routes.inference; the Open Inference Protocol's infer, service.routes.v2): a record
of it from its arrival to its answer, and what that record makes: the error's status and type,
the x-*-time headers, the request metrics and the span. One value that records its headers,
its metrics and its span, as text-embeddings-inference's `ResponseMetadata` does; a front only
parses its body and shapes its answer and its error body.

    record = RequestRecord(scope, route)          # arrival: its clock starts
    record.call = engine.call(where)               # the engine fills in model, inputs, times
    status, message, error_type, headers = record.fail(exc)        # an error, mapped once
    response.raw_headers += record.answer_built(response.status_code)  # the x-*-time headers
    record.finish(metrics, tracing)                # the answer has gone: counted, then traced

The record learns the model, the inputs and the stage times from its engine `Call`, which the
engine fills in as it goes (data: the engine never calls back into a front).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from starlette.types import Scope

from service.engine import Call
from service.http import error_for, error_type_of
from service.job_queue import Timing
from service.metrics import Metrics

if TYPE_CHECKING:  # it imports the OpenTelemetry SDK, which service.app loads only when on
    from service.tracing import Tracing

Header = tuple[bytes, bytes]


class RequestRecord:
    """One request, from its arrival (`start`) to its answer: the engine call it made, its
    status, its error_type and when its answer was built."""

    call: Call | None = None  # its call through the engine, once it became one
    status = 500  # until an answer is built: a request that ends without one (a bug) is a 500
    error_type: str | None = None  # its error body's (fail), when it has one
    built = 0.0  # perf_counter() when its answer was built; 0.0: none was
    # The (model, task) it is counted under where the front knows the model before the engine
    # chooses it (v2 names it in the path); else the engine call's, once chosen.
    counted_as: tuple[str, str] | None = None

    def __init__(self, scope: Scope, route: str) -> None:
        self.scope = scope
        self.route = route  # the metrics' endpoint and the span's route: the path's template
        self.start = time.perf_counter()

    def fail(self, exc: Exception) -> tuple[int, str, str, dict[str, str] | None]:
        """(status, message, error_type, headers) of the error `exc` (service.http.error_for,
        the one mapping), its error_type recorded for the metrics and the span."""
        status, message, error_type, headers = error_for(exc, self.scope)
        self.error_type = error_type
        return status, message, error_type, headers

    def answer_built(self, status: int) -> list[Header]:
        """The answer is built, with `status`: its x-*-time headers."""
        self.status = status
        self.built = time.perf_counter()
        timing = self.call.timing if self.call is not None else Timing()
        return timing_headers(timing, self.built - self.start)

    def labels(self) -> tuple[str, str]:
        """The (model, task) it is counted under: ("", "") before a model was known."""
        if self.counted_as is not None:
            return self.counted_as
        call = self.call
        if call is None or call.model is None:
            return "", ""
        return call.model.name, call.task

    def finish(self, metrics: Metrics, tracing: Tracing | None) -> None:
        """Its answer has gone (or it ended without one): counted and timed in the request
        metrics, its failure counted by reason, and its spans made (`tracing` on)."""
        model, task = self.labels()
        status = self.status
        metrics.answered(model, task, self.route, status, time.perf_counter() - self.start)
        if status >= 400:
            reason = self.error_type or error_type_of(status)
            metrics.failures.labels(model, task, reason).inc()
        if tracing is not None:
            tracing.record(self)


def timing_headers(timing: Timing, total: float) -> list[Header]:
    """Where the request's time went (`total`: seconds from its arrival to its built answer),
    in milliseconds, as text-embeddings-inference names the headers (it sends whole
    milliseconds; these keep three decimals: a small request here takes 2-4 ms in all). Stages
    the request never reached (a refused body) read 0."""
    return [
        (b"x-total-time", b"%.3f" % (total * 1000)),
        (b"x-tokenization-time", b"%.3f" % (timing.tokenization * 1000)),
        (b"x-queue-time", b"%.3f" % (timing.queue * 1000)),
        (b"x-inference-time", b"%.3f" % (timing.inference * 1000)),
    ]
