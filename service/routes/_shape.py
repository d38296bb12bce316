"""Answer shaping shared by the routes (the rule itself is documented in service.schemas)."""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi.responses import JSONResponse

from service.errors import BackendError
from service.schemas import Error

T = TypeVar("T")

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": Error, "description": what}
    for status, what in {
        400: "the body is not UTF-8 (or not JSON the server can parse)",
        401: "missing or wrong API key",
        404: "no such model",
        413: "body, input count or text length over the limits",
        422: "invalid request (the message names the field)",
        429: "too many requests in flight; retry after Retry-After seconds",
        503: "not ready, shutting down, timed out, or the backend failed this batch",
    }.items()
}


def as_list(inputs: T | list[T]) -> tuple[list[T], bool]:
    """(inputs as a list, whether the request sent a single input)."""
    if isinstance(inputs, list):
        return inputs, False
    return [inputs], True


def answer(results: list[Any], single: bool) -> JSONResponse:
    """The answer for a single input, or the list of answers. Returned as a ready response:
    FastAPI would otherwise re-validate every float of every vector against response_model."""
    return json_response(results[0] if single else results)


def json_response(content: Any) -> JSONResponse:
    try:
        return JSONResponse(content)
    except ValueError:  # JSON has no NaN or infinity
        raise BackendError("the model produced a NaN or infinite value for this input") from None


def chars(texts: list[str] | list[str | tuple[str, str]]) -> int:
    return sum(len(t) if isinstance(t, str) else len(t[0]) + len(t[1]) for t in texts)
