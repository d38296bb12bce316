"""What the non-inference routes depend on, as `Annotated` aliases: the registry, the settings,
and the API key check (the inference routes take theirs in service.routes.inference)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.errors import Unauthorized
from service.keys import Keys
from service.registry import Registry
from service.settings import Settings

# The dependencies are `async def` although they never await: FastAPI runs a plain `def`
# dependency in a worker thread, and a thread hop costs more than the work.


async def get_registry(request: Request) -> Registry:
    registry: Registry = request.app.state.registry
    return registry


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


RegistryDep = Annotated[Registry, Depends(get_registry)]
SettingsDep = Annotated[Settings, Depends(get_settings)]


def require_bearer(request: Request, keys: Keys, what: str) -> None:
    """401 unless `Authorization: Bearer <key>` names one of `keys` (when any is set)."""
    if not keys.enabled:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not keys.accepts(token.strip().encode()):
        raise Unauthorized(
            f"missing or wrong {what}: send 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )


def require_api_key(request: Request) -> None:
    """401 unless the request names an inference key in force (when any is set)."""
    require_bearer(request, request.app.state.keys, "API key")


async def _check_api_key(request: Request) -> None:
    require_api_key(request)


ApiKey = Depends(_check_api_key)
