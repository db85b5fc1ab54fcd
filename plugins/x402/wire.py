"""x402 on the wire: v1 and v2 challenges, payment headers, settlement headers.

v1 clients read a JSON body `{x402Version: 1, error, accepts[]}` and pay with `X-PAYMENT`;
v2 clients read the base64 `PAYMENT-REQUIRED` header and pay with `PAYMENT-SIGNATURE`.
Every 402 carries both, so either kind of client can pay.
"""
from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

import orjson

from plugins.errors import GatewayError

V1_HEADER, V2_HEADER = "X-PAYMENT", "PAYMENT-SIGNATURE"
V1_RESPONSE, V2_RESPONSE = "X-PAYMENT-RESPONSE", "PAYMENT-RESPONSE"
EXPOSED = "PAYMENT-REQUIRED, PAYMENT-RESPONSE, X-PAYMENT-RESPONSE"
# v1 named its networks; v2 uses CAIP-2 ids. Networks without a v1 name are v2-only.
V1_NAMES = {"eip155:8453": "base", "eip155:84532": "base-sepolia", "eip155:196": "xlayer",
            "eip155:137": "polygon", "eip155:43114": "avalanche",
            "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp": "solana",
            "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1": "solana-devnet"}


def b64json(obj: Any) -> str:
    return base64.b64encode(orjson.dumps(obj)).decode()


@dataclass(slots=True)
class Offer:
    """One way to pay: the v2 requirement, plus who built it (to verify a payment)."""
    requirement: dict[str, Any]     # v2 PaymentRequirements
    chain: Any                      # the chain plugin instance
    asset: Any                      # its asset config
    usd_paid_micro: int             # what paying this offer is worth in USD (after discount); the most, for upto

    @property
    def scheme(self) -> str:
        return self.requirement["scheme"]

    def v1(self, resource: dict[str, str]) -> dict[str, Any] | None:
        name = V1_NAMES.get(self.requirement["network"])
        if name is None or self.scheme != "exact":      # v1 knows only exact
            return None
        r = self.requirement
        return {"scheme": r["scheme"], "network": name, "maxAmountRequired": r["amount"], "asset": r["asset"],
                "payTo": r["payTo"], "resource": resource["url"], "description": resource["description"],
                "mimeType": resource["mimeType"], "outputSchema": None,
                "maxTimeoutSeconds": r["maxTimeoutSeconds"], "extra": r.get("extra") or {}}


def challenge(offers: list[Offer], resource: dict[str, str], reason: str) -> GatewayError:
    """A 402 with the requirements both ways: v1 body, v2 header."""
    v1 = [o for o in (offer.v1(resource) for offer in offers) if o]
    body = {"x402Version": 1, "error": reason, "accepts": v1}
    required = {"x402Version": 2, "error": reason, "resource": resource,
                "accepts": [o.requirement for o in offers], "extensions": {}}
    err = GatewayError(402, reason, code="payment_required",
                       headers={"PAYMENT-REQUIRED": b64json(required), "Cache-Control": "no-store",
                                "Access-Control-Expose-Headers": EXPOSED})
    err.body = body
    return err


@dataclass(slots=True)
class Payment:
    """A decoded payment header."""
    version: int
    payload: dict[str, Any]          # the whole PaymentPayload as sent
    scheme: str
    network: str                     # CAIP-2 (v1 names translated)
    accepted: dict[str, Any] | None  # v2: the requirement the client chose

    @property
    def inner(self) -> dict[str, Any]:
        return self.payload.get("payload") or {}


def read_payment(headers) -> Payment | None:
    """The payment on a request, or None. A malformed header is a 400."""
    raw, version = headers.get(V2_HEADER), 2
    if raw is None:
        raw, version = headers.get(V1_HEADER), 1
    if raw is None:
        return None
    try:
        payload = orjson.loads(base64.b64decode(raw.strip(), validate=True))
    except (binascii.Error, ValueError, orjson.JSONDecodeError):
        raise GatewayError(400, f"the {V2_HEADER if version == 2 else V1_HEADER} header is not base64 JSON",
                           code="invalid_payment") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("payload"), dict):
        raise GatewayError(400, "the payment has no payload", code="invalid_payment")
    if version == 2:
        accepted = payload.get("accepted")
        if not isinstance(accepted, dict):
            raise GatewayError(400, "a v2 payment must carry the requirement it accepted", code="invalid_payment")
        return Payment(2, payload, str(accepted.get("scheme")), str(accepted.get("network")), accepted)
    network = str(payload.get("network"))
    caip = next((k for k, v in V1_NAMES.items() if v == network), network)
    return Payment(1, payload, str(payload.get("scheme")), caip, None)


def settlement_header(payment: Payment, result: dict[str, Any]) -> dict[str, str]:
    return {V2_RESPONSE if payment.version == 2 else V1_RESPONSE: b64json(result),
            "Access-Control-Expose-Headers": EXPOSED}
