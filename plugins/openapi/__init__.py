"""The API document and its docs page:

- `GET /api/v1/openapi.json`: every route of the gateway in OpenAPI 3.1 (document.py
  assembles it from spec/*.yaml and the providers' pinned schemas, once per process);
- `GET /docs`: a small page of our own (assets/, shipped in the package, nothing fetched
  from elsewhere) that renders that document, routes grouped by tag.
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

from aiohttp import web

from plugins import hookimpl
from plugins.appstate import CONFIG
from plugins.static_pages import StaticPage

from .document import build

DOCS = StaticPage(Path(__file__).resolve().parent / "assets", "docs")
PATH = "/api/v1/openapi.json"
SERVED = web.AppKey("openapi_document", list)


def _render(public_url: str) -> bytes:
    # the stdlib encoder: OpenAI's document has integers past 64 bits (seed's bounds)
    return json.dumps(build(public_url), separators=(",", ":")).encode()


async def serve_document(request: web.Request) -> web.Response:
    served = request.app[SERVED]
    if not served:     # built on first use (about a second of CPU), off the event loop
        body = await asyncio.to_thread(_render, request.app[CONFIG].server.public_url)
        if not served:
            served.append(body)
    return web.Response(body=served[0], content_type="application/json", headers={"Cache-Control": "no-cache"})


@hookimpl
def gateway_configure(app, config):
    app[SERVED] = []


@hookimpl
def gateway_register_routes(register, config):
    register("GET", PATH, serve_document)
    register("GET", "/docs", DOCS.page)
    register("GET", "/docs/", DOCS.page)
    register("GET", "/docs/assets/{name}", DOCS.asset)
