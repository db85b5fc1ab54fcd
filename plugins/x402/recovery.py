"""Finishing the x402 payments of calls whose process died.

A call's payment is claimed (with what settling it needs) before the upstream request,
and marked as owed, with the amount, just before it is settled. Its owner renews a lease
on it while the call runs, as for holds. When a lease expires, another process (or this
one after a restart) adopts the payment and finishes it as the record says: a call that
had not been priced settles nothing; a priced one is settled for what it owed, if the
authorization is still valid. Adopting is one conditional update, so exactly one process
finishes each payment. A call's payment is finished together with the call's usage row
(outcome `crashed`, charged what was settled, else nothing), in one transaction. A credit
purchase (its order recorded with the claim) that was being settled is settled again:
success, or the facilitator saying this authorization was already used (our settle went
through before the crash), credits the order in the transaction that marks the payment
settled, once. A render the call was waiting on is recorded on its payment row and
cancelled upstream by the same sweep that cancels the renders of keyed calls
(plugins/media/renders.py).
"""
from __future__ import annotations

import asyncio
import time

import orjson
import structlog

from plugins.storage import UnfinishedPayment

log = structlog.get_logger("x402")
SETTLE_MARGIN = 6            # seconds an authorization must still be valid to be settled
STOPPED = "the gateway process serving this call stopped"    # how a crashed usage row's note begins


async def finish_unfinished(storage, paywall, http) -> int:
    """Finish every payment whose owner died; -> how many this process finished."""
    done = 0
    for payment in await storage.payments.unfinished():
        if await storage.payments.adopt(payment.claim_key):
            await _finish(storage, paywall, http, payment)
            done += 1
    return done


async def _finish(storage, paywall, http, p: UnfinishedPayment) -> None:
    nothing = 0 if p.scheme == "upto" else None
    data = orjson.loads(p.settle_with)
    purchase = bool(data.get("purchase"))
    if p.due is None:
        await _end(storage, p, "unused", None, "crashed_before_priced", amount=nothing, usd_micro=nothing,
                   purchase=purchase, note=f"{STOPPED} before it was priced: its x402 payment was released "
                                           "unsettled, nothing was charged")
        log.warning("x402_payment_released_after_crash", call=p.ref)
        return
    if p.deadline < time.time() + SETTLE_MARGIN:
        await _end(storage, p, "settle_failed", None, "authorization_expired", purchase=purchase,
                   note=f"{STOPPED} before its x402 payment was settled, and the authorization expired before "
                        "it could be settled: nothing was charged")
        log.error("x402_payment_expired_before_settlement", call=p.ref, due=p.due)
        return
    amount = int(p.due) if p.scheme == "upto" else None
    result = await paywall.settle_owed(data["version"], data["payload"], data["requirement"], amount, http)
    ok = bool(result.get("success"))
    if purchase and (ok or settled_before(result)):
        await _credit_purchase(storage, data["purchase"], p, result, ok)
        return
    outcome = (f"was settled afterwards for what the call owed; tx {result.get('transaction')}" if ok else
               f"failed to settle afterwards ({result.get('errorReason')}): nothing was charged")
    await _end(storage, p, "settled" if ok else "settle_failed", result.get("transaction"), result.get("errorReason"),
               amount=amount, purchase=purchase, note=f"{STOPPED} before answering; its x402 payment {outcome}")
    log.warning("x402_payment_finished_after_crash", call=p.ref, settled=ok, due=p.due,
                reason=result.get("errorReason"))


async def _end(storage, p: UnfinishedPayment, status: str, tx: str | None, reason: str | None, *, note: str,
               purchase: bool, **amounts) -> None:
    """Record how a payment ended: a call's together with its `crashed` usage row (one
    transaction); a credit purchase's, which is not a call, as it is."""
    if purchase:
        await storage.payments.record(p.claim_key, status, tx, reason, **amounts)
    else:
        await storage.payments.finish_crashed(p.claim_key, status, tx, reason, note=note, **amounts)


def settled_before(result: dict) -> bool:
    """The facilitator refuses to settle because this very authorization was already used:
    the transfer to us happened (our own settle went through before the crash)."""
    reason = str(result.get("errorReason") or "")
    return "nonce" in reason and "used" in reason


async def _credit_purchase(storage, order: dict, p: UnfinishedPayment, result: dict, settled_now: bool) -> None:
    from plugins.credits import credit_purchase
    await storage.ledger.purchase(credit_purchase(order, p.claim_key, result.get("transaction") or None))
    log.warning("credit_purchase_finished_after_crash", order=order["order_id"], account=order["account_id"],
                usd_micro=order["usd_micro"], settled_now=settled_now)


async def keep_finishing(storage, paywall, http) -> None:
    """Run until cancelled: look for payments of dead processes every third of a lease."""
    interval = max(storage.lease_seconds / 3, 0.2)
    while True:
        await asyncio.sleep(interval)
        try:
            await finish_unfinished(storage, paywall, http)
        except Exception as exc:          # the database or facilitator briefly away: try next round
            log.error("x402_recovery_round_failed", error=repr(exc))
