"""`GET /healthz` and `GET /readyz`, for load balancers and orchestrators.

- /healthz: the process is up and its event loop answers. Always 200.
- /readyz: every store the gateway needs answers (the database; Redis when configured;
  whatever a plugin registers through `gateway_register_readiness_checks`). 200 when all
  do, else 503 naming the failing part. Each check has CHECK_SECONDS; they run at once.

No key, no rate limit, no usage row, no log line per call: they are polled every few seconds.
"""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

from aiohttp import web

from . import hookimpl
from .appstate import PM, STORE
from .formats.base import json_response

Check = Callable[[web.Application], Awaitable[None]]
READINESS = web.AppKey("readiness", dict)
CHECK_SECONDS = 2.0
HEALTHY = b'{"status":"ok"}'


async def healthz(request: web.Request) -> web.Response:
    return web.Response(body=HEALTHY, content_type="application/json")


async def readyz(request: web.Request) -> web.Response:
    checks: dict[str, Check] = request.app[READINESS]
    names = list(checks)
    results = await asyncio.gather(*[_run(checks[n], request.app) for n in names])
    answers = dict(zip(names, results))
    ready = all(a == "ok" for a in answers.values())
    return json_response({"status": "ready" if ready else "unready", "checks": answers}, 200 if ready else 503)


async def _run(check: Check, app: web.Application) -> str:
    try:
        async with asyncio.timeout(CHECK_SECONDS):
            await check(app)
        return "ok"
    except TimeoutError:
        return f"error: no answer within {CHECK_SECONDS:g} s"
    except Exception as exc:            # whatever the store raised: name it, briefly
        reason = str(exc).splitlines()[0][:160] if str(exc) else ""
        return f"error: {type(exc).__name__}{': ' + reason if reason else ''}"


async def database_answers(app: web.Application) -> None:
    await app[STORE].fetchone("SELECT 1")


@hookimpl
def gateway_register_readiness_checks(app, register):
    register("database", database_answers)


@hookimpl(trylast=True)          # after every plugin's own configuration
def gateway_configure(app, config):
    checks: dict[str, Check] = {}
    app[PM].hook.gateway_register_readiness_checks(app=app, register=checks.setdefault)
    app[READINESS] = checks


@hookimpl
def gateway_register_routes(register, config):
    register("GET", "/healthz", healthz)
    register("GET", "/readyz", readyz)
