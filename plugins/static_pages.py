"""Static pages shipped in the package (the dashboard, the API docs): an index page and its
assets, read once at import, served with a strict Content-Security-Policy (only the page's
own script, style and API; nothing from elsewhere) and never framed."""
from __future__ import annotations

from pathlib import Path

from aiohttp import web

from plugins.errors import GatewayError

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


class StaticPage:
    """`index.html` and the other files of one assets folder; `name` says whose in a 404."""

    def __init__(self, folder: Path, name: str):
        self.name = name
        self.files = {p.name: (p.read_bytes(), TYPES[p.suffix]) for p in folder.iterdir() if p.suffix in TYPES}

    def _answer(self, filename: str) -> web.Response:
        body, content_type = self.files[filename]
        return web.Response(body=body, headers={**HEADERS, "Content-Type": content_type})

    async def page(self, request: web.Request) -> web.Response:
        return self._answer("index.html")

    async def asset(self, request: web.Request) -> web.Response:
        filename = request.match_info["name"]
        if filename not in self.files or filename == "index.html":
            raise GatewayError(404, f"no {self.name} asset {filename!r}", code="not_found")
        return self._answer(filename)
