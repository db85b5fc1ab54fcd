"""The dashboard at `/dashboard`: one static page (shipped in the package, no build step)
that signs in with an account key or the operator's admin key and does everything
through the same JSON API the tests call.

Safe by construction: the key is kept in the tab's sessionStorage and sent as an
Authorization header (no cookies, so no cross-site request can act with it); the
Content-Security-Policy allows only this page's own script, style and API; the page
cannot be framed (plugins/static_pages.py).
"""
from __future__ import annotations

from pathlib import Path

from plugins import hookimpl
from plugins.static_pages import StaticPage

DASHBOARD = StaticPage(Path(__file__).resolve().parent / "assets", "dashboard")


@hookimpl
def gateway_register_routes(register, config):
    register("GET", "/dashboard", DASHBOARD.page)
    register("GET", "/dashboard/", DASHBOARD.page)
    register("GET", "/dashboard/assets/{name}", DASHBOARD.asset)
