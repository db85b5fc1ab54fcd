"""Prepaid credits: reserve before the upstream call, settle after it.

Reserve = estimated input tokens + max_tokens at the model's service rates, as one
atomic conditional debit (402 when the balance is short). Settle charges the billed
tokens (input as estimated, output as reported or, if the stream was cut, as relayed),
never more than the hold, and refunds the rest exactly once. Failed calls are free.
"""
from __future__ import annotations

import asyncio

from config import usd

from . import allowance, hookimpl, keypolicy, usage
from .appstate import STORE, spawn
from .context import CLIENT_GONE, OK, CallContext, Hold
from .errors import GatewayError
from .metrics.instruments import HOLDS_OPEN
from .pricing import billed_output
from .storage import HoldRequest, KeySpendLimitReached, Settlement, split_charge


@hookimpl
async def gateway_reserve(ctx: CallContext):
    if ctx.principal is None:
        return None
    amount, tokens_in, cap = ctx.pricer.reserve(ctx)
    ledger = ctx.app[STORE].ledger
    p = ctx.principal
    # Positional (fields in HoldRequest's order): a class called with keywords builds a dict per call.
    request = HoldRequest(ctx.call_id, p.account_id, amount, allowance.ask(ctx, tokens_in, cap), p.key_id,
                          p.agent_id, *usage.label_values(ctx), keypolicy.limit_for(p.policy))
    pending = asyncio.ensure_future(ledger.reserve(request))
    try:
        reserved = await asyncio.shield(pending)
    except KeySpendLimitReached as reached:
        raise keypolicy.refusal(reached) from None
    except asyncio.CancelledError:      # the client left while the hold was being made: undo it
        spawn(ctx.app, _undo(pending, ledger, ctx.call_id))
        raise
    if reserved is None:
        have = await ledger.balance(p.account_id)
        raise GatewayError(402, f"balance ${usd(have):.6f} does not cover {ctx.pricer.shortfall(ctx, amount)}; "
                                "lower the request or add credits", code="insufficient_credits")
    HOLDS_OPEN.inc()
    # kind, amount_micro, call_id, input_tokens, output_cap, settled, data
    return Hold("credits", amount, ctx.call_id, tokens_in, cap, False, {"free": reserved.free_micro, "reserved": reserved})


async def _undo(pending: asyncio.Future, ledger, call_id: str) -> None:
    if await pending is not None:
        await ledger.release(call_id)


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


def note_for(ctx: CallContext, charged: int, free_use: int) -> str:
    if ctx.outcome not in (OK, CLIENT_GONE):
        return "call failed: not charged"
    if free_use:
        return ("free: covered by the daily allowance" if charged == 0 else
                f"partly free: ${usd(free_use):.6f} from the daily allowance, the rest from credits")
    return "charged from prepaid credits" if ctx.outcome != CLIENT_GONE else \
        "client disconnected: charged for the output relayed"


@hookimpl
def gateway_settle(ctx: CallContext):
    """Price the call, split it between credits and the allowance, render its billing
    block and usage row, then apply all of it in one transaction (a coroutine; None, without
    one, for a call not held in credits)."""
    hold = ctx.hold
    if hold is None or hold.kind != "credits" or hold.settled:
        return None
    return _settle_counted(ctx, hold)


async def _settle_counted(ctx: CallContext, hold: Hold) -> None:
    try:
        await _settle(ctx, hold)
    finally:
        HOLDS_OPEN.dec()


async def _settle(ctx: CallContext, hold: Hold) -> None:
    reserved = hold.data["reserved"]
    charge, cost = charge_for(ctx)
    eligible = allowance.eligible(ctx, hold.input_tokens, pricing_output(ctx)) if reserved.free_micro else 0
    charged, free_use = split_charge(reserved, charge, eligible)
    ctx.charge_micro, ctx.free_micro = charged, free_use
    ctx.billing = ctx.pricer.billing(ctx, charged, cost, note_for(ctx, charged, free_use))
    if not await ctx.app[STORE].ledger.settle(Settlement(reserved, charged, free_use, usage.row(ctx))):
        # Released meanwhile: this process stopped renewing its lease long enough for another
        # to take it for dead. The refund (and a usage row) went out then; the call is free.
        ctx.charge_micro = ctx.free_micro = 0
        ctx.billing = ctx.pricer.billing(ctx, 0, cost, "not charged: the hold had expired before settlement")
    usage.mark_written(ctx)
    hold.settled = True
