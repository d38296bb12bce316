"""The FastAPI application factory.

    uvicorn --factory service.app:create_app      # settings from BERT_HEADS_* variables
    python -m service --help                      # the same, with every setting as a flag

Nothing heavy happens at import or in `create_app`: the lifespan starts loading the packages
in the background (so /health answers and /ready says 503 meanwhile) and, at shutdown, drains
in-flight requests for up to drain_timeout seconds. `python -m service` also turns /ready to
503 the moment SIGTERM arrives, before uvicorn starts closing connections.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from starlette.types import Receive, Scope, Send

from service.http import PayloadLimit, RequestMetrics, install_error_handlers
from service.metrics import Metrics
from service.registry import Registry
from service.routes import ROUTERS, inference_routes
from service.routes.inference import DisconnectWatch, Shortcut
from service.settings import Settings


class App(FastAPI):
    """FastAPI, with the inference POSTs served in front of its middleware stack when `front`
    is set: FastAPI's own layers (error middleware, telemetry hook, body limit: each a closure
    around send or receive) cost event-loop CPU on every request and do nothing there that
    `Shortcut` does not do itself. Every other request goes through the whole stack."""

    front: Shortcut | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.front is None:
            await super().__call__(scope, receive, send)
        else:
            scope["app"] = self  # as Starlette sets it: Request.app, app.state
            await self.front(scope, receive, send)


def create_app(settings: Settings | None = None) -> App:
    settings = settings or Settings()
    logging.getLogger("service").setLevel(settings.log_level.upper())
    metrics = Metrics()
    registry = Registry(settings, metrics)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        registry.start_loading()
        try:
            yield
        finally:
            await registry.shutdown(settings.drain_timeout)

    app = App(
        title="bert-heads",
        summary="BERT heads (classification, NER, QA, embeddings) on ONNX Runtime",
        lifespan=lifespan,
        # The service's metrics are its Prometheus ones. FastAPI's OpenTelemetry hooks, even
        # with no provider configured, looked at the environment on every request (~5% of a
        # request's CPU with a near-null model).
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.settings, app.state.registry, app.state.metrics = settings, registry, metrics
    app.state.disconnect_watch = DisconnectWatch()  # the inference routes' (see there)
    install_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    # Added innermost first: CORS (outermost, so errors carry its headers) -> the inference
    # POSTs' one-layer path (limit, metrics, route) -> metrics -> payload limit -> FastAPI.
    # Without CORS, that one-layer path sits in front of FastAPI's stack instead (App.front).
    app.add_middleware(PayloadLimit, limit=settings.payload_limit)
    app.add_middleware(RequestMetrics, metrics=metrics)
    routes, limit = inference_routes(), settings.payload_limit
    if not settings.cors_origins:
        behind = partial(FastAPI.__call__, app)
        app.front = Shortcut(behind, routes=routes, metrics=metrics, limit=limit)
    else:
        app.add_middleware(Shortcut, routes=routes, metrics=metrics, limit=limit)
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    return app
