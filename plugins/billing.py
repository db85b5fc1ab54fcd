"""Prepaid credits: reserve before the upstream call, settle after it.

Reserve = estimated input tokens + max_tokens at the model's service rates, as one
atomic conditional debit (402 when the balance is short). Settle charges the billed
tokens (input as estimated, output as reported or, if the stream was cut, as relayed),
never more than the hold, and refunds the rest exactly once. Failed calls are free.
"""
from __future__ import annotations

from config import usd

from . import hookimpl, ledger
from .appstate import STORE
from .context import CLIENT_GONE, OK, CallContext, Hold
from .errors import GatewayError


@hookimpl
async def gateway_reserve(ctx: CallContext):
    if ctx.principal is None:
        return None
    amount, tokens_in, cap = ctx.pricer.reserve(ctx)
    store = ctx.request.app[STORE]
    if not await ledger.reserve(store, ctx.principal.account_id, amount, ctx.call_id):
        have = await ledger.balance(store, ctx.principal.account_id)
        raise GatewayError(402, f"balance ${usd(have):.6f} does not cover {ctx.pricer.shortfall(ctx, amount)}; "
                                "lower the request or add credits", code="insufficient_credits")
    return Hold(kind="credits", amount_micro=amount, call_id=ctx.call_id, input_tokens=tokens_in, output_cap=cap)


def charge_for(ctx: CallContext) -> tuple[int, int]:
    """-> (charge, usage cost) for the call as it ended. Failed calls cost nothing."""
    if ctx.outcome not in (OK, CLIENT_GONE):
        return 0, 0
    return ctx.pricer.charge(ctx)


@hookimpl
async def gateway_settle(ctx: CallContext):
    hold = ctx.hold
    if hold is None or hold.kind != "credits" or hold.settled:
        return
    charge, cost = charge_for(ctx)
    charged = await ledger.settle(ctx.request.app[STORE], hold.call_id, charge)
    hold.settled = True
    ctx.charge_micro = charged if charged is not None else 0
    note = "charged from prepaid credits" if ctx.outcome != CLIENT_GONE else \
        "client disconnected: charged for the output relayed"
    if ctx.outcome not in (OK, CLIENT_GONE):
        note = "call failed: not charged"
    ctx.billing = ctx.pricer.billing(ctx, ctx.charge_micro, cost, note)


@hookimpl(trylast=True)
async def gateway_startup(app):
    released = await ledger.release_open_holds(app[STORE])
    if released:
        import structlog
        structlog.get_logger("billing").warning("released_stale_holds", count=released)
