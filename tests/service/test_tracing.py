"""Tracing (--otlp-endpoint): one SERVER span per inference request, with its queue,
tokenization, inference and postprocess as children, sent over OTLP/HTTP to a real receiver
(a protobuf ExportTraceServiceRequest per POST /v1/traces); a caller's `traceparent` makes the
span its child; error answers are ERROR; shutdown sends what is buffered; off, nothing starts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

pytest.importorskip("opentelemetry.sdk")  # the otel extra (in dev)

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status  # noqa: E402

from service.__main__ import parse_settings  # noqa: E402
from service.app import create_app  # noqa: E402
from service.settings import Settings  # noqa: E402
from service.tracing import traces_url  # noqa: E402
from tests.service.conftest import LiveServer, serve  # noqa: E402

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
STAGES = ["queue", "tokenization", "inference", "postprocess"]
ROUTES = {"v2": "/v2/models/{name}/infer"}
TEXTS = ["a good film", "a dull one"]
V2_BODY = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": TEXTS}]}


@dataclass
class Collector:
    """An OTLP/HTTP receiver on a free 127.0.0.1 port: the spans of every export, with their
    resource's attributes."""

    server: ThreadingHTTPServer
    spans: list[Span] = field(default_factory=list)
    resources: list[dict[str, Any]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def take(self, request: ExportTraceServiceRequest) -> None:
        for resource_spans in request.resource_spans:
            self.resources.append(attributes(resource_spans.resource))
            for scope_spans in resource_spans.scope_spans:
                self.spans.extend(scope_spans.spans)


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            got.take(ExportTraceServiceRequest.FromString(body))
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:  # quiet
            pass

    got = Collector(ThreadingHTTPServer(("127.0.0.1", 0), Receiver))
    thread = threading.Thread(target=got.server.serve_forever, daemon=True)
    thread.start()
    yield got
    got.server.shutdown()
    got.server.server_close()


def attributes(item: Any) -> dict[str, Any]:
    """A proto span's (or resource's) attributes as a dict of plain values."""
    return {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in item.attributes}


def ms(span: Span) -> float:
    return (span.end_time_unix_nano - span.start_time_unix_nano) / 1e6


@dataclass
class Exchange:
    """What the traced server answered, and the spans the receiver got for it."""

    answers: dict[str, httpx.Response]
    arrived_before_stop: int
    spans: list[Span]
    resources: list[dict[str, Any]]

    def server_span(self, answer: str) -> Span:
        """The SERVER span of the answer `answer` (matched by its trace id, or its status)."""
        r = self.answers[answer]
        found = [
            s
            for s in self.spans
            if s.kind == Span.SPAN_KIND_SERVER
            and attributes(s)["http.response.status_code"] == r.status_code
            and attributes(s)["http.route"] == ROUTES.get(answer, "/classify")
            and (s.trace_id.hex() == CALLER_TRACE) == (answer == "traced")
        ]
        assert len(found) == 1, found
        return found[0]

    def children(self, parent: Span) -> dict[str, Span]:
        kids = [s for s in self.spans if s.parent_span_id == parent.span_id]
        assert all(s.trace_id == parent.trace_id for s in kids)
        return {s.name: s for s in kids}


@pytest.fixture(scope="module")
def exchange(
    collector: Collector,
    make_package: Callable[..., Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Exchange:
    """A real uvicorn server with tracing on, three requests (a plain one, one with a caller's
    traceparent, one refused with 422), then a shutdown: the spans as the receiver got them."""
    models = tmp_path_factory.mktemp("traced") / "models"
    models.mkdir()
    make_package(models, "classification")
    with pytest.MonkeyPatch.context() as mp:
        # No export before shutdown: the spans that arrive are the ones shutdown flushed.
        mp.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")
        settings = Settings(model_dir=models, otlp_endpoint=collector.url)
        server = LiveServer(create_app(settings)).start()
    caller = {
        "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01",
        "tracestate": "vendor=opaque",
    }
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            body = {"inputs": ["a good film", "a dull one"]}
            answers = {
                "plain": client.post("/classify", json=body),
                "traced": client.post("/classify", json=body, headers=caller),
                "refused": client.post("/classify", json={"inputs": []}),
                "v2": client.post("/v2/models/sst2/infer", json=V2_BODY),
            }
    finally:
        arrived = len(collector.spans)
        server.stop()
    return Exchange(answers, arrived, list(collector.spans), list(collector.resources))


def test_a_request_is_a_server_span_with_its_four_stages(exchange: Exchange) -> None:
    r = exchange.answers["plain"]
    assert r.status_code == 200, r.text
    span = exchange.server_span("plain")
    assert span.name == "POST /classify"
    assert span.parent_span_id == b""  # no caller: a root span
    assert attributes(span) == {
        "http.request.method": "POST",
        "http.route": "/classify",
        "url.path": "/classify",
        "http.response.status_code": 200,
        "bert_heads.model": "sst2",
        "bert_heads.task": "classification",
        "bert_heads.inputs": 2,
    }
    assert span.status.code == Status.STATUS_CODE_UNSET
    stages = exchange.children(span)
    assert sorted(stages) == sorted(STAGES)
    for child in stages.values():
        assert child.kind == Span.SPAN_KIND_INTERNAL
        assert span.start_time_unix_nano <= child.start_time_unix_nano
        assert child.start_time_unix_nano <= child.end_time_unix_nano <= span.end_time_unix_nano
    # the batch its two inputs ran in: one forward pass of (at least) their two rows, padded
    batch = attributes(stages["inference"])
    assert batch["bert_heads.batches"] == 1 and batch["bert_heads.batch_rows"] >= 2
    assert batch["bert_heads.batch_tokens"] >= 3 * batch["bert_heads.batch_rows"]  # CLS x SEP
    assert attributes(stages["queue"]) == {}
    # laid end to end, in this order
    for before, after in zip(STAGES, STAGES[1:], strict=False):
        assert stages[before].end_time_unix_nano == stages[after].start_time_unix_nano
    assert {"service.name": "bert-heads"}.items() <= exchange.resources[0].items()


def test_the_stage_spans_are_the_answers_timing_headers(exchange: Exchange) -> None:
    """The headers keep three decimals of a millisecond: the spans agree to that."""
    r = exchange.answers["plain"]
    span = exchange.server_span("plain")
    stages = exchange.children(span)
    for stage in ("queue", "tokenization", "inference"):
        assert ms(stages[stage]) == pytest.approx(float(r.headers[f"x-{stage}-time"]), abs=2e-3)
    # x-total-time runs from the request's arrival to its built answer, where postprocess ends
    built = (stages["postprocess"].end_time_unix_nano - span.start_time_unix_nano) / 1e6
    assert built == pytest.approx(float(r.headers["x-total-time"]), abs=2e-3)
    # the server span also holds the answer's two sends (a few us; slack for a busy machine)
    assert 0 <= ms(span) - float(r.headers["x-total-time"]) < 5


def test_a_callers_traceparent_makes_the_span_its_child(exchange: Exchange) -> None:
    assert exchange.answers["traced"].status_code == 200
    span = exchange.server_span("traced")
    assert span.trace_id.hex() == CALLER_TRACE
    assert span.parent_span_id.hex() == CALLER_SPAN
    assert span.trace_state == "vendor=opaque"
    assert sorted(exchange.children(span)) == sorted(STAGES)
    plain = exchange.server_span("plain")
    assert plain.trace_id.hex() != CALLER_TRACE  # one trace per request otherwise


def test_an_error_answer_is_an_error_span(exchange: Exchange) -> None:
    r = exchange.answers["refused"]
    assert r.status_code == 422
    span = exchange.server_span("refused")
    assert span.status.code == Status.STATUS_CODE_ERROR
    assert span.status.message == r.json()["error_type"] == "validation"
    assert attributes(span)["error.type"] == "validation"
    assert exchange.children(span) == {}  # refused before its job was queued


def test_shutdown_sends_the_spans_still_buffered(exchange: Exchange) -> None:
    assert exchange.arrived_before_stop == 0
    assert len(exchange.spans) == 4 + 3 * len(STAGES)  # the 422 has no stages
    assert not [t for t in threading.enumerate() if t.name.startswith("OtelBatch")]


@pytest.mark.anyio
async def test_off_no_provider_and_no_spans(tmp_path: Path, make_package: Callable[..., Path]):
    """Off (the default): no tracer provider, no exporter thread, requests of the plain class."""
    make_package(tmp_path, "classification")
    async with serve(Settings(model_dir=tmp_path)) as s:
        r = await s.client.post("/classify", json={"inputs": "a good film"})
        assert r.status_code == 200
        assert s.app.stack.tracing is None  # type: ignore[attr-defined]
        assert not [t for t in threading.enumerate() if t.name.startswith("OtelBatch")]


def test_the_endpoint_is_the_collectors_base_url_or_its_traces_url() -> None:
    assert traces_url("http://collector:4318") == "http://collector:4318/v1/traces"
    assert traces_url("http://collector:4318/") == "http://collector:4318/v1/traces"
    assert traces_url("https://c.example/v1/traces") == "https://c.example/v1/traces"


def test_the_setting_is_a_flag_and_a_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().otlp_endpoint is None
    monkeypatch.setenv("BERT_HEADS_OTLP_ENDPOINT", "")  # compose's unset variable
    assert Settings().otlp_endpoint is None
    monkeypatch.setenv("BERT_HEADS_OTLP_ENDPOINT", "http://collector:4318")
    assert Settings().otlp_endpoint == "http://collector:4318"
    settings = parse_settings(["--otlp-endpoint", "http://other:4318"])
    assert settings.otlp_endpoint == "http://other:4318"
    with pytest.raises(ValidationError, match="http:// or https://"):
        Settings(otlp_endpoint="collector:4318")


def test_without_the_sdk_the_start_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("service.settings._installed", lambda module: False)
    with pytest.raises(SystemExit):
        parse_settings(["--otlp-endpoint", "http://collector:4318"])
    assert "pip install 'bert-heads[otel]'" in capsys.readouterr().err


def test_a_v2_request_takes_the_same_path_and_is_traced_alike(exchange: Exchange) -> None:
    """The Open Inference Protocol's infer: the same stages, the same x-*-time headers."""
    r = exchange.answers["v2"]
    assert r.status_code == 200, r.text
    span = exchange.server_span("v2")
    assert span.name == "POST /v2/models/{name}/infer"
    assert attributes(span)["url.path"] == "/v2/models/sst2/infer"
    assert attributes(span)["bert_heads.model"] == "sst2"
    assert attributes(span)["bert_heads.inputs"] == 2
    stages = exchange.children(span)
    assert sorted(stages) == sorted(STAGES)
    for stage in ("queue", "tokenization", "inference"):
        assert ms(stages[stage]) == pytest.approx(float(r.headers[f"x-{stage}-time"]), abs=2e-3)
