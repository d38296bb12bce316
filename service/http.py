"""HTTP plumbing every route shares: the error body, the one mapping from exceptions to it
(`error_for`), the exception handlers that use it, and the 413 of the payload limit.

Every error is `{"error": str, "error_type": str}` with the status of its `ServiceError`;
FastAPI's own validation errors become 422 `validation` with a message naming the field.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import Scope, Send

from heads.rows import InvalidInput
from service.errors import ServiceError

log = logging.getLogger(__name__)

_TYPE_BY_STATUS = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    422: "validation",
    499: "client_gone",
}


def error_body(message: str, error_type: str) -> bytes:
    # ensure_ascii: a message quoting a lone surrogate from the request still encodes
    return json.dumps({"error": message, "error_type": error_type}, ensure_ascii=True).encode()


class ErrorResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return error_body(content["error"], content["error_type"])


def error_response(
    status: int, message: str, error_type: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = {"error": message, "error_type": error_type}
    return ErrorResponse(body, status_code=status, headers=headers)


def describe_validation(errors: list[dict[str, Any]]) -> str:
    """Pydantic errors -> 'inputs: item 2 must be a string, got a number; top_k: ...'."""
    parts = []
    for err in errors[:5]:
        loc = [p for p in err.get("loc", ()) if p != "body"]
        if err["type"] == "json_invalid":
            error = (err.get("ctx") or {}).get("error", "invalid JSON")
            parts.append(f"body is not valid JSON ({error} at character {loc[0] if loc else 0})")
            continue
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
        if err["type"] == "missing":
            msg = "required field is missing" if path else "a JSON object body is required"
        elif not path and err["type"] in ("model_attributes_type", "dict_type"):
            msg = "expected a JSON object"
        elif err["type"] == "extra_forbidden":
            msg = "unknown field (check its spelling against /docs)"
        elif isinstance(err.get("input"), float) and not math.isfinite(err["input"]):
            # what a number past a double's range (1e400) reads as; NaN literals are refused
            # before (service.routes.inference.not_strict_json)
            msg = "the number is out of range (past a double's, like 1e400); send a finite number"
        else:
            msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{path or 'body'}: {msg}")
    if len(errors) > 5:
        parts.append(f"and {len(errors) - 5} more")
    return "; ".join(parts)


def error_for(exc: Exception, scope: Scope) -> tuple[int, str, str, dict[str, str] | None]:
    """(status, message, error_type, headers) for what a request raised: the one mapping from
    exceptions to the error body, for the inference fronts (service.lifecycle) and FastAPI's
    handlers alike."""
    if isinstance(exc, ServiceError):
        return exc.status, exc.message, exc.error_type, exc.headers
    if isinstance(exc, InvalidInput):
        return 422, str(exc), "validation", None
    if isinstance(exc, RequestValidationError):
        return 422, describe_validation(list(exc.errors())), "validation", None
    log.error("unhandled error on %s %s", scope["method"], scope["path"], exc_info=exc)
    return 500, "internal error (a bug: please report it)", "internal", None


def routing_message(request: Request, status: int, headers: dict[str, str] | None) -> str | None:
    """The router's own 404 and 405 ("Not Found", "Method Not Allowed"), said with the fix: the
    endpoints there are, or the method the path takes. None for any other status."""
    where = f"{request.method} {request.url.path}"
    if status == 404:
        every = request.app.openapi()["paths"]  # built once, then cached
        # the ones a user types: not the model-control and v2 paths with {name} in them
        paths = ", ".join(p for p in every if "{" not in p and not p.startswith("/v2"))
        v2 = (
            "; the Open Inference Protocol is under /v2"
            if any(p.startswith("/v2") for p in every)
            else ""
        )
        return f"no endpoint at {where}; the endpoints are {paths}{v2} (see /docs)"
    if status == 405:
        allowed = (headers or {}).get("Allow", "")  # Starlette's router names the methods
        return f"{where} is not allowed: this path takes {allowed or 'another method'} (see /docs)"
    return None


def install_error_handlers(app: FastAPI) -> None:
    async def handle(request: Request, exc: Exception) -> JSONResponse:
        return error_response(*error_for(exc, request.scope))

    for kind in (ServiceError, InvalidInput, RequestValidationError, Exception):
        app.add_exception_handler(kind, handle)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        error_type = _TYPE_BY_STATUS.get(exc.status_code, "http_error")
        headers = dict(exc.headers) if exc.headers else None
        message = str(exc.detail)
        if message in ("Not Found", "Method Not Allowed"):  # the router's own words
            message = routing_message(request, exc.status_code, headers) or message
        return error_response(exc.status_code, message, error_type, headers)


def error_type_of(status: int) -> str:
    """The error_type of a status no handler named (the request metrics' failure reason)."""
    return _TYPE_BY_STATUS.get(status, "internal")


async def reject_payload(scope: Scope, send: Send, limit: int) -> None:
    """The 413 for a body over `limit` bytes."""
    body = error_body(f"request body over payload_limit ({limit} bytes)", "payload_too_large")
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    # The rest of the body is never read, so the connection cannot be reused.
    headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})
