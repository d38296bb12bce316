"""The FastAPI application factory.

    uvicorn --factory service.app:create_app      # settings from BERT_HEADS_* variables
    python -m service --help                      # the same, with every setting as a flag

Nothing heavy happens at import or in `create_app`: the lifespan starts tracing when
otlp_endpoint is set (service.tracing), starts loading the packages in the background (so
/health answers and /ready says 503 meanwhile) and, at shutdown, drains in-flight requests for
up to drain_timeout seconds, then sends the spans still buffered. `python -m service` also
turns /ready to 503 the moment SIGTERM arrives, before uvicorn starts closing connections.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from service.engine import Engine
from service.http import install_error_handlers
from service.keys import Keys
from service.routes import ROUTERS, inference_routes
from service.routes.inference import InferencePath
from service.settings import Settings


class App(FastAPI):
    """FastAPI, entered through `stack`: the inference POSTs' one path (`InferencePath`) in
    front of FastAPI's own middleware stack, wrapped in CORS when that is on. FastAPI's layers
    (error middleware, telemetry hook: each a closure around send or receive) cost event-loop
    CPU on every request and do nothing for an inference POST that InferencePath does not do
    itself; every other request goes through them."""

    stack: ASGIApp | None = None  # set by create_app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope["app"] = self  # as Starlette sets it: Request.app, app.state
        assert self.stack is not None, "build the app with create_app"
        await self.stack(scope, receive, send)


def create_app(settings: Settings | None = None) -> App:
    settings = settings or Settings()
    logging.getLogger("service").setLevel(settings.log_level.upper())
    engine = Engine(settings.engine())  # the engine sees no HTTP knob
    metrics, registry = engine.metrics, engine.registry

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if settings.otlp_endpoint:
            # Imported here: the SDK is an extra (Settings checked that it is installed).
            from service.tracing import Tracing

            path.tracing = app.state.tracing = Tracing(settings.otlp_endpoint)
        await engine.start(wait=False)  # /health answers and /ready says 503 meanwhile
        try:
            yield
        finally:
            await engine.stop()
            if path.tracing is not None:
                tracing, path.tracing = path.tracing, None
                app.state.tracing = None
                await asyncio.to_thread(tracing.shutdown)  # a slow collector: not on the loop

    app = App(
        title="bert-heads",
        summary="BERT heads (classification, NER, QA, embeddings) on ONNX Runtime",
        lifespan=lifespan,
        # The service's metrics are its Prometheus ones. FastAPI's OpenTelemetry hooks, even
        # with no provider configured, looked at the environment on every request (~5% of a
        # request's CPU with a near-null model).
        telemetry={"tracing": False, "metrics": False, "logs": False},
        # the document and the pages are service.routes.docs': their assets served here, not
        # from a CDN, and behind the API key unless docs_public
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings, app.state.engine = settings, engine
    app.state.keys = Keys(settings.api_key, settings.api_keys_file)
    app.state.admin_keys = Keys(settings.admin_key, None)
    app.state.registry, app.state.metrics = registry, metrics
    app.state.tracing = None  # the lifespan's, when otlp_endpoint is set (the v2 routes')
    install_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    # CORS (outermost, so every answer carries its headers) -> the inference POSTs' one path
    # (limit, body, key, engine, error body, the request's lifecycle) -> FastAPI for the rest.
    behind = partial(FastAPI.__call__, app)
    path = InferencePath(
        behind, routes=inference_routes(), engine=engine, limit=settings.payload_limit
    )
    stack: ASGIApp = path
    if settings.cors_origins:
        stack = CORSMiddleware(
            stack,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    app.stack = stack
    return app
