"""x402 pay-per-call for callers without a key (chat completions, images and videos), on
payment chains configured as plugins under `payments.x402`.

Two schemes. `exact`: the price of a call is its quote, the same reserve a keyed call
would hold, paid in full when the call succeeds. `upto`: the payer authorizes the quote
as a maximum and is charged what the call used, priced as a keyed call (times the
operator's keyless markup), which may be nothing. Either way payment is settled only
after the work; a call that fails settles nothing, so nothing moves on chain.
"""
from __future__ import annotations

import structlog
from aiohttp import web

import asyncio
from fractions import Fraction

from config import usd
from plugins import hookimpl, usage
from plugins.appstate import HTTP, PM, STORE
from plugins.context import OK, CallContext, Hold

from . import recovery, upto
from .paywall import Accepted, Paywall
from .settings import PaymentsSection, load_x402

PAYWALL = web.AppKey("paywall", Paywall)
log = structlog.get_logger("x402")


@hookimpl
def gateway_register_settings(register):
    register("payments", PaymentsSection)


@hookimpl
def gateway_configure(app, config):
    types: dict[str, type] = {}
    app[PM].hook.gateway_register_payment_methods(register=lambda cls: types.setdefault(cls.type_name, cls))
    settings = load_x402(config, types)
    if settings.skipped:
        log.info("x402_placeholders_skipped", skipped=settings.skipped)
    app[PAYWALL] = Paywall(settings, config.server.public_url)
    if settings.enabled:
        app.cleanup_ctx.append(_stop_background)


@hookimpl
async def gateway_startup(app):
    """Before serving: finish the payments of calls whose process died (and keep doing
    so), and ask the facilitator where it settles upto (offering exact only, and asking
    again in the background, if it cannot be asked)."""
    paywall = app.get(PAYWALL)
    if paywall is None or not paywall.enabled:
        return
    storage, http, loop = app[STORE], app[HTTP], asyncio.get_running_loop()
    await recovery.finish_unfinished(storage, paywall, http)
    paywall.background.append(loop.create_task(recovery.keep_finishing(storage, paywall, http)))
    if not any(c.upto for c in paywall.settings.chains):
        return

    async def ask() -> bool:
        try:
            await paywall.discover_upto(http)
            return True
        except Exception as exc:          # unreachable, bad JSON, ...: exact still works
            log.warning("x402_upto_discovery_failed", error=str(exc) or type(exc).__name__)
            return False

    async def keep_asking():
        while not await ask():
            await asyncio.sleep(30)

    if not await ask():
        paywall.background.append(loop.create_task(keep_asking()))


async def _stop_background(app: web.Application):
    yield
    for task in app[PAYWALL].background:
        task.cancel()


def paywall_for(ctx: CallContext) -> Paywall | None:
    fmt = ctx.format
    paywall = ctx.app.get(PAYWALL)
    if ctx.principal is not None or not getattr(fmt, "accepts_x402", False) or not paywall or not paywall.enabled:
        return None
    return paywall


@hookimpl
def gateway_reserve(ctx: CallContext):
    """A keyless call paid with x402: a coroutine making its hold; else None (no coroutine)."""
    paywall = paywall_for(ctx)
    if paywall is None:
        return None
    return _reserve(ctx, paywall)


async def _reserve(ctx: CallContext, paywall):
    _, tokens_in, cap = ctx.pricer.reserve(ctx)
    amount, description = ctx.pricer.x402_price(ctx)
    app = ctx.app
    resource = paywall.resource(ctx.request.path, description)
    accepted = await paywall.accept(ctx.request.headers, amount, discounts=True, resource=resource,
                                    ref=ctx.call_id, store=app[STORE], http=app[HTTP], metered=True,
                                    call=usage.labels(ctx))
    return Hold(kind="x402", amount_micro=amount, call_id=ctx.call_id, input_tokens=tokens_in, output_cap=cap,
                data={"accepted": accepted, "paywall": paywall}, jobs=app[STORE].payments)


@hookimpl
def gateway_settle(ctx: CallContext):
    """A call held by an x402 payment: a coroutine settling it; else None (no coroutine)."""
    hold = ctx.hold
    if hold is None or hold.kind != "x402" or hold.settled:
        return None
    return _settle(ctx, hold)


async def _settle(ctx: CallContext, hold: Hold):
    hold.settled = True
    app, accepted, paywall = ctx.app, hold.data["accepted"], hold.data["paywall"]
    cost = ctx.pricer.charge(ctx)[1]
    if ctx.outcome != OK:
        await paywall.release(accepted, app[STORE])
        ctx.billing = ctx.pricer.billing(ctx, 0, cost, "call failed: the payment was not settled")
        return
    if accepted.offer.scheme == upto.SCHEME:
        await _settle_used(ctx, paywall, accepted, cost)
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


def used_units(ctx: CallContext, accepted: Accepted, markup: Fraction) -> int:
    """What an upto call owes in the asset's atomic units: the keyed charge for what it
    produced, times the keyless markup, with the token's discount, never above the
    signed maximum."""
    charge = ctx.pricer.charge(ctx)[0]
    owed = min(-(-charge * markup.numerator // markup.denominator), ctx.hold.amount_micro)
    units, _ = accepted.offer.asset.atomic(owed, discounted=True) if owed else (0, 0)
    return min(units, int(accepted.offer.requirement["amount"]))


async def _settle_used(ctx: CallContext, paywall: Paywall, accepted: Accepted, cost: int) -> None:
    app, offer = ctx.app, accepted.offer
    units = used_units(ctx, accepted, paywall.settings.upto_markup)
    asset = f"{offer.asset.symbol} on {offer.requirement['network']}"
    ceiling = f"${usd(offer.usd_paid_micro):.6f}"
    if units == 0:
        await paywall.release(accepted, app[STORE], "nothing_used")
        paywall.settle_nothing(accepted)
        note = f"x402 upto ({asset}): nothing used, nothing settled (authorized up to {ceiling})"
    else:
        result = await paywall.settle(accepted, app[STORE], app[HTTP], amount=units)
        if result.get("success"):
            ctx.charge_micro = offer.asset.worth(units)
            note = (f"paid ${usd(ctx.charge_micro):.6f} of up to {ceiling} with x402 upto ({asset}); "
                    f"tx {result.get('transaction')}")
        else:
            note = f"x402 settlement failed ({result.get('errorReason')}): nothing was charged"
    ctx.response_headers.update(accepted.headers)
    ctx.billing = ctx.pricer.billing(ctx, ctx.charge_micro, cost, note)
    ctx.billing["quote_usd"] = usd(offer.usd_paid_micro)      # the signed maximum
