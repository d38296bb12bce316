"""GET /metrics: Prometheus text format; behind the API key only with protect_metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from service.routes.deps import RegistryDep, SettingsDep, require_api_key

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response)
async def metrics(request: Request, registry: RegistryDep, settings: SettingsDep) -> Response:
    if settings.protect_metrics:
        require_api_key(request, settings)
    return Response(registry.metrics.render(), media_type=CONTENT_TYPE_LATEST)
