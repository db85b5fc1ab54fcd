"""Prepaid credits: reserve before the upstream call, settle after it.

Reserve = estimated input tokens + max_tokens at the model's service rates, as one
atomic conditional debit (402 when the balance is short). Settle charges the billed
tokens (input as estimated, output as reported or, if the stream was cut, as relayed),
never more than the hold, and refunds the rest exactly once. Failed calls are free.
"""
from __future__ import annotations

from config import usd

import asyncio

from . import allowance, hookimpl, ledger, usage
from .appstate import STORE, spawn
from .context import CLIENT_GONE, OK, CallContext, Hold
from .errors import GatewayError
from .pricing import billed_output


@hookimpl
async def gateway_reserve(ctx: CallContext):
    if ctx.principal is None:
        return None
    amount, tokens_in, cap = ctx.pricer.reserve(ctx)
    store = ctx.request.app[STORE]
    free = allowance.ask(ctx, tokens_in, cap)
    pending = asyncio.ensure_future(ledger.reserve(store, ctx.principal.account_id, amount, ctx.call_id, free))
    try:
        taken = await asyncio.shield(pending)
    except asyncio.CancelledError:      # the client left while the hold was being made: undo it
        spawn(ctx.request.app, _undo(pending, store, ctx.call_id))
        raise
    if taken is None:
        have = await ledger.balance(store, ctx.principal.account_id)
        raise GatewayError(402, f"balance ${usd(have):.6f} does not cover {ctx.pricer.shortfall(ctx, amount)}; "
                                "lower the request or add credits", code="insufficient_credits")
    return Hold(kind="credits", amount_micro=amount, call_id=ctx.call_id, input_tokens=tokens_in, output_cap=cap,
                data={"free": taken})


async def _undo(pending: asyncio.Future, store, call_id: str) -> None:
    if await pending is not None:
        await ledger.settle(store, call_id, 0)


def charge_for(ctx: CallContext) -> tuple[int, int]:
    """-> (charge, usage cost) for the call as it ended. Failed calls cost nothing."""
    if ctx.outcome not in (OK, CLIENT_GONE):
        return 0, 0
    return ctx.pricer.charge(ctx)


def pricing_output(ctx: CallContext) -> int:
    """Output tokens billed (chat), or 0 for media (whose pricer knows its own free part)."""
    if ctx.chat is None:
        return 0
    return billed_output(ctx)


@hookimpl
async def gateway_settle(ctx: CallContext):
    hold = ctx.hold
    if hold is None or hold.kind != "credits" or hold.settled:
        return
    charge, cost = charge_for(ctx)
    eligible = allowance.eligible(ctx, hold.input_tokens, pricing_output(ctx)) if hold.data.get("free") else 0

    def bill(conn, charged: int, free_use: int) -> None:
        """On the store's thread, inside the settle: the billing block and the usage row."""
        ctx.charge_micro = charged
        note = "charged from prepaid credits" if ctx.outcome != CLIENT_GONE else \
            "client disconnected: charged for the output relayed"
        if free_use:
            note = ("free: covered by the daily allowance" if charged == 0 else
                    f"partly free: ${usd(free_use):.6f} from the daily allowance, the rest from credits")
        if ctx.outcome not in (OK, CLIENT_GONE):
            note = "call failed: not charged"
        ctx.billing = ctx.pricer.billing(ctx, charged, cost, note)
        usage.write(conn, ctx)

    await ledger.settle(ctx.request.app[STORE], hold.call_id, charge, eligible, bill)
    hold.settled = True


@hookimpl(trylast=True)
async def gateway_startup(app):
    released = await ledger.release_open_holds(app[STORE])
    if released:
        import structlog
        structlog.get_logger("billing").warning("released_stale_holds", count=released)
