"""`POST /api/v1/account/credits/purchase {usd}`: buy credits with an x402 payment.

The first call answers 402 quoting exactly `usd` (no discount on credit purchases). The
paid retry is verified, its payment claimed together with the order (so it can never
credit twice, even sent twice at once, and a crash can be finished), settled, and then
credited, with any bonus, in the transaction that records the settlement.
"""
from __future__ import annotations

from aiohttp import web

from config import parse_usd, usd

from . import hookimpl
from .appstate import HTTP, STORE
from .auth import authenticate_request
from .errors import GatewayError, bad_request
from .formats.base import json_response, read_json
from .ratelimit import admit_request
from .storage import CreditPurchase
from .x402 import PAYWALL
from .x402.paywall import new_ref
from .x402.settings import CreditsSection, load_credits

CREDITS = web.AppKey("credit_settings", object)


@hookimpl
def gateway_register_settings(register):
    register("credits", CreditsSection)


@hookimpl
def gateway_configure(app, config):
    app[CREDITS] = load_credits(config)


def _amount(body, settings) -> int:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object {\"usd\": amount}")
    raw = body.get("usd")
    if raw is None:
        raise bad_request("usd: required, the amount of credits to buy in USD", param="usd")
    try:
        micro = parse_usd(raw)
    except ValueError as exc:
        raise bad_request(f"usd: {exc}", param="usd") from None
    if not settings.min_micro <= micro <= settings.max_micro:
        raise bad_request(f"usd: must be from {usd(settings.min_micro):g} to {usd(settings.max_micro):g}", param="usd")
    return micro


def credit_purchase(order: dict, claim_key: str, tx: str | None) -> CreditPurchase:
    """The storage record of a settled order (as recorded with its payment claim)."""
    return CreditPurchase(order["order_id"], order["account_id"], order["usd_micro"], claim_key, tx,
                          bonus_first_micro=order["bonus_first_micro"], bonus_micro=order["bonus_micro"])


async def purchase(request: web.Request) -> web.Response:
    principal = await authenticate_request(request)
    if principal is None:
        raise GatewayError(401, "send your API key (Authorization: Bearer chk_...) so the right account is "
                                "credited", code="missing_api_key")
    await admit_request(request, principal)         # the caller's rpm, as on every other call
    settings = request.app[CREDITS]
    amount = _amount(await read_json(request), settings)
    paywall = request.app.get(PAYWALL)
    if paywall is None or not paywall.enabled:
        raise GatewayError(503, "this gateway does not sell credits over x402", code="x402_disabled")
    app, order_id = request.app, new_ref("order")
    resource = paywall.resource(request.path, f"${usd(amount):.2f} of gateway credits")
    order = {"order_id": order_id, "account_id": principal.account_id, "usd_micro": amount,
             "bonus_first_micro": settings.bonus(amount, True), "bonus_micro": settings.bonus(amount, False)}
    # The claim records the order (the intent) before anything is settled; the credit and
    # the settlement's success are one transaction; a crash in between is finished at the
    # next start by settling again (x402/recovery.py).
    accepted = await paywall.accept(request.headers, amount, discounts=False, resource=resource, ref=order_id,
                                    store=app[STORE], http=app[HTTP], purchase=order)
    result = await paywall.settle(accepted, app[STORE], app[HTTP], record_success=False)
    if not result.get("success"):
        err = GatewayError(402, f"the payment did not settle ({result.get('errorReason')}); nothing was credited",
                           code="settlement_failed", headers=accepted.headers)
        raise err
    bonus, balance = await app[STORE].ledger.purchase(credit_purchase(order, accepted.claim_key,
                                                                      result.get("transaction")))
    return json_response({"order_id": order_id, "status": "confirmed", "credited_usd": usd(amount),
                          "bonus_usd": usd(bonus), "balance_usd": usd(balance), "tx": result.get("transaction")},
                         headers=accepted.headers)


@hookimpl
def gateway_register_routes(register, config):
    register("POST", "/api/v1/account/credits/purchase", purchase)
