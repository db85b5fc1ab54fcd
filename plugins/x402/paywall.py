"""Taking an x402 payment: challenge, match, verify, claim, settle.

Order matters. Before any work: decode the payment, match it to an offer for exactly
this price, check it locally (payee, amount, time window, signature), ask the
facilitator to verify, then claim its one-time key in the store (a unique insert), so
the same payment can never pay twice, even when sent twice at once. The facilitator
settles only after the work succeeded; a failed call leaves the payment unsettled.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import structlog

from plugins.errors import GatewayError
from plugins.storage import PaymentClaim, Storage

from .chains import PaymentRefused
from .settings import X402Settings
from .wire import Offer, Payment, challenge, read_payment, settlement_header

log = structlog.get_logger("x402")

@dataclass
class Accepted:
    payment: Payment
    offer: Offer
    payer: str
    claim_key: str
    resource: dict[str, str]
    settled: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)


class Paywall:
    def __init__(self, settings: X402Settings, public_url: str):
        self.settings = settings
        self.public_url = public_url

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    def offers(self, usd_micro: int, *, discounts: bool) -> list[Offer]:
        return [o for chain in self.settings.chains
                for o in chain.offers(usd_micro, self.settings.max_timeout_seconds, discounts=discounts)]

    def resource(self, path: str, description: str) -> dict[str, str]:
        return {"url": self.public_url + path, "description": description, "mimeType": "application/json"}

    async def accept(self, headers, usd_micro: int, *, discounts: bool, resource: dict[str, str], ref: str,
                     store: Storage, http: aiohttp.ClientSession) -> Accepted:
        offers = self.offers(usd_micro, discounts=discounts)
        payment = read_payment(headers)
        if payment is None:
            raise challenge(offers, resource, f"payment required: {resource['description']}; pay one of accepts "
                                              f"and send it in {'PAYMENT-SIGNATURE'} (v2) or X-PAYMENT (v1)")
        try:
            offer, payer, key = self._match(payment, offers)
        except PaymentRefused as refused:
            raise self._refusal(offers, resource, refused.reason, str(refused)) from None
        if await store.payments.is_claimed(key):
            raise self._refusal(offers, resource, "payment_already_used", "this payment was already used; sign a new one")
        verdict = await self._facilitate("verify", payment, offer, resource, http)
        if not verdict.get("isValid"):
            reason = verdict.get("invalidReason") or "invalid_payment"
            raise self._refusal(offers, resource, reason, f"the facilitator refused the payment ({reason})")
        accepted = Accepted(payment, offer, payer or str(verdict.get("payer") or ""), key, resource)
        r = offer.requirement
        if not await store.payments.claim(PaymentClaim(key, r["network"], r["asset"], accepted.payer, r["amount"],
                                                       offer.usd_paid_micro, ref)):
            raise self._refusal(offers, resource, "payment_already_used",
                                "this payment was already used; sign a new one")
        return accepted

    def _match(self, payment: Payment, offers: list[Offer]) -> tuple[Offer, str, str]:
        if payment.scheme != "exact":
            raise PaymentRefused("unsupported_scheme", f"scheme {payment.scheme!r} is not accepted; use exact")
        if payment.version == 2:
            a = payment.accepted
            for offer in offers:
                r = offer.requirement
                if (a.get("network"), str(a.get("amount")), str(a.get("asset", "")).lower(),
                        str(a.get("payTo", "")).lower()) == (r["network"], r["amount"], r["asset"].lower(),
                                                             r["payTo"].lower()):
                    return (offer, *offer.chain.check(payment, offer))
            raise PaymentRefused("invalid_exact_payment_requirements",
                                 "the payment does not match any way to pay this price (amount, asset, payee)")
        # v1 names no asset: the offer whose signature checks out is the one being paid.
        candidates = [o for o in offers if o.requirement["network"] == payment.network]
        if not candidates:
            raise PaymentRefused("invalid_network", f"network {payment.network!r} is not accepted")
        first: PaymentRefused | None = None
        for offer in candidates:
            try:
                return (offer, *offer.chain.check(payment, offer))
            except PaymentRefused as refused:
                first = first or refused
        raise first

    def _refusal(self, offers, resource, reason: str, message: str) -> GatewayError:
        err = challenge(offers, resource, f"payment refused: {message}")
        err.code = reason
        return err

    async def _facilitate(self, action: str, payment: Payment, offer: Offer, resource: dict[str, str],
                          http: aiohttp.ClientSession) -> dict[str, Any]:
        requirement = offer.requirement if payment.version == 2 else offer.v1(resource)
        body = {"x402Version": payment.version, "paymentPayload": payment.payload,
                "paymentRequirements": requirement}
        url = f"{self.settings.facilitator_url}/{action}"
        try:
            async with http.post(url, data=orjson.dumps(body), headers={"Content-Type": "application/json",
                                                                        **self.settings.facilitator_headers},
                                 timeout=aiohttp.ClientTimeout(total=self.settings.facilitator_timeout)) as resp:
                raw = await resp.read()
                if resp.status >= 500:
                    raise GatewayError(503, f"the payment facilitator failed (HTTP {resp.status}); try again",
                                       code="facilitator_unavailable")
                return orjson.loads(raw)
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
            raise GatewayError(503, "the payment facilitator could not be reached; try again",
                               code="facilitator_unavailable") from None

    async def settle(self, accepted: Accepted, store: Storage, http: aiohttp.ClientSession) -> dict[str, Any]:
        """Settle once the work is done. Returns the settlement (success or not); a failure
        is logged and recorded, never raised."""
        try:
            result = await self._facilitate("settle", accepted.payment, accepted.offer, accepted.resource, http)
        except GatewayError as err:
            result = {"success": False, "errorReason": "facilitator_unavailable", "errorMessage": err.message}
        result.setdefault("network", accepted.offer.requirement["network"])
        result.setdefault("payer", accepted.payer)
        ok = bool(result.get("success"))
        await store.payments.record(accepted.claim_key, "settled" if ok else "settle_failed",
                                    result.get("transaction"), result.get("errorReason"))
        if not ok:
            log.warning("x402_settle_failed", claim=accepted.claim_key, reason=result.get("errorReason"))
        accepted.settled = result
        accepted.headers = settlement_header(accepted.payment, {k: result.get(k) for k in (
            "success", "transaction", "network", "payer", "errorReason") if result.get(k) is not None})
        return result

    async def release(self, accepted: Accepted, store: Storage) -> None:
        """The work failed: the payment stays unsettled (and unusable again)."""
        await store.payments.record(accepted.claim_key, "unused", None, "work_failed")


def new_ref(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"
