"""x402 pay-per-call for callers without a key (chat completions now; images and videos
use the same paywall), on payment chains configured as plugins under `payments.x402`.

The price of a call is its quote: the same reserve a keyed call would hold. It is paid
in full when the call succeeds (settled after the work); a call that fails is not
settled, so nothing moves on chain.
"""
from __future__ import annotations

import structlog
from aiohttp import web

from config import usd
from plugins import hookimpl
from plugins.appstate import HTTP, PM, STORE
from plugins.context import OK, CallContext, Hold

from .paywall import Paywall
from .settings import load_x402

PAYWALL = web.AppKey("paywall", Paywall)
log = structlog.get_logger("x402")


@hookimpl
def gateway_configure(app, config):
    types: dict[str, type] = {}
    app[PM].hook.gateway_register_payment_methods(register=lambda cls: types.setdefault(cls.type_name, cls))
    settings = load_x402(config, types)
    if settings.skipped:
        log.info("x402_placeholders_skipped", skipped=settings.skipped)
    app[PAYWALL] = Paywall(settings, config.server.public_url)


def paywall_for(ctx: CallContext) -> Paywall | None:
    fmt = ctx.format
    paywall = ctx.request.app.get(PAYWALL)
    if ctx.principal is not None or not getattr(fmt, "accepts_x402", False) or not paywall or not paywall.enabled:
        return None
    return paywall


@hookimpl
async def gateway_reserve(ctx: CallContext):
    paywall = paywall_for(ctx)
    if paywall is None:
        return None
    _, tokens_in, cap = ctx.pricer.reserve(ctx)
    amount, description = ctx.pricer.x402_price(ctx)
    app = ctx.request.app
    resource = paywall.resource(ctx.request.path, description)
    accepted = await paywall.accept(ctx.request.headers, amount, discounts=True, resource=resource,
                                    ref=ctx.call_id, store=app[STORE], http=app[HTTP])
    return Hold(kind="x402", amount_micro=amount, call_id=ctx.call_id, input_tokens=tokens_in, output_cap=cap,
                data={"accepted": accepted, "paywall": paywall})


@hookimpl
async def gateway_settle(ctx: CallContext):
    hold = ctx.hold
    if hold is None or hold.kind != "x402" or hold.settled:
        return
    hold.settled = True
    app, accepted, paywall = ctx.request.app, hold.data["accepted"], hold.data["paywall"]
    cost = ctx.pricer.charge(ctx)[1]
    if ctx.outcome != OK:
        await paywall.release(accepted, app[STORE])
        ctx.billing = ctx.pricer.billing(ctx, 0, cost, "call failed: the payment was not settled")
        return
    result = await paywall.settle(accepted, app[STORE], app[HTTP])
    ctx.response_headers.update(accepted.headers)
    asset = f"{accepted.offer.asset.symbol} on {accepted.offer.requirement['network']}"
    if result.get("success"):
        ctx.charge_micro = accepted.offer.usd_paid_micro
        note = f"paid ${usd(ctx.charge_micro):.6f} with x402 ({asset}); tx {result.get('transaction')}"
    else:
        note = f"x402 settlement failed ({result.get('errorReason')}): nothing was charged"
    ctx.billing = ctx.pricer.billing(ctx, ctx.charge_micro, cost, note)
