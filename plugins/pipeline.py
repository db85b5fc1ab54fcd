"""The one skeleton every paid call runs through, chat and media alike:

    prepare (parse the body) -> authenticate -> admit -> moderate -> route -> reserve
    -> serve (the upstream work and the response) -> settle -> record usage

`run_call` owns the order, error rendering and settlement; an endpoint supplies only how to
prepare its call and how to serve it. `finish` settles and records a call exactly once, in
a tracked task that survives a cancelled handler."""
from __future__ import annotations

import asyncio
import contextlib
import time

import structlog

from typing import Any, Awaitable, Callable

from aiohttp import web

from . import acall_all, acall_first, around
from .appstate import PM, REQUEST_ID, spawn, utc_today
from .context import OK, CallContext, new_id
from .errors import GatewayError, bad_request, model_not_available, model_retired
from .formats.base import ClientFormat, read_json

log = structlog.get_logger("gateway")

Prepare = Callable[[CallContext, Any], None]
Serve = Callable[[CallContext], Awaitable[web.StreamResponse]]


async def run_call(request: web.Request, fmt: ClientFormat, prepare: Prepare, serve: Serve) -> web.StreamResponse:
    """Run one call: `prepare(ctx, body)` fills the call from the request body, then the
    stages run, then `serve(ctx)` does the upstream work and answers. Any refusal or
    failure becomes the format's own error shape; settlement happens exactly once."""
    ctx = CallContext(request=request, format=fmt, call_id=new_id())
    try:
        prepare(ctx, await read_json(request))
        async with around(request.app[PM], ctx):
            await run_stages(ctx)
            async with upstream_call(ctx):
                return await serve(ctx)
    except GatewayError as err:
        log.info("call_refused", status=err.status, code=err.code, endpoint=fmt.endpoint)
        return fmt.error_response(err, request.get(REQUEST_ID))


async def run_stages(ctx: CallContext) -> None:
    """Everything before the upstream call; raises GatewayError to refuse."""
    hook = ctx.request.app[PM].hook
    ctx.principal = await acall_first(hook.gateway_authenticate, ctx=ctx)
    await acall_all(hook.gateway_admit, ctx=ctx)
    await acall_all(hook.gateway_moderate, ctx=ctx)
    ctx.route = await acall_first(hook.gateway_select_route, ctx=ctx)
    if ctx.route is None:
        raise bad_request(f"model {ctx.model_id!r} is not served here", param="model")
    check_servable(ctx)
    ctx.hold = await acall_first(hook.gateway_reserve, ctx=ctx)
    if ctx.hold is None:
        raise GatewayError(402, "this call cannot be paid for: send an API key")


def check_servable(ctx: CallContext) -> None:
    """The resolved model can answer today, checked here once for every format, chat and
    media alike, before any hold or upstream call: not retired (410 naming the replacement:
    first, since setting a key would not help), and its provider has what it needs (400
    naming what the operator must set)."""
    model, provider = ctx.route.model, ctx.route.provider
    if model.lifecycle.retired(utc_today(ctx.request.app)):
        raise model_retired(model.id, model.lifecycle)
    reason = provider.unavailable_reason()
    if reason:
        raise model_not_available(model.id, reason)


@contextlib.asynccontextmanager
async def upstream_call(ctx: CallContext):
    """Around the provider call: a GatewayError is recorded on the call, and the call is
    settled exactly once however it ends (success, failure, or a client that left)."""
    try:
        yield
    except GatewayError as err:
        ctx.status, ctx.error = err.status, err.message
        raise
    finally:
        await finish(ctx)


async def succeeded(ctx: CallContext) -> None:
    """The work is done: settle now, so the response can carry its billing."""
    ctx.outcome, ctx.status = OK, 200
    await finish(ctx)


async def finish(ctx: CallContext) -> None:
    """Settle and record once, in a tracked task that survives a cancelled handler."""
    if ctx.finish_task is None:
        ctx.finish_task = spawn(ctx.request.app, _settle_and_record(ctx))
    await asyncio.shield(ctx.finish_task)


async def _settle_and_record(ctx: CallContext) -> None:
    hook = ctx.request.app[PM].hook
    try:
        await acall_all(hook.gateway_settle, ctx=ctx)
    finally:
        await acall_all(hook.gateway_record_usage, ctx=ctx)
        log.info("call", endpoint=ctx.endpoint, model=ctx.route.model.id if ctx.route else None,
                 outcome=ctx.outcome, status=ctx.status, usd_micro=ctx.charge_micro,
                 ms=round((time.monotonic() - ctx.started) * 1000, 1))
