"""The request path of the inference routes, kept cheap: FastAPI declares them (the OpenAPI
schema and /docs come from each endpoint's signature, as for any route), but a request never
enters FastAPI's per-request machinery.

- `Shortcut`, in front of FastAPI's middleware stack (inside CORS when that is on), serves
  POSTs to these paths in one layer: payload limit, request metrics, and the route;
- `InferenceRoute` reads the body, validates it with pydantic-core straight from the raw bytes
  (`model_validate_json`), checks the API key and takes an admission slot, and calls the
  endpoint with the body model and an `Inference`;
- `Inference` (the request, plus the model it picked) hands one job to the model's batcher and
  gives it up if the client disconnects first.

Why: with a near-null model on 2 cores, FastAPI's routing, dependency resolution and body
handling took ~1 ms of event-loop CPU per request, several times the rest of the path (see
benchmarks/server_cost.py). Errors, limits, metrics and disconnects behave as on any route.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, get_type_hints

from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from heads.rows import InvalidInput
from heads.tasks import Job
from service.errors import PayloadTooLarge, ServiceError
from service.http import (
    ClientGone,
    describe_validation,
    error_response,
    error_type_of,
    reject_payload,
)
from service.metrics import Metrics
from service.registry import LoadedModel, Registry
from service.routes.deps import require_api_key

log = logging.getLogger(__name__)

Endpoint = Callable[[Any, "Inference"], Awaitable[Response]]

# A request still waiting for its answer WATCH_AFTER to 2 x WATCH_AFTER seconds after it was
# queued gets a task that watches for the client's disconnect: a disconnect is then noticed
# at most that much later (and always before the request's rows still queued run).
WATCH_AFTER = 0.05


class DisconnectWatch:
    """Starts the disconnect watch of every request still waiting after a sweep period, with
    one timer per period for all of them. Why not one timer per request: most answers come
    back within a period, and each timer cost a heap push and a cancel on the event loop.

    Two generations: requests queued since the last sweep (`young`), and those queued before
    it (`old`); at each sweep the old ones still waiting get their watch, and the young
    become old."""

    def __init__(self) -> None:
        self.young: dict[Inference, asyncio.Future[Any]] = {}
        self.old: dict[Inference, asyncio.Future[Any]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None

    def add(self, run: Inference, future: asyncio.Future[Any]) -> None:
        self.young[run] = future
        if self._timer is None or self._loop is not run.loop:  # a test's loop may be new
            self._loop = run.loop
            self._timer = run.loop.call_later(WATCH_AFTER, self._sweep)

    def discard(self, run: Inference) -> None:
        if self.young.pop(run, None) is None:
            self.old.pop(run, None)

    def _sweep(self) -> None:
        for run, future in self.old.items():
            run.watch(future)
        self.old, self.young = self.young, {}
        assert self._loop is not None
        self._timer = self._loop.call_later(WATCH_AFTER, self._sweep) if self.old else None


class Inference(Request):
    """One inference request: the model it uses and its path through that model's batcher.
    Endpoints take it as their second argument (FastAPI sees a Request, so the OpenAPI schema
    holds only the body)."""

    def __init__(self, scope: Scope, receive: Receive) -> None:
        super().__init__(scope, receive)
        state = self.app.state
        self.registry: Registry = state.registry
        self.watches: DisconnectWatch = state.disconnect_watch
        # Kept: asyncio.get_running_loop() makes a getpid() system call on every call.
        self.loop = asyncio.get_running_loop()
        self.deadline = self.loop.time() + self.registry.settings.request_timeout
        self._model: LoadedModel | None = None
        self._gone = False  # the client disconnected
        self._watch: asyncio.Task[None] | None = None

    @property
    def model(self) -> LoadedModel:
        assert self._model is not None, "call use() first"
        return self._model

    def use(self, task: str, name: str | None) -> LoadedModel:
        """The model for this request (by name, or the only one of `task`)."""
        self._model = self.registry.select(task, name, self.scope["path"])
        state = self.scope.setdefault("state", {})
        state["model"], state["task"] = self._model.name, task  # for RequestMetrics
        return self._model

    def check_sizes(self, sizes: list[int]) -> None:
        """413 for more inputs than max_client_batch_size or an input over max_text_chars.
        sizes: characters per input (a pair's two texts together)."""
        s = self.registry.settings
        if len(sizes) > s.max_client_batch_size:
            raise PayloadTooLarge(
                f"inputs has {len(sizes)} items, more than max_client_batch_size "
                f"({s.max_client_batch_size}); split the request"
            )
        for i, n in enumerate(sizes):
            if n > s.max_text_chars:
                raise PayloadTooLarge(
                    f"inputs[{i}] has {n} characters, more than max_text_chars "
                    f"({s.max_text_chars}); split the text"
                )

    async def read(self) -> bytes:
        """The whole body. PayloadLimit has buffered it, so this is one message; Starlette's
        Request.body() costs several times more for the same bytes."""
        chunks = []
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise ClientGone("client disconnected")
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def header(self, name: bytes) -> str | None:
        """One request header (lower-case name), without building the Headers mapping."""
        for key, value in self.scope["headers"]:
            if key == name:
                return value.decode("latin-1")
        return None

    async def run(self, job: Job) -> Any:
        """The job's answer from the model chosen by `use`. Raises ClientGone when the client
        disconnects first: the job's rows still queued are then dropped before they cost
        compute."""
        future = self.model.batcher.enqueue(job, self.deadline)
        # Most answers come back before a watch would be worth its task: one starts only for
        # a request still waiting at the next sweep but one.
        watches = self.watches
        watches.add(self, future)
        try:
            return await future
        except asyncio.CancelledError:
            if self._gone:
                raise ClientGone("client disconnected") from None
            raise
        finally:
            watches.discard(self)
            if self._watch is not None:
                self._watch.cancel()

    def watch(self, future: asyncio.Future[Any]) -> None:
        """Start watching for the client's disconnect, which cancels `future`."""
        if self._watch is None and not future.done():
            self._watch = self.loop.create_task(self._until_gone(future))

    async def _until_gone(self, future: asyncio.Future[Any]) -> None:
        # The body is read by now, so the next message the server has is the disconnect.
        while (await self.receive())["type"] != "http.disconnect":
            await asyncio.sleep(0.01)  # a server that keeps answering: do not spin
        self._gone = True
        future.cancel()  # the batcher drops what is still queued


class InferenceRoute(APIRoute):
    """A route served from the raw request: `endpoint(body, run)` where `body` is the model
    its signature names, validated from the bytes, and `run` an `Inference`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        model = get_type_hints(self.endpoint)["body"]
        endpoint = self.endpoint

        async def handle(request: Request) -> Response:
            return await respond(model, endpoint, Inference(request.scope, request.receive))

        return handle


async def respond(
    model: type[BaseModel], endpoint: Endpoint, run: Inference, raw: bytes | None = None
) -> Response:
    """The endpoint's response, or the error response for what it (or the body) raised.
    raw: the body, when the caller has read it already."""
    registry = run.registry
    try:
        if raw is None:
            raw = await run.read()
        require_api_key(run, registry.settings)
        body = parse(model, raw, run.header(b"content-type"))
        registry.check_accepting()
        registry.admission.acquire()
        try:
            return await endpoint(body, run)
        finally:
            registry.admission.release()
    except ServiceError as exc:
        return error_response(run, exc.status, exc.message, exc.error_type, exc.headers)
    except InvalidInput as exc:
        return error_response(run, 422, str(exc), "validation")
    except _BadBody as exc:
        return error_response(run, exc.status, exc.message, exc.error_type)
    except Exception:
        log.exception("unhandled error on %s %s", run.method, run.url.path)
        return error_response(run, 500, "internal error (a bug: please report it)", "internal")


class _BadBody(Exception):
    def __init__(self, status: int, message: str, error_type: str) -> None:
        self.status, self.message, self.error_type = status, message, error_type


def parse(model: type[BaseModel], raw: bytes, content_type: str | None) -> Any:
    """The body as `model`. The usual body goes through pydantic-core's JSON parser in one
    call; a body it refuses as JSON is parsed again by the standard library, which decides
    as FastAPI did (not UTF-8: 400; lone surrogate escapes: parsed, then refused by the model
    with a message that says so; broken JSON: 422 naming the character)."""
    if content_type is not None:
        media = content_type.partition(";")[0].strip().lower()
        if media != "application/json" and not media.endswith("+json"):
            raise _BadBody(422, "body: send JSON with Content-Type: application/json", "validation")
    if not raw:
        raise _BadBody(422, "body: a JSON object body is required", "validation")
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        if not any(err["type"] == "json_invalid" for err in exc.errors()):
            raise _invalid(exc) from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise _BadBody(400, "the body is not valid UTF-8", "bad_request") from None
    except json.JSONDecodeError as exc:
        message = f"body is not valid JSON ({exc.msg} at character {exc.pos})"
        raise _BadBody(422, message, "validation") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _invalid(exc) from None


def _invalid(exc: ValidationError) -> _BadBody:
    errors = [dict(err) for err in exc.errors(include_url=False)]
    return _BadBody(422, describe_validation(errors), "validation")


class Shortcut:
    """In front of FastAPI (`service.app.App.front`), or with CORS configured the outermost of
    the service's middlewares inside CORS. POSTs to the inference paths are served here in one
    layer: the payload limit, the request metrics and the route, past the router, with the
    answer written by two raw sends. Everything else
    goes on to `RequestMetrics` -> `PayloadLimit` -> FastAPI, which do the same for a request
    that gets here without this layer.

    Why one layer: with a near-null model each ASGI layer (a closure around send, a replayed
    receive, a header dict) cost a few us of event-loop CPU per request, and the event loop is
    the largest part of a small request's server CPU (benchmarks/server_cost.py)."""

    def __init__(
        self, app: ASGIApp, routes: list[InferenceRoute], metrics: Metrics, limit: int
    ) -> None:
        self.app = app
        self.metrics, self.limit = metrics, limit
        self.handlers = {
            route.path: (get_type_hints(route.endpoint)["body"], route.endpoint)
            for route in routes
            if route.methods and "POST" in route.methods
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = self.handlers.get(scope["path"]) if scope["type"] == "http" else None
        if handler is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        start = time.perf_counter()
        status = 500  # as RequestMetrics counts a request that ends without an answer
        try:
            raw = await self._body(scope, receive)
            if raw is None:
                status = 413
                await reject_payload(scope, send, self.limit)
            elif raw is not _GONE:
                response = await respond(*handler, Inference(scope, receive), raw)
                status = response.status_code
                await send(
                    {
                        "type": "http.response.start",
                        "status": status,
                        "headers": response.raw_headers,
                    }
                )
                await send({"type": "http.response.body", "body": response.body})
        finally:
            model, task = state.get("model", ""), state.get("task", "")
            path = scope["path"]
            self.metrics.answered(model, task, path, status, time.perf_counter() - start)
            if status >= 400:
                reason = state.get("error_type") or error_type_of(status)
                self.metrics.failures.labels(model, task, reason).inc()

    async def _body(self, scope: Scope, receive: Receive) -> bytes | None:
        """The body; None when it is over the limit (by Content-Length, else counted as it
        streams), _GONE when the client left first. PayloadLimit's rules, without its replay."""
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
