"""GET /health (the process is alive) and GET /ready (every package loaded and warmed up; the
policy is in service.registry). Never behind the API key: orchestrators probe them."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from service.registry import Entry
from service.routes.deps import RegistryDep
from service.schemas import Health, Readiness

router = APIRouter(tags=["probes"])


@router.get("/health", response_model=Health, responses={503: {"model": Health}})
async def health(registry: RegistryDep) -> JSONResponse:
    """200 while the process can serve; 503 when a model's batch worker has died (restart me)."""
    dead = [e.name for e in registry.entries if e.model is not None and not e.model.batcher.alive]
    if dead and not registry.draining:
        return JSONResponse({"status": "dead", "models": dead}, status_code=503)
    return JSONResponse({"status": "alive"})


@router.get("/ready", response_model=Readiness, responses={503: {"model": Readiness}})
async def ready(registry: RegistryDep) -> JSONResponse:
    ok, status = registry.readiness()
    models = {e.name: _state(e) for e in registry.entries}
    body = Readiness(ready=ok, status=status, models=models)  # type: ignore[arg-type]
    return JSONResponse(body.model_dump(), status_code=200 if ok else 503)


def _state(entry: Entry) -> str:
    if entry.error is not None:
        return f"failed: {entry.error}"
    if entry.reload_error is not None:  # the version loaded before serves on
        return f"{entry.state}; a new version failed: {entry.reload_error}"
    return entry.state
