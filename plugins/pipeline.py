"""The stages every paid endpoint shares, awaited in order: authenticate, admit,
moderate, route, reserve; and `finish`, which settles and records a call exactly once in
a tracked task that survives a cancelled handler. Chat (gateway.py) and media endpoints
both run their calls through here."""
from __future__ import annotations

import asyncio
import contextlib
import time

import structlog

from . import acall_all, acall_first
from .appstate import PM, spawn
from .context import OK, CallContext
from .errors import GatewayError, bad_request

log = structlog.get_logger("gateway")


async def run_stages(ctx: CallContext) -> None:
    """Everything before the upstream call; raises GatewayError to refuse."""
    hook = ctx.request.app[PM].hook
    ctx.principal = await acall_first(hook.gateway_authenticate, ctx=ctx)
    await acall_all(hook.gateway_admit, ctx=ctx)
    await acall_all(hook.gateway_moderate, ctx=ctx)
    ctx.route = await acall_first(hook.gateway_select_route, ctx=ctx)
    if ctx.route is None:
        raise bad_request(f"model {ctx.model_id!r} is not served here", param="model")
    ctx.hold = await acall_first(hook.gateway_reserve, ctx=ctx)
    if ctx.hold is None:
        raise GatewayError(402, "this call cannot be paid for: send an API key")


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
    task = ctx.state.get("finish")
    if task is None:
        task = ctx.state["finish"] = spawn(ctx.request.app, _settle_and_record(ctx))
    await asyncio.shield(task)


async def _settle_and_record(ctx: CallContext) -> None:
    hook = ctx.request.app[PM].hook
    try:
        await acall_all(hook.gateway_settle, ctx=ctx)
    finally:
        await acall_all(hook.gateway_record_usage, ctx=ctx)
        log.info("call", endpoint=ctx.endpoint, model=ctx.route.model.id if ctx.route else None,
                 outcome=ctx.outcome, status=ctx.status, usd_micro=ctx.charge_micro,
                 ms=round((time.monotonic() - ctx.started) * 1000, 1))
