"""Answer shaping shared by the routes (the rule itself is documented in service.schemas)."""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
from starlette.responses import Response

from service.schemas import Error

T = TypeVar("T")

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": Error, "description": what}
    for status, what in {
        400: "the body is not UTF-8 (or not JSON the server can parse)",
        401: "missing or wrong API key",
        403: "model control is off (load / unload)",
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


def answer(results: list[Any], single: bool) -> Response:
    """The answer for a single input, or the list of answers."""
    return json_response(results[0] if single else results)


def json_response(content: Any) -> Response:
    """`content` as JSON, numpy arrays included, written by orjson: a ready response, so
    FastAPI never re-validates every float of every vector against the response_model. The
    batcher has already refused outputs that are not finite (JSON has no NaN)."""
    body = orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)
    return Response(body, media_type="application/json")
