"""What the non-inference routes depend on, as `Annotated` aliases: the registry, the settings,
and the API key check (the inference routes take theirs in service.routes.inference)."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request

from service.errors import Unauthorized
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


def require_api_key(request: Request, settings: SettingsDep) -> None:
    """401 unless `Authorization: Bearer <api_key>` matches (when an api_key is set)."""
    if settings.api_key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    expected = settings.api_key.get_secret_value().encode()
    # compare_digest: the time taken does not tell how much of the key was right
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected):
        raise Unauthorized(
            "missing or wrong API key: send 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )


async def _check_api_key(request: Request, settings: SettingsDep) -> None:
    require_api_key(request, settings)


ApiKey = Depends(_check_api_key)
