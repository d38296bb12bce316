"""The native front of the inference POSTs, kept cheap: FastAPI declares the routes (the
OpenAPI schema and /docs come from each endpoint's signature, as for any route), but a request
never enters FastAPI's per-request machinery.

- `InferencePath`, in front of FastAPI's middleware stack (inside CORS when that is on: the
  same object either way), serves POSTs to these paths in one layer: the payload limit, the
  body (validated with pydantic-core straight from the raw bytes, `model_validate_json`), the
  API key, the endpoint, and the answer or the error body, with the request's lifecycle (its
  record: timing headers, metrics, span; service.lifecycle) as every front has it;
- the endpoint calls the engine's task (service.engine: admission, model, limits, batcher) with
  the request's engine `Call`, which the client's disconnect cancels (`DisconnectWatch`);
- every other request (GET /models, /metrics, /docs, a wrong method) goes on to FastAPI.

Why: with a near-null model on 2 cores, FastAPI's routing, dependency resolution and body
handling took ~1 ms of event-loop CPU per request, several times the rest of the path, and each
further ASGI layer a few us (see benchmarks/server_cost.py). Errors are the one error body
(service.http.error_for), as on any route.
"""

from __future__ import annotations

import asyncio
import json
import logging
import zlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from service.engine import Call, Engine
from service.errors import NotReady, ServiceError
from service.http import describe_validation, error_for, error_response, reject_payload
from service.lifecycle import RequestRecord
from service.routes.deps import require_api_key
from service.selection import root_task

if TYPE_CHECKING:  # it imports the OpenTelemetry SDK, which service.app loads only when on
    from service.tracing import Tracing

log = logging.getLogger(__name__)

Endpoint = Callable[[Any, "InferenceRequest"], Awaitable[Response]]

# A request still waiting for its answer WATCH_AFTER to 2 x WATCH_AFTER seconds after it was
# queued gets a task that watches for the client's disconnect: a disconnect is then noticed
# at most that much later (and always before the request's rows still queued run).
WATCH_AFTER = 0.05


class DisconnectWatch:
    """Starts the disconnect watch of every request still waiting after a sweep period, with
    one timer per period for all of them. Why not one timer per request: most answers come
    back within a period, and each timer cost a heap push and a cancel on the event loop.

    Two generations: requests added since the last sweep (`young`), and those added before it
    (`old`); at each sweep the old ones still waiting get their watch, and the young become
    old. A request is added as its engine call starts, which queues its job before anything
    awaits: from the sweeps' side, the moment it was queued."""

    def __init__(self) -> None:
        self.young: dict[InferenceRequest, Call] = {}
        self.old: dict[InferenceRequest, Call] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None

    def add(self, request: InferenceRequest, call: Call) -> None:
        self.young[request] = call
        if self._timer is None or self._loop is not request.loop:  # a test's loop may be new
            self._loop = request.loop
            self._timer = request.loop.call_later(WATCH_AFTER, self._sweep)

    def discard(self, request: InferenceRequest) -> None:
        if self.young.pop(request, None) is None:
            self.old.pop(request, None)

    def _sweep(self) -> None:
        for request, call in self.old.items():
            request.watch(call)
        self.old, self.young = self.young, {}
        assert self._loop is not None
        self._timer = self._loop.call_later(WATCH_AFTER, self._sweep) if self.old else None


class InferenceRequest(Request, RequestRecord):
    """One inference POST: the HTTP request its endpoint takes as its second argument (FastAPI
    sees a Request, so the OpenAPI schema holds only the body), and its lifecycle's record
    (service.lifecycle), whose clock starts here. Its engine `call` is made once its body is
    read (`start_call`); the endpoint passes it to the engine's task (`call=request.call`)."""

    def __init__(self, scope: Scope, receive: Receive, engine: Engine) -> None:
        Request.__init__(self, scope, receive)
        RequestRecord.__init__(self, scope, scope["path"])
        self.engine = engine
        self._watch: asyncio.Task[None] | None = None  # the disconnect watch, once started

    def start_call(self) -> Call:
        """Its call through the engine, with the default deadline from now."""
        # Kept: asyncio.get_running_loop() makes a getpid() system call on every call.
        self.loop = loop = asyncio.get_running_loop()
        deadline = loop.time() + self.engine.settings.request_timeout
        self.call = call = Call(deadline, self.route)
        return call

    def header(self, name: bytes) -> str | None:
        """One request header (lower-case name), without building the Headers mapping."""
        for key, value in self.scope["headers"]:
            if key == name:
                return value.decode("latin-1")
        return None

    def watch(self, call: Call) -> None:
        """Start watching for the client's disconnect, which cancels `call` (the job's rows
        still queued are then dropped before they cost compute)."""
        future = call.future
        if self._watch is None and future is not None and not future.done():
            self._watch = self.loop.create_task(self._until_gone(call))

    async def _until_gone(self, call: Call) -> None:
        # The body is read by now, so the next message the server has is the disconnect.
        while (await self.receive())["type"] != "http.disconnect":
            await asyncio.sleep(0.01)  # a server that keeps answering: do not spin
        call.cancel()  # the batcher drops what is still queued; the engine raises ClientGone


class InferenceRoute(APIRoute):
    """An inference route: FastAPI reads its signature for the OpenAPI schema, `endpoint(body,
    request)` with the body model and an `InferenceRequest`; `InferencePath` serves it. The
    router never does: InferencePath takes every POST to these paths before FastAPI sees it."""

    @property
    def body_model(self) -> type[BaseModel]:
        """The body model the endpoint's signature declares (its one body parameter)."""
        [param] = self.dependant.body_params
        model = param.field_info.annotation
        assert isinstance(model, type) and issubclass(model, BaseModel), self.path
        return model

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        path = self.path

        async def bypassed_by_inference_path(request: Request) -> Response:
            """The router's handler for this route: never called, since InferencePath serves
            every POST to it first; reaching it is a bug."""
            raise RuntimeError(f"POST {path} reached the router: InferencePath serves it")

        return bypassed_by_inference_path


async def respond(
    model: type[BaseModel],
    endpoint: Endpoint,
    request: InferenceRequest,
    raw: bytes,
    watches: DisconnectWatch,
    limit: int = 0,
) -> Response:
    """The endpoint's response, or the error body for what it (or the body `raw`) raised; its
    engine call is watched for the client's disconnect (`watches`) while it runs.
    limit: the most bytes a compressed body may expand to (0: the body's own size, x 64)."""
    watches.add(request, request.start_call())
    try:
        require_api_key(request)
        raw = decompressed(raw, request.header(b"content-encoding"), limit or 64 * len(raw))
        body = parse(model, raw, request.header(b"content-type"))
        return await endpoint(body, request)
    except Exception as exc:
        return error_response(*request.fail(exc))
    finally:
        watches.discard(request)
        if request._watch is not None:
            request._watch.cancel()


class _BadBody(ServiceError):
    def __init__(self, status: int, message: str, error_type: str) -> None:
        super().__init__(message)
        self.status, self.error_type = status, error_type


def decompressed(raw: bytes, encoding: str | None, limit: int) -> bytes:
    """The body as sent before its Content-Encoding: gzip is undone (clients that compress
    large batches send it), identity or none is the body itself; any other is a 415. A gzip
    body that is not one is a 400, and one that expands past `limit` (the payload limit) a
    413: a few kilobytes of gzip can hold gigabytes of zeros."""
    codings = [c.strip().lower() for c in (encoding or "").split(",") if c.strip()]
    codings = [c for c in codings if c != "identity"]
    if not codings:
        return raw
    if codings != ["gzip"] and codings != ["x-gzip"]:
        raise _BadBody(
            415,
            f"Content-Encoding {encoding!r} is not supported: send the body as it is, or gzip",
            "unsupported_media_type",
        )
    inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        body = inflate.decompress(raw, limit + 1)
        done = inflate.eof and not inflate.unused_data
    except zlib.error:
        done, body = False, b""
    if len(body) > limit:
        raise _BadBody(
            413, f"the body expands past the payload limit ({limit} bytes)", "payload_too_large"
        )
    if not done:
        raise _BadBody(
            400,
            "body: Content-Encoding is gzip but the body is not (or is cut short) gzip data",
            "bad_request",
        )
    return body


def parse(model: type[BaseModel], raw: bytes, content_type: str | None) -> Any:
    """The body as `model`. The usual body goes through pydantic-core's JSON parser in one
    call; a body it refuses as JSON is parsed again by the standard library, which decides
    as FastAPI did (not UTF-8: 400; lone surrogate escapes: parsed, then refused by the model
    with a message that says so; broken JSON: 422 naming the character). What pydantic-core
    takes that is not JSON to serve (`not_strict_json`: NaN, a key twice) is a 422 too."""
    if content_type is not None:
        media = content_type.partition(";")[0].strip().lower()
        if media != "application/json" and not media.endswith("+json"):
            raise _BadBody(422, "body: send JSON with Content-Type: application/json", "validation")
    if not raw:
        raise _BadBody(422, "body: a JSON object body is required", "validation")
    try:
        body = model.model_validate_json(raw)
    except ValidationError as exc:
        if not any(err["type"] == "json_invalid" for err in exc.errors()):
            # a NaN that a field refused is said as what it is, not as "not an integer"
            problem = not_strict_json(raw)
            raise (_BadBody(422, problem, "validation") if problem else _invalid(exc)) from None
    else:
        if problem := not_strict_json(raw, body):
            raise _BadBody(422, problem, "validation")
        return body
    try:
        data = json.loads(raw.decode("utf-8"), **STRICT_JSON)
    except UnicodeDecodeError:
        raise _BadBody(400, "the body is not valid UTF-8", "bad_request") from None
    except NotStrictJson as exc:
        raise _BadBody(422, str(exc), "validation") from None
    except json.JSONDecodeError as exc:
        message = f"body is not valid JSON ({exc.msg} at character {exc.pos})"
        raise _BadBody(422, message, "validation") from None
    except ValueError:  # an integer past Python's 4300 digits (pydantic-core's limit too)
        message = "body: a number has more digits than any field takes; send one in its range"
        raise _BadBody(422, message, "validation") from None
    except RecursionError:  # pydantic-core stops at depth 200; the standard library recurses
        message = "body: JSON nested too deeply (a request body is an object of a few levels)"
        raise _BadBody(422, message, "validation") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _invalid(exc) from None


class NotStrictJson(Exception):
    """What JSON parsers take but a request must not hold: NaN / Infinity, a key twice."""


def _no_constant(literal: str) -> Any:
    raise NotStrictJson(
        f"body is not valid JSON: {literal} is not a JSON number (JSON has no NaN or "
        "Infinity); send a finite number"
    )


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise NotStrictJson(
                    f"body: the key {key!r} appears twice in one object; send each key once "
                    "(parsers disagree on which one counts)"
                )
            seen.add(key)
    return out


# json.loads' hooks that refuse what NotStrictJson names
STRICT_JSON: dict[str, Any] = {"object_pairs_hook": _unique_keys, "parse_constant": _no_constant}


def not_strict_json(raw: bytes, body: BaseModel | None = None) -> str | None:
    """Why `raw`, which pydantic-core parsed (into `body`, when it is valid), is still not a
    body to serve, or None: a NaN or Infinity literal (pydantic-core reads them; JSON has no
    such numbers), or a key twice in one object (pydantic-core keeps the last; parsers
    disagree). A body with no more colons than `body` has fields holds neither a nested
    object nor a repeated key, and is not parsed again: the usual body costs three scans in
    C; one with objects inside (QA's list, v2) or a colon in a text, a second parse."""
    keys = -1 if body is None else len(body.model_fields_set)
    if raw.count(b":") <= keys and b"NaN" not in raw and b"Infinity" not in raw:
        return None
    try:
        json.loads(raw, **STRICT_JSON)
    except NotStrictJson as exc:
        return str(exc)
    except (ValueError, RecursionError):  # pydantic-core's verdict on the rest stands
        return None
    return None


def _invalid(exc: ValidationError) -> _BadBody:
    errors = [dict(err) for err in exc.errors(include_url=False)]
    return _BadBody(422, describe_validation(errors), "validation")


class InferencePath:
    """In front of FastAPI (`service.app.App.stack`), inside CORS when that is on. POSTs to the
    inference paths are served here in one layer: the payload limit and the route, past the
    router, with the answer written by two raw sends, the request's record (service.lifecycle)
    all along: its timing headers, then its metrics and, with `tracing` on (the app's lifespan
    sets it), its spans. Everything else goes on to FastAPI.

    Why one layer: with a near-null model each ASGI layer (a closure around send, a replayed
    receive, a header dict) cost a few us of event-loop CPU per request, and the event loop is
    the largest part of a small request's server CPU (benchmarks/server_cost.py)."""

    tracing: Tracing | None = None

    def __init__(
        self, app: ASGIApp, routes: list[InferenceRoute], engine: Engine, limit: int
    ) -> None:
        self.app = app
        self.engine, self.metrics, self.limit = engine, engine.metrics, limit
        self.watches = DisconnectWatch()
        self.handlers = {
            route.path: (route.body_model, route.endpoint)
            for route in routes
            if route.methods and "POST" in route.methods
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"] if scope["type"] == "http" else None
        if path == "/" and scope["method"] == "POST":
            try:
                require_api_key(Request(scope, receive))  # before a message that names the models
                scope["path"] = ROOT_ROUTES[self.root_task(scope)]
            except ServiceError as exc:
                await error_response(*error_for(exc, scope))(scope, receive, send)
                return
        handler = self.handlers.get(scope["path"]) if scope["type"] == "http" else None
        if handler is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        request = InferenceRequest(scope, receive, self.engine)  # its clock starts
        try:
            raw = await self._body(scope, receive)
            if raw is None:
                request.status, request.error_type = 413, "payload_too_large"
                await reject_payload(scope, send, self.limit)
            elif raw is not _GONE:
                response = await respond(*handler, request, raw, self.watches, self.limit)
                timing = request.answer_built(response.status_code)
                await send(
                    {
                        "type": "http.response.start",
                        "status": response.status_code,
                        "headers": response.raw_headers + timing,
                    }
                )
                await send({"type": "http.response.body", "body": response.body})
        finally:
            request.finish(self.metrics, self.tracing)

    @staticmethod
    def root_task(scope: Scope) -> str:
        """The request task POST / answers (service.selection.root_task)."""
        registry = scope["app"].state.registry
        ready = [e.model for e in registry.entries if e.model is not None]
        if not ready:
            raise NotReady("no model is loaded yet")
        return root_task(ready, registry.settings.default_model)

    async def _body(self, scope: Scope, receive: Receive) -> bytes | None:
        """The body; None when it is over the limit (by Content-Length, else counted as it
        streams), _GONE when the client left first."""
        for key, value in scope["headers"]:
            if key == b"content-length":
                if value.isdigit() and int(value) > self.limit:
                    return None
                break
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return _GONE
            body += message.get("body", b"")
            if len(body) > self.limit:
                return None
            if not message.get("more_body", False):
                return body


_GONE = b"<gone>"  # a sentinel compared by identity

# POST / takes the route of its model's task, as text-embeddings-inference's root does.
ROOT_ROUTES = {
    "classification": "/classify",
    "token-classification": "/ner",
    "question-answering": "/qa",
    "embedding": "/embed",
    "sparse-embedding": "/embed_sparse",
    "fill-mask": "/fill-mask",
}
