"""Typed errors: each maps to one HTTP status and a JSON body `{"error", "error_type"}`.

Task modules, the batcher and the runtime raise these; `app.py` turns them into responses,
so a route never builds an error response by hand.
"""

from __future__ import annotations


class ServiceError(Exception):
    """Base class. `status` is the HTTP status, `error_type` the machine-readable kind."""

    status: int = 500
    error_type: str = "internal"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}


class InputError(ServiceError):
    """The request is well-formed JSON but its content cannot be served as asked."""

    status = 422
    error_type = "validation"


class PayloadTooLarge(ServiceError):
    status = 413
    error_type = "payload_too_large"


class Unauthorized(ServiceError):
    status = 401
    error_type = "unauthorized"


class Forbidden(ServiceError):
    status = 403
    error_type = "forbidden"


class ModelNotFound(ServiceError):
    status = 404
    error_type = "model_not_found"


class Overloaded(ServiceError):
    """Admission control refused the request; the client should retry after `retry_after` s."""

    status = 429
    error_type = "overloaded"

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message, headers={"Retry-After": str(max(1, round(retry_after)))})


class NotReady(ServiceError):
    status = 503
    error_type = "not_ready"


class BackendError(ServiceError):
    """ONNX Runtime failed on a batch: only that batch's requests see this."""

    status = 503
    error_type = "backend"


class DeadlineExceeded(ServiceError):
    status = 503
    error_type = "timeout"


class ClientGone(ServiceError):
    """The caller gave its call up (an HTTP client disconnected) before the answer was ready;
    nobody reads this error, it is counted."""

    status = 499  # nginx's "client closed request"
    error_type = "client_gone"
