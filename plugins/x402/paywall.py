"""Taking an x402 payment: challenge, match, verify, claim, settle.

Order matters. Before any work: decode the payment, match it to an offer for exactly
this price, check it locally (payee, amount, time window, signature), ask the
facilitator to verify, then claim its one-time key in the store (a unique insert), so
the same payment can never pay twice, even when sent twice at once. The facilitator
settles only after the work succeeded; a failed call leaves the payment unsettled.
"""
from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import structlog

from plugins.errors import GatewayError
from plugins.metrics.instruments import X402
from plugins.storage import PaymentClaim, Storage, now

from . import upto
from .errors import PaymentRefused
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
    recoverable: bool = False        # a call's payment: recorded so another process can finish it

    @property
    def requirement(self) -> dict[str, Any]:
        """The requirement as this payment's version names it (what the facilitator gets)."""
        return self.offer.requirement if self.payment.version == 2 else self.offer.v1(self.resource)


class Paywall:
    def __init__(self, settings: X402Settings, public_url: str):
        self.settings = settings
        self.public_url = public_url
        self.upto: dict[str, str] = {}     # network -> facilitator address, for networks it settles upto on
        self.background: list[asyncio.Task] = []     # recovery, and /supported retried while the facilitator is away

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    def offers(self, usd_micro: int, *, discounts: bool, metered: bool = False) -> list[Offer]:
        """Every way to pay `usd_micro`: `exact` offers, then (for `metered` calls, which
        settle what they used) `upto` offers on networks whose facilitator settles upto."""
        s = self.settings
        out = [o for chain in s.chains for o in chain.offers(usd_micro, s.max_timeout_seconds, discounts=discounts)]
        if metered and self.upto:
            out += [o for chain in s.chains if chain.network in self.upto
                    for o in chain.upto_offers(usd_micro, s.upto_max_timeout_seconds, self.upto[chain.network])
                    if discounts or not o.asset.discount]
        return out

    async def discover_upto(self, http: aiohttp.ClientSession) -> None:
        """Learn from the facilitator's /supported where it settles upto (raises if it cannot be asked)."""
        found = await upto.discover(self.settings.facilitator_url, self.settings.facilitator_headers, http,
                                    min(10.0, self.settings.facilitator_timeout))
        self.upto = {n: a for n, a in found.items() if any(c.network == n and c.upto for c in self.settings.chains)}
        log.info("x402_upto_networks", networks=sorted(self.upto))

    def resource(self, path: str, description: str) -> dict[str, str]:
        return {"url": self.public_url + path, "description": description, "mimeType": "application/json"}

    async def accept(self, headers, usd_micro: int, *, discounts: bool, resource: dict[str, str], ref: str,
                     store: Storage, http: aiohttp.ClientSession, metered: bool = False,
                     purchase: dict[str, Any] | None = None, call: dict[str, str | None] | None = None) -> Accepted:
        """Verify and claim a payment. `metered` calls and credit `purchase`s (the order to
        credit, recorded with the claim) can be finished by another process if this one dies;
        a call's `call` labels (plugins.usage.labels) are kept for its usage row then."""
        offers = self.offers(usd_micro, discounts=discounts, metered=metered)
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
        X402["verified"].inc()
        recoverable = metered or purchase is not None
        accepted = Accepted(payment, offer, payer or str(verdict.get("payer") or ""), key, resource,
                            recoverable=recoverable)
        r = offer.requirement
        recovery = {}
        if recoverable:                  # what another process needs to finish this payment
            settle_with = {"version": payment.version, "payload": payment.payload, "requirement": accepted.requirement}
            if purchase is not None:
                settle_with["purchase"] = purchase
            recovery = {"settle_with": orjson.dumps(settle_with).decode(),
                        "deadline": self._deadline(payment, offer)}
        claim = PaymentClaim(key, r["network"], r["asset"], accepted.payer, r["amount"], offer.usd_paid_micro, ref,
                             scheme=offer.scheme, **recovery, **(call or {}))
        if not await store.payments.claim(claim):
            raise self._refusal(offers, resource, "payment_already_used",
                                "this payment was already used; sign a new one")
        return accepted

    @staticmethod
    def _deadline(payment: Payment, offer: Offer) -> int:
        """When the payment stops being settleable: its own deadline where it says one."""
        inner = payment.inner
        auth = inner.get("permit2Authorization") or inner.get("authorization") or {}
        try:
            return int(auth.get("deadline") or auth.get("validBefore"))
        except (TypeError, ValueError):
            return now() + int(offer.requirement["maxTimeoutSeconds"])

    def _match(self, payment: Payment, offers: list[Offer]) -> tuple[Offer, str, str]:
        schemes = sorted({o.scheme for o in offers if payment.version == 2 or o.scheme == "exact"})
        if payment.scheme not in schemes:
            raise PaymentRefused("unsupported_scheme",
                                 f"scheme {payment.scheme!r} is not accepted here; use {' or '.join(schemes)}")
        if payment.version == 2:
            a = payment.accepted
            for offer in offers:
                r = offer.requirement
                if (a.get("scheme"), a.get("network"), str(a.get("amount")), str(a.get("asset", "")).lower(),
                        str(a.get("payTo", "")).lower()) == (r["scheme"], r["network"], r["amount"],
                                                             r["asset"].lower(), r["payTo"].lower()):
                    return (offer, *offer.chain.check(payment, offer))
            raise PaymentRefused(f"invalid_{payment.scheme}_payment_requirements",
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
        """A payment was sent and is refused before any work."""
        X402["refused"].inc()
        err = challenge(offers, resource, f"payment refused ({reason}): {message}")
        err.code = reason
        return err

    async def _facilitate(self, action: str, payment: Payment, offer: Offer, resource: dict[str, str],
                          http: aiohttp.ClientSession) -> dict[str, Any]:
        requirement = offer.requirement if payment.version == 2 else offer.v1(resource)
        return await self.post(action, payment.version, payment.payload, requirement, http)

    async def post(self, action: str, version: int, payload: dict[str, Any], requirement: dict[str, Any],
                   http: aiohttp.ClientSession) -> dict[str, Any]:
        """One facilitator call (`verify` or `settle`); a facilitator that fails is a 503."""
        body = {"x402Version": version, "paymentPayload": payload, "paymentRequirements": requirement}
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

    async def settle_owed(self, version: int, payload: dict[str, Any], requirement: dict[str, Any],
                          amount: int | None, http: aiohttp.ClientSession) -> dict[str, Any]:
        """Settle `amount` units (upto: at settle time the requirement's amount is what is
        charged, not the maximum; exact: None, the offer's own amount). Never raises."""
        if amount is not None:
            requirement = {**requirement, "amount": str(amount)}
        try:
            result = await self.post("settle", version, payload, requirement, http)
        except GatewayError as err:
            result = {"success": False, "errorReason": "facilitator_unavailable", "errorMessage": err.message}
        X402["settled" if result.get("success") else "settle_failed"].inc()
        return result

    async def settle(self, accepted: Accepted, store: Storage, http: aiohttp.ClientSession,
                     amount: int | None = None, *, record_success: bool = True) -> dict[str, Any]:
        """Settle once the work is done: the offer's amount (exact), or `amount` units (upto,
        at most the signed maximum). A call's payment is recorded as owed first, so that if
        this process dies now another finishes it. Returns the settlement (success or not);
        a failure is logged and recorded, never raised. With `record_success=False` the
        caller records a success itself, in its own transaction (a credit purchase)."""
        offer = accepted.offer
        owed = amount if amount is not None else int(offer.requirement["amount"])
        worth = offer.asset.worth(owed) if amount is not None else offer.usd_paid_micro
        if accepted.recoverable:
            await store.payments.owe(accepted.claim_key, owed, worth)
        result = await self.settle_owed(accepted.payment.version, accepted.payment.payload, accepted.requirement,
                                        amount, http)
        ok = bool(result.get("success"))
        if ok and amount is not None:
            result.setdefault("amount", str(amount))
        if record_success or not ok:
            await store.payments.record(accepted.claim_key, "settled" if ok else "settle_failed",
                                        result.get("transaction"), result.get("errorReason"), amount=amount,
                                        usd_micro=worth if amount is not None else None)
        if not ok:
            log.warning("x402_settle_failed", claim=accepted.claim_key, reason=result.get("errorReason"))
        return self._answer(accepted, result)

    def settle_nothing(self, accepted: Accepted) -> dict[str, Any]:
        """An upto call that used nothing: no transfer at all (the authorization expires)."""
        return self._answer(accepted, {"success": True, "transaction": "", "amount": "0"})

    def _answer(self, accepted: Accepted, result: dict[str, Any]) -> dict[str, Any]:
        result.setdefault("network", accepted.offer.requirement["network"])
        result.setdefault("payer", accepted.payer)
        accepted.settled = result
        accepted.headers = settlement_header(accepted.payment, {k: result.get(k) for k in (
            "success", "transaction", "network", "payer", "amount", "errorReason") if result.get(k) is not None})
        return result

    async def release(self, accepted: Accepted, store: Storage, reason: str = "work_failed") -> None:
        """Nothing is settled: the work failed or (upto) used nothing. The payment stays
        unusable again; an upto row records that nothing was taken."""
        nothing = 0 if accepted.offer.scheme == upto.SCHEME else None
        await store.payments.record(accepted.claim_key, "unused", None, reason, amount=nothing, usd_micro=nothing)


def new_ref(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"
