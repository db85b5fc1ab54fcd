"""The one error type of the pipeline.

Any stage raises `GatewayError`; the client format that owns the request renders it in
its own wire shape (OpenAI `{"error": {...}}` or Anthropic `{"type": "error", ...}`).
Nothing else should ever reach a client as an error.
"""
from __future__ import annotations

from config.lifecycle import retired_message

# OpenAI-style `error.type` per status, used when a raiser does not choose one.
_DEFAULT_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "insufficient_credits",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    410: "invalid_request_error",
    413: "request_too_large",
    422: "moderation_flagged",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class GatewayError(Exception):
    """A failure with a status a client can act on.

    `charged` is always False: 4xx, 422 and 502 are never billed (SPEC section 7).
    """
    from_upstream = False       # True for a failure of the upstream (providers.base.UpstreamError)

    def __init__(self, status: int, message: str, *, type: str | None = None,
                 code: str | None = None, param: str | None = None,
                 headers: dict[str, str] | None = None, extra: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _DEFAULT_TYPES.get(status, "api_error")
        self.code = code
        self.param = param
        self.headers = headers or {}
        self.extra = extra or {}   # more fields for the error body
        self.body: dict | None = None   # a whole body that replaces the format's shape (x402's 402)

    def __repr__(self) -> str:
        return f"GatewayError({self.status}, {self.message!r}, code={self.code!r})"


def bad_request(message: str, param: str | None = None, code: str = "invalid_request") -> GatewayError:
    return GatewayError(400, message, param=param, code=code)


def model_not_available(model_id: str, reason: str) -> GatewayError:
    """A catalog model whose provider cannot serve (no API key): retrying cannot help, so
    it is a 400 (with x-should-retry: false), not a 503 the SDKs would retry."""
    return GatewayError(400, f"model {model_id!r} is not available on this gateway: {reason}; "
                             "GET /api/v1/models lists the models that can answer", param="model",
                        code="model_not_available")


def model_retired(model_id: str, lifecycle) -> GatewayError:
    """A catalog model past its `retires` date: gone for good, so 410, naming the replacement."""
    return GatewayError(410, retired_message(model_id, lifecycle), param="model", code="model_retired")


# Statuses a client must not retry unchanged (sent as `x-should-retry: false`, which the
# OpenAI and Anthropic SDKs and the Claude Code CLI honour).
NOT_RETRYABLE = frozenset({400, 401, 402, 403, 404, 410, 413, 422})


class StartupError(Exception):
    """Something the gateway needs is not there at start (e.g. Redis unreachable): the
    message says what and what to do; `gateway run` prints it and exits 1, no traceback."""
