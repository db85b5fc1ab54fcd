"""The x402 `upto` scheme (EVM): the payer signs a Permit2 authorization for a maximum, and
the gateway settles only what the call used, which may be nothing.

The authorization is a Permit2 `PermitWitnessTransferFrom` whose witness binds it to our
payee (`to`) and to one facilitator (`facilitator`), spent through the x402 upto proxy.
Everything in it is checked here before the facilitator is asked: the signer, the payee,
the facilitator, the spender, the token, the amount (exactly the offered maximum) and the
time window. The window must leave room to settle after the work: a payer who signs a
deadline too short to settle would get the work for free.
"""
from __future__ import annotations

import time
from typing import Any

import aiohttp
import orjson
import structlog

from .errors import PaymentRefused
from .wire import Payment

log = structlog.get_logger("x402")

SCHEME = "upto"
PERMIT2 = "0x000000000022D473030F116dDEE9F6B43aC78BA3"        # the same on every EVM chain (CREATE2)
UPTO_PROXY = "0x4020A4f3b7b90ccA423B9fabCc0CE57C6C240002"     # x402UptoPermit2Proxy, the only allowed spender

_TYPES = {
    "EIP712Domain": [{"name": "name", "type": "string"}, {"name": "chainId", "type": "uint256"},
                     {"name": "verifyingContract", "type": "address"}],
    "PermitWitnessTransferFrom": [{"name": "permitted", "type": "TokenPermissions"},
                                  {"name": "spender", "type": "address"}, {"name": "nonce", "type": "uint256"},
                                  {"name": "deadline", "type": "uint256"}, {"name": "witness", "type": "Witness"}],
    "TokenPermissions": [{"name": "token", "type": "address"}, {"name": "amount", "type": "uint256"}],
    "Witness": [{"name": "to", "type": "address"}, {"name": "facilitator", "type": "address"},
                {"name": "validAfter", "type": "uint256"}],
}


def permit2_signer(auth: dict[str, Any], signature: str, chain_id: int) -> str:
    """The address that signed this upto Permit2 authorization ('' if it cannot be read)."""
    from eth_account import Account                  # slow to import: only when a payment arrives
    from eth_account.messages import encode_typed_data
    try:
        permitted, witness = auth["permitted"], auth["witness"]
        typed = {"types": _TYPES, "primaryType": "PermitWitnessTransferFrom",
                 "domain": {"name": "Permit2", "chainId": chain_id, "verifyingContract": PERMIT2},
                 "message": {"permitted": {"token": permitted["token"], "amount": int(permitted["amount"])},
                             "spender": auth["spender"], "nonce": int(auth["nonce"]),
                             "deadline": int(auth["deadline"]),
                             "witness": {"to": witness["to"], "facilitator": witness["facilitator"],
                                         "validAfter": int(witness["validAfter"])}}}
        return Account.recover_message(encode_typed_data(full_message=typed), signature=signature).lower()
    except Exception:       # any malformed field or signature is simply not the payer's
        return ""


def check(payment: Payment, requirement: dict[str, Any], chain_id: int, *, min_window: int) -> tuple[str, str]:
    """-> (payer, claim key) if `payment` is a valid upto authorization for `requirement`;
    else PaymentRefused with the reason."""
    inner = payment.inner
    auth, signature = inner.get("permit2Authorization"), inner.get("signature")
    if not isinstance(auth, dict) or not isinstance(signature, str):
        raise PaymentRefused("invalid_payload", "the upto payment lacks a permit2Authorization and signature")
    try:
        permitted, witness = auth["permitted"], auth["witness"]
        payer, nonce = str(auth["from"]), int(auth["nonce"])
        amount, deadline, after = int(permitted["amount"]), int(auth["deadline"]), int(witness["validAfter"])
        token, to, facilitator = str(permitted["token"]), str(witness["to"]), str(witness["facilitator"])
    except (KeyError, TypeError, ValueError):
        raise PaymentRefused("invalid_payload", "the permit2 authorization is incomplete") from None
    extra = requirement.get("extra") or {}
    if to.lower() != requirement["payTo"].lower():
        raise PaymentRefused("invalid_permit2_recipient_mismatch", "the authorization does not pay this gateway")
    if facilitator.lower() != str(extra.get("facilitatorAddress", "")).lower():
        raise PaymentRefused("invalid_upto_facilitator_mismatch",
                             "the authorization names another facilitator than the one offered")
    if str(auth.get("spender", "")).lower() != UPTO_PROXY.lower():
        raise PaymentRefused("invalid_permit2_spender", "the spender must be the x402 upto proxy")
    if token.lower() != requirement["asset"].lower():
        raise PaymentRefused("permit2_token_mismatch", "the authorization is for another token")
    if amount != int(requirement["amount"]):
        raise PaymentRefused("permit2_amount_mismatch",
                             f"the authorization is for {amount} units; the offered maximum is {requirement['amount']}")
    now = int(time.time())
    if after > now:
        raise PaymentRefused("permit2_not_yet_valid", "the authorization is not valid yet")
    if deadline < now + min_window:
        raise PaymentRefused("permit2_deadline_expired",
                             f"the authorization must stay valid for at least {min_window} s, to settle after the work")
    if permit2_signer(auth, signature, chain_id) != payer.lower():
        raise PaymentRefused("invalid_permit2_signature", "the signature does not match the payer")
    return payer, f"{requirement['network']}:{token.lower()}:{payer.lower()}:p2:{nonce}"


async def discover(url: str, headers: dict[str, str], http: aiohttp.ClientSession,
                   timeout: float) -> dict[str, str]:
    """Ask the facilitator which networks it settles `upto` on: network -> its address
    (`kinds[].extra.facilitatorAddress`, which offers must carry)."""
    async with http.get(f"{url}/supported", headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}")
        body = orjson.loads(await resp.read())
    found = {}
    for kind in body.get("kinds") or []:
        address = (kind.get("extra") or {}).get("facilitatorAddress") if isinstance(kind, dict) else None
        if kind.get("scheme") == SCHEME and int(kind.get("x402Version", 2)) == 2 and address:
            found[str(kind.get("network"))] = str(address)
    return found
