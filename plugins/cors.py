"""CORS, so browser clients and browser-based agents can call the gateway and read the
payment and request-id headers. Credentials travel in headers, never cookies, so any
origin is safe by default; `server.cors_origins: [https://app.example]` narrows it."""
from __future__ import annotations

from aiohttp import web

from . import hookimpl
from .appstate import OPTIONS_ANSWERS

ALLOW_HEADERS = ("Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta, "
                 "PAYMENT-SIGNATURE, X-PAYMENT, X-Request-Id")
EXPOSE_HEADERS = ("PAYMENT-REQUIRED, PAYMENT-RESPONSE, X-PAYMENT-RESPONSE, X-Request-Id, Retry-After, "
                  "RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset, x-should-retry")


def _origin(request: web.Request, allowed: list[str]) -> str | None:
    if "*" in allowed:
        return "*"
    origin = request.headers.get("Origin")
    return origin if origin in allowed else None


@hookimpl
def gateway_configure(app, config):
    allowed = config.server.cors_origins

    async def add_headers(request: web.Request, response: web.StreamResponse) -> None:
        origin = _origin(request, allowed)
        if origin:
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Expose-Headers"] = EXPOSE_HEADERS

    def preflight(request: web.Request) -> web.Response | None:
        if "Access-Control-Request-Method" not in request.headers:
            return None
        return web.Response(status=204, headers={"Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
                                                 "Access-Control-Allow-Headers": ALLOW_HEADERS,
                                                 "Access-Control-Max-Age": "86400"})

    app.on_response_prepare.append(add_headers)
    app[OPTIONS_ANSWERS].append(preflight)       # asked by the core's middleware, for OPTIONS requests only
