"""`plugins.pipeline.finish`: a call settles exactly once, inside its handler's task, and a
handler cancelled at any point of the settlement leaves it to finish in a tracked task
(drained at shutdown), while the handler sees its cancellation at once."""
import asyncio

import pluggy
import pytest
from aiohttp import web

from plugins import hookspecs
from plugins.appstate import BACKGROUND, NO_SPANS, PM, SPANS
from plugins.context import CallContext
from plugins.pipeline import finish

hookimpl = pluggy.HookimplMarker("gateway")


class Format:
    endpoint = "chat.completions"


class Settler:
    """A settlement that waits where it is told to: on a future the test resolves, on a bare
    yield, or not at all; and records what ran."""

    def __init__(self, wait=None, fail=None):
        self.wait, self.fail = wait, fail
        self.gate: asyncio.Future | None = None
        self.events: list[str] = []

    @hookimpl
    async def gateway_settle(self, ctx):
        self.events.append("settle")
        if self.wait == "future":
            self.gate = asyncio.get_running_loop().create_future()
            try:
                self.events.append(f"got {await self.gate}")
            except asyncio.CancelledError:
                self.events.append("settle cancelled")
                raise
        elif self.wait == "yield":
            await asyncio.sleep(0)
            self.events.append("after yield")
        if self.fail:
            raise self.fail

    @hookimpl
    async def gateway_record_usage(self, ctx):
        self.events.append("record")


def call(settler: Settler) -> CallContext:
    pm = pluggy.PluginManager("gateway")
    pm.add_hookspecs(hookspecs)
    pm.register(settler, "settler")
    app = web.Application()
    app[PM], app[BACKGROUND], app[SPANS] = pm, set(), NO_SPANS
    return CallContext(None, Format(), "call-1", app)


async def test_a_settlement_runs_once_in_the_callers_task():
    settler = Settler(wait="future")
    ctx = call(settler)
    first = asyncio.create_task(finish(ctx))
    await asyncio.sleep(0)
    settler.gate.set_result("ok")
    await first
    await finish(ctx)                                   # again: nothing runs twice
    assert settler.events == ["settle", "got ok", "record"]
    assert not ctx.app[BACKGROUND]                      # no task of its own


@pytest.mark.parametrize("wait", [None, "yield"])
async def test_a_settlement_without_a_future_to_wait_on(wait):
    settler = Settler(wait=wait)
    ctx = call(settler)
    await finish(ctx)
    await finish(ctx)
    assert settler.events == ["settle", *(["after yield"] if wait else []), "record"]


async def cancel_caller(ctx: CallContext, meanwhile=None) -> None:
    """Run `finish` in a handler task, let it reach the settlement's first wait, run
    `meanwhile()` if given, cancel the handler and see it raise CancelledError at once."""
    handler = asyncio.create_task(finish(ctx))
    await asyncio.sleep(0)
    if meanwhile is not None:
        meanwhile()
    handler.cancel()
    with pytest.raises(asyncio.CancelledError):
        await handler


async def test_a_cancelled_caller_leaves_the_settlement_to_a_tracked_task():
    settler = Settler(wait="future")
    ctx = call(settler)
    await cancel_caller(ctx)                            # at once: the settlement still waits
    assert settler.events == ["settle"]
    task = ctx.finish_task
    assert task in ctx.app[BACKGROUND] and not task.done()
    settler.gate.set_result("late")                     # the gate is not cancelled with the caller
    again = asyncio.create_task(finish(ctx))            # a later finish waits for that task
    await asyncio.wait_for(asyncio.shield(task), 1)
    await again
    assert settler.events == ["settle", "got late", "record"]
    assert not ctx.app[BACKGROUND]


async def test_a_caller_cancelled_once_its_wait_is_over_hands_over_the_rest():
    settler = Settler(wait="future")
    ctx = call(settler)
    # the caller's follower is resolved, but the caller has not run yet when it is cancelled
    await cancel_caller(ctx, lambda: settler.gate.set_result("ok"))
    await asyncio.wait_for(asyncio.shield(ctx.finish_task), 1)
    assert settler.events == ["settle", "got ok", "record"]


async def test_a_caller_cancelled_at_a_bare_yield_hands_over_the_rest():
    settler = Settler(wait="yield")
    ctx = call(settler)
    await cancel_caller(ctx)                            # the handler is at the settlement's yield
    await asyncio.wait_for(asyncio.shield(ctx.finish_task), 1)
    assert settler.events == ["settle", "after yield", "record"]


async def test_the_handed_over_settlement_is_cancelled_like_a_task():
    settler = Settler(wait="future")
    ctx = call(settler)
    await cancel_caller(ctx)
    ctx.finish_task.cancel()                            # e.g. a loop torn down: into the settlement
    with pytest.raises(asyncio.CancelledError):
        await ctx.finish_task
    assert settler.events == ["settle", "settle cancelled", "record"]
    assert settler.gate.cancelled()


async def test_a_failed_settlement_raises_again_on_a_later_finish():
    settler = Settler(wait="future", fail=ValueError("store down"))
    ctx = call(settler)
    first = asyncio.create_task(finish(ctx))
    await asyncio.sleep(0)
    settler.gate.set_result("ok")
    with pytest.raises(ValueError, match="store down"):
        await first
    with pytest.raises(ValueError, match="store down"):
        await finish(ctx)
    assert settler.events == ["settle", "got ok", "record"]


async def test_with_traces_on_the_settlement_keeps_its_own_task():
    class Traced(type(NO_SPANS)):
        pass

    settler = Settler(wait="future")
    ctx = call(settler)
    ctx.app[SPANS] = Traced()
    first = asyncio.create_task(finish(ctx))
    while settler.gate is None:
        await asyncio.sleep(0)
    assert ctx.finish_task in ctx.app[BACKGROUND]
    settler.gate.set_result("ok")
    await first
    assert settler.events == ["settle", "got ok", "record"]


async def test_a_settlement_that_is_itself_cancelled_stays_so():
    settler = Settler(wait="future")
    ctx = call(settler)
    first = asyncio.create_task(finish(ctx))
    await asyncio.sleep(0)
    settler.gate.cancel()                               # what it waits on is cancelled, not its caller
    with pytest.raises(asyncio.CancelledError):
        await first
    with pytest.raises(asyncio.CancelledError):
        await finish(ctx)                               # again: the same outcome, nothing run twice
    assert settler.events == ["settle", "settle cancelled", "record"]
    assert not ctx.app[BACKGROUND]
