"""The dashboard at `/dashboard`: one static page (shipped in the package, no build step)
that signs in with an account key or the operator's admin key and does everything
through the same JSON API the tests call.

Safe by construction: the key is kept in the tab's sessionStorage and sent as an
Authorization header (no cookies, so no cross-site request can act with it); the
Content-Security-Policy allows only this page's own script, style and API; the page
cannot be framed.
"""
from __future__ import annotations

from pathlib import Path

from aiohttp import web

from plugins import hookimpl
from plugins.errors import GatewayError

ASSETS = Path(__file__).resolve().parent / "assets"
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8"}
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}
_FILES = {p.name: (p.read_bytes(), TYPES[p.suffix]) for p in ASSETS.iterdir() if p.suffix in TYPES}


def _answer(name: str) -> web.Response:
    body, content_type = _FILES[name]
    return web.Response(body=body, headers={**HEADERS, "Content-Type": content_type})


async def page(request: web.Request) -> web.Response:
    return _answer("index.html")


async def asset(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in _FILES or name == "index.html":
        raise GatewayError(404, f"no dashboard asset {name!r}", code="not_found")
    return _answer(name)


@hookimpl
def gateway_register_routes(register, config):
    register("GET", "/dashboard", page)
    register("GET", "/dashboard/", page)
    register("GET", "/dashboard/assets/{name}", asset)
