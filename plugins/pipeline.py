"""The one skeleton every paid call runs through, chat and media alike:

    prepare (parse the body) -> authenticate -> admit -> moderate -> route -> reserve
    -> serve (the upstream work and the response) -> settle -> record usage

`run_call` owns the order, error rendering and settlement; an endpoint supplies only how to
prepare its call and how to serve it. `finish` settles and records a call exactly once, in
the handler's own task; a cancelled handler leaves the rest of it to a tracked task.

The call id is the request id the client sees (`X-Request-Id`), the id in the per-call log
line and the usage row's id. Each stage runs inside a span of the app's `SPANS` (nothing
unless tracing is on, see plugins/tracing)."""
from __future__ import annotations

import asyncio
import time
import types
from functools import partial

import structlog

from typing import Any, Awaitable, Callable

from aiohttp import web

from . import acall_all, around, each_for, first_for, logs
from .appstate import NO_SPANS, PM, REQUEST_ID, SPANS, spawn, utc_today
from .context import OK, CallContext
from .errors import GatewayError, bad_request, model_not_available, model_retired
from .formats.base import ClientFormat, read_json

log = structlog.get_logger("gateway")

Prepare = Callable[[CallContext, Any], None]
Serve = Callable[[CallContext], Awaitable[web.StreamResponse]]


async def run_call(request: web.Request, fmt: ClientFormat, prepare: Prepare, serve: Serve) -> web.StreamResponse:
    """Run one call: `prepare(ctx, body)` fills the call from the request body, then the
    stages run, then `serve(ctx)` does the upstream work and answers. Any refusal or
    failure becomes the format's own error shape; settlement happens exactly once."""
    app = request.app
    ctx = CallContext(request, fmt, request[REQUEST_ID], app)     # positional: no keyword dict per call
    spans = app[SPANS]
    try:
        with spans.stage("parse"):
            prepare(ctx, await read_json(request))
        async with around(app[PM], ctx):
            await run_stages(ctx, spans)
            with spans.call(ctx):
                # The upstream stage: a GatewayError is recorded on the call, and the call is
                # settled exactly once however it ends (success, failure, or a client that left).
                ctx.upstream_started = time.monotonic()
                try:
                    return await serve(ctx)
                except GatewayError as err:
                    ctx.status = err.status
                    ctx.note_error(err)
                    raise
                finally:
                    await finish(ctx)
    except GatewayError as err:
        if ctx.finish_task is None:       # refused before the upstream stage: no settlement, no usage row
            logs.info_line(log, "call_refused", {"status": err.status, "code": err.code, "endpoint": fmt.endpoint})
            await acall_all(app[PM].hook.gateway_call_refused, ctx=ctx, error=err)
        return fmt.error_response(err, ctx.call_id)


async def run_stages(ctx: CallContext, spans) -> None:
    """Everything before the upstream call; raises GatewayError to refuse."""
    hook = ctx.app[PM].hook
    with spans.stage("authenticate"):
        ctx.principal = await first_for(hook.gateway_authenticate, ctx)
    with spans.stage("admit"):
        await each_for(hook.gateway_admit, ctx)
    with spans.stage("moderate"):
        await each_for(hook.gateway_moderate, ctx)
    with spans.stage("route"):
        ctx.route = await first_for(hook.gateway_select_route, ctx)
        if ctx.route is None:
            raise bad_request(f"model {ctx.model_id!r} is not served here", param="model")
        check_servable(ctx)
    with spans.stage("reserve"):
        ctx.hold = await first_for(hook.gateway_reserve, ctx)
        if ctx.hold is None:
            raise GatewayError(402, "this call cannot be paid for: send an API key")


def check_servable(ctx: CallContext) -> None:
    """The resolved model can answer today, checked here once for every format, chat and
    media alike, before any hold or upstream call: not retired (410 naming the replacement:
    first, since setting a key would not help), and its provider has what it needs (400
    naming what the operator must set)."""
    model, provider = ctx.route.model, ctx.route.provider
    if model.lifecycle.retires is not None and model.lifecycle.retired(utc_today(ctx.app)):
        raise model_retired(model.id, model.lifecycle)
    reason = provider.unavailable_reason()
    if reason:
        raise model_not_available(model.id, reason)


async def succeeded(ctx: CallContext) -> None:
    """The work is done: settle now, so the response can carry its billing."""
    ctx.outcome, ctx.status = OK, 200
    await finish(ctx)


async def finish(ctx: CallContext) -> None:
    """Settle and record once. The settlement runs inside the calling task, without a task of
    its own, and survives that task's cancellation: it then goes on in a tracked task (see
    `_carry`). A later call gives the same outcome again (waits for it, or raises its error)."""
    done = ctx.finish_task
    if done is None:
        if ctx.upstream_started:
            ctx.upstream_seconds = time.monotonic() - ctx.upstream_started
        if ctx.app[SPANS] is not NO_SPANS:
            # Traces on: the settle span is entered and left in one task's context, so it keeps its own task.
            ctx.finish_task = spawn(ctx.app, _settle_and_record(ctx))
            await asyncio.shield(ctx.finish_task)
            return
        ctx.finish_task = _SETTLING
        try:
            await _carry(ctx, _settle_and_record(ctx))
        except BaseException as exc:
            if ctx.finish_task is _SETTLING:    # else a cancelled caller: the settlement goes on in that task
                ctx.finish_task = _Settled(exc)
            raise
        ctx.finish_task = _SETTLED
    elif done.__class__ is _Settled:
        if done.error is not None:
            raise done.error
    else:                               # a task (traces on, or the settlement outlived a cancelled caller)
        await asyncio.shield(done)


class _Settled:
    """How a settlement run inside its caller ended (`error`: what it raised): what a later
    `finish` of the same call gives again."""
    __slots__ = ("error",)

    def __init__(self, error: BaseException | None = None):
        self.error = error


_SETTLED = _Settled()
_SETTLING = _Settled(RuntimeError("finish was called again while its settlement was running"))


@types.coroutine
def _carry(ctx: CallContext, coro):
    """Step the settlement `coro` inside the calling task, as a task would step it. The caller
    waits on a future of its own that follows each one the settlement waits on, so a cancelled
    caller cancels only that future: the settlement goes on from where it is in a tracked task
    (`ctx.finish_task`, drained at shutdown), and the caller gets its CancelledError at once,
    as it would through `asyncio.shield`."""
    try:
        waiting = coro.send(None)
        while True:
            try:
                if waiting is None:     # a bare yield (asyncio.sleep(0)): the loop's next turn
                    yield
                else:
                    follower = waiting.get_loop().create_future()
                    waiting.add_done_callback(partial(_follow, follower))
                    yield from follower
            except asyncio.CancelledError:
                ctx.finish_task = spawn(ctx.app, _rest(coro, waiting))
                raise
            waiting = coro.send(None)
    except StopIteration as stop:
        return stop.value


def _follow(follower: asyncio.Future, _) -> None:
    if not follower.done():             # not cancelled with its caller
        follower.set_result(None)


async def _rest(coro, waiting):
    return await _forward(coro, waiting)


@types.coroutine
def _forward(coro, waiting):
    """What a task does with a coroutine, from where `_carry` left it: wait, then step it,
    until it returns (a cancellation of this task goes into the coroutine, as a task's would)."""
    while True:
        try:
            yield waiting
        except BaseException as exc:
            try:
                waiting = coro.throw(exc)
            except StopIteration as stop:
                return stop.value
            continue
        try:
            waiting = coro.send(None)
        except StopIteration as stop:
            return stop.value


async def _settle_and_record(ctx: CallContext) -> None:
    hook = ctx.app[PM].hook
    with ctx.app[SPANS].stage("settle"):
        try:
            await each_for(hook.gateway_settle, ctx)
        finally:
            await each_for(hook.gateway_record_usage, ctx)
            log_call(ctx)


def log_call(ctx: CallContext) -> None:
    """The one line per call an operator reads: who, what was asked and served, tokens,
    money and time. `request_id` (bound per request) is the usage row's call id."""
    p, route, billing = ctx.principal, ctx.route, ctx.billing
    logs.info_line(log, "call", {
        "endpoint": ctx.endpoint, "account_id": p.account_id if p else None,
        "key_prefix": p.key_prefix if p else None, "requested_model": ctx.model_id[:200],
        "model": route.model.id if route else None, "provider": route.provider.name if route else None,
        "outcome": ctx.outcome, "status": ctx.status, "payment": ctx.hold.kind if ctx.hold else None,
        "input_tokens": billing.get("input_tokens_billed"), "output_tokens": billing.get("output_tokens_billed"),
        "usd_micro": ctx.charge_micro, "free_usd_micro": ctx.free_micro,
        "upstream_ms": round(ctx.upstream_seconds * 1000, 1),
        "first_token_ms": round(ctx.first_token_seconds * 1000, 1) if ctx.first_token_seconds else None,
        "ms": round((time.monotonic() - ctx.started) * 1000, 1), "error": ctx.error})
