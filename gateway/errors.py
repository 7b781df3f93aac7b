"""The gateway's error tree, rendered as OpenAI's error JSON.

Every failure a client can see is a :class:`GatewayError`; foreign exceptions are mapped
into it at the seam where they occur (``raise ... from exc``), so the error handler in
:mod:`gateway.app` never has to guess a status code.
"""

from __future__ import annotations

from typing import Any

import orjson


class GatewayError(Exception):
    status: int = 500
    type: str = "internal_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def json(self) -> bytes:
        return orjson.dumps(self.body())


class InternalError(GatewayError):
    """A failure of the gateway's own (a bug): the details go to the log, never to the client."""

    def __init__(self) -> None:
        super().__init__("The gateway failed to handle the request.")


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"


class Unauthorized(GatewayError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class Forbidden(GatewayError):
    status = 403
    type = "permission_error"
    code = "permission_denied"


class ModelNotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class NotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class PayloadTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class RateLimited(GatewayError):
    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"


class QuotaExceeded(GatewayError):
    status = 429
    type = "insufficient_quota"
    code = "insufficient_quota"


class BackendUnavailable(GatewayError):
    """No healthy backend, or the chosen one refused the connection."""

    status = 503
    type = "service_unavailable"
    code = "backend_unavailable"


class StoreUnavailable(GatewayError):
    """A database the request needs (keys, reports, admin changes) cannot be reached."""

    status = 503
    type = "service_unavailable"
    code = "store_unavailable"
    retry_after = 5
    """Seconds a client is told to wait (Retry-After): a fresh attempt costs the store one query."""

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"retry-after": str(self.retry_after)})


class ShuttingDown(GatewayError):
    """The server stopped the call before its answer began: its drain timeout ran out."""

    status = 503
    type = "service_unavailable"
    code = "shutting_down"

    def __init__(self) -> None:
        super().__init__(
            "The gateway is shutting down; send the call again.", headers={"retry-after": "1"}
        )


class BadGateway(GatewayError):
    """The backend answered with something that is not a usable response."""

    status = 502
    type = "bad_gateway"
    code = "bad_gateway"


class GatewayTimeout(GatewayError):
    status = 504
    type = "timeout"
    code = "backend_timeout"


class ClientClosedRequest(GatewayError):
    """The client disconnected before its answer began (nginx's 499): nobody reads this
    error; it labels the call in the ledger, the metrics and the access log."""

    status = 499
    type = "client_closed_request"
    code = "client_closed_request"


class UpstreamError(GatewayError):
    """A backend's own error response, passed through with its status and body.

    Its error's type and code are kept (the access log, gateway_requests_total and the
    ledger name them, rather than calling the backend's refusal an internal error); an
    error in vLLM's older shape, ``{"object": "error", "message", "type", ...}``, is passed
    on in OpenAI's, which is what clients parse."""

    type = "upstream_error"
    """When the backend names no usable type (not JSON, or not an error object)."""

    def __init__(self, status: int, body: bytes, content_type: str = "application/json"):
        super().__init__(f"backend returned {status}")
        self.status = status
        self.raw = body
        self.content_type = content_type
        error, shaped = _backend_error(body)
        if error is None:
            return
        self.type = _label(error.get("type")) or self.type
        self.code = _label(error.get("code"))
        if not shaped:
            fields = ("message", "type", "param", "code")
            self.raw = orjson.dumps({"error": {f: error.get(f) for f in fields}})
            self.content_type = "application/json"

    def json(self) -> bytes:
        return self.raw


def _backend_error(body: bytes) -> tuple[dict[str, Any] | None, bool]:
    """The error object in a backend's body, and whether it is already in OpenAI's shape."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None, False
    if not isinstance(data, dict):
        return None, False
    if isinstance(data.get("error"), dict):
        return data["error"], True
    if data.get("object") == "error":
        return data, False
    return None, False


def _label(value: object) -> str | None:
    """A backend's type or code as a metric label and ledger value: a short word, or None
    (whatever else a backend sends must not become a label of its own)."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if (
        isinstance(value, str)
        and 0 < len(value) <= 40
        and value.replace("_", "").isalnum()
        and value.isascii()
    ):
        return value
    return None
