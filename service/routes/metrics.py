"""GET /metrics: Prometheus text format; behind the API key (when one is set) unless
metrics_public."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from service.routes.answers import ERRORS
from service.routes.deps import RegistryDep, SettingsDep, require_api_key

router = APIRouter(tags=["metrics"])

PROMETHEUS_TEXT = {"description": "Prometheus text format", "content": {"text/plain": {}}}


@router.get("/metrics", response_class=Response, responses={200: PROMETHEUS_TEXT, 401: ERRORS[401]})
async def metrics(request: Request, registry: RegistryDep, settings: SettingsDep) -> Response:
    if not settings.metrics_public:
        require_api_key(request)
    return Response(registry.metrics.render(), media_type=CONTENT_TYPE_LATEST)
