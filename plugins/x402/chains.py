"""Payment chains, one plugin class per `type:` under `payments.x402.chains`.

A chain turns a USD price into offers (one per asset it accepts) and checks a payment
against the offer it claims to pay, locally, before the facilitator is even asked:
right payee, exact amount, live time window, and (EVM, EIP-3009) a signature that
recovers to the payer. It also names the payment's claim key: the one-time value that
makes the same payment unusable twice.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar

from plugins import hookimpl

from . import upto
from .errors import PaymentRefused
from .wire import Offer, Payment

MICRO = 1_000_000


@dataclass(slots=True)
class Asset:
    symbol: str
    address: str
    decimals: int
    usd_rate: Fraction          # USD per whole token (1 for stablecoins)
    discount: Fraction          # e.g. 1/10 for the project tokens
    transfer: str               # eip3009 | permit2 | spl
    eip712: dict[str, str]
    upto: bool = True           # offer the upto scheme for it, where the facilitator settles upto

    def atomic(self, usd_micro: int, *, discounted: bool) -> tuple[int, int]:
        """USD micro -> (atomic units to pay, rounded up; USD micro that amount is worth)."""
        factor = (1 - self.discount) if discounted else Fraction(1)
        usd = Fraction(usd_micro, MICRO) * factor
        units = usd / self.usd_rate * 10 ** self.decimals
        atomic = -(-units.numerator // units.denominator)
        return atomic, self.worth(atomic)

    def worth(self, atomic: int) -> int:
        """What `atomic` units are worth in USD micro, rounded up."""
        worth = Fraction(atomic, 10 ** self.decimals) * self.usd_rate * MICRO
        return -(-worth.numerator // worth.denominator)


class Chain:
    type_name: ClassVar[str] = ""
    required_settings: ClassVar[tuple[str, ...]] = ()   # left empty = a placeholder, skipped

    def __init__(self, network: str, pay_to: str, assets: list[Asset], settings: dict[str, Any]):
        self.network, self.pay_to, self.assets, self.settings = network, pay_to, assets, settings
        self.upto = bool(settings.get("upto", True))

    def offers(self, usd_micro: int, max_timeout: int, *, discounts: bool) -> list[Offer]:
        return [self._offer("exact", asset, usd_micro, max_timeout, self.extra(asset))
                for asset in self.assets if discounts or not asset.discount]

    def upto_offers(self, usd_micro: int, max_timeout: int, facilitator_address: str) -> list[Offer]:
        """`upto` offers for a maximum of `usd_micro` (calls only: never credit purchases)."""
        return []

    def _offer(self, scheme: str, asset: Asset, usd_micro: int, max_timeout: int, extra: dict) -> Offer:
        amount, worth = asset.atomic(usd_micro, discounted=True)
        requirement = {"scheme": scheme, "network": self.network, "amount": str(amount), "asset": asset.address,
                       "payTo": self.pay_to, "maxTimeoutSeconds": max_timeout, "extra": extra}
        return Offer(requirement, self, asset, worth)

    def extra(self, asset: Asset) -> dict[str, Any]:
        return {}

    def check(self, payment: Payment, offer: Offer) -> tuple[str, str]:
        """-> (payer, claim key) if the payment pays this offer; else PaymentRefused."""
        raise NotImplementedError


class EvmChain(Chain):
    """EVM chains, `exact` scheme: EIP-3009 transferWithAuthorization (USDC, USDG), or
    Permit2 for tokens without it (checked by the facilitator, not locally)."""
    type_name = "evm"

    @property
    def chain_id(self) -> int:
        return int(self.network.split(":", 1)[1])

    def extra(self, asset: Asset) -> dict[str, Any]:
        extra = dict(asset.eip712)
        if asset.transfer == "permit2":
            extra["assetTransferMethod"] = "permit2"
        return extra

    def upto_offers(self, usd_micro: int, max_timeout: int, facilitator_address: str) -> list[Offer]:
        # Any ERC-20 can move by Permit2 (the payer approves Permit2 once), so every asset
        # qualifies unless the operator switched it off.
        if not self.upto:
            return []
        return [self._offer(upto.SCHEME, asset, usd_micro, max_timeout,
                            {**asset.eip712, "assetTransferMethod": "permit2",
                             "facilitatorAddress": facilitator_address})
                for asset in self.assets if asset.upto]

    def check(self, payment: Payment, offer: Offer) -> tuple[str, str]:
        if offer.scheme == upto.SCHEME:
            return upto.check(payment, offer.requirement, self.chain_id,
                              min_window=int(offer.requirement["maxTimeoutSeconds"]) // 2)
        inner = payment.inner
        if offer.asset.transfer == "permit2":
            auth = inner.get("permit2Authorization") or {}
            payer, nonce = str(auth.get("from", "")), str(auth.get("nonce", ""))
            if not payer or not nonce:
                raise PaymentRefused("invalid_payload", "the permit2 payment lacks from or nonce")
            return payer, f"{self.network}:{offer.asset.address.lower()}:{payer.lower()}:p2:{nonce}"
        auth, signature = inner.get("authorization"), inner.get("signature")
        if not isinstance(auth, dict) or not isinstance(signature, str):
            raise PaymentRefused("invalid_payload", "the payment lacks an authorization and signature")
        req = offer.requirement
        try:
            value, after, before = int(auth["value"]), int(auth["validAfter"]), int(auth["validBefore"])
            payer, nonce = str(auth["from"]), str(auth["nonce"])
        except (KeyError, TypeError, ValueError):
            raise PaymentRefused("invalid_payload", "the authorization is incomplete") from None
        if str(auth.get("to", "")).lower() != self.pay_to.lower():
            raise PaymentRefused("invalid_exact_evm_payload_recipient_mismatch", "the payment is not to this gateway")
        if value != int(req["amount"]):
            raise PaymentRefused("invalid_exact_evm_payload_authorization_value_mismatch",
                                 f"the payment is for {value} units; this call costs exactly {req['amount']}")
        now = int(time.time())
        if before < now + 6:
            raise PaymentRefused("invalid_exact_evm_payload_authorization_valid_before", "the payment has expired")
        if after > now:
            raise PaymentRefused("invalid_exact_evm_payload_authorization_valid_after", "the payment is not valid yet")
        if not (nonce.startswith("0x") and len(nonce) == 66):
            raise PaymentRefused("invalid_payload", "the nonce must be 32 bytes of hex")
        if self._signer(auth, signature, offer.asset) != payer.lower():
            raise PaymentRefused("invalid_exact_evm_payload_signature", "the signature does not match the payer")
        return payer, f"{self.network}:{offer.asset.address.lower()}:{payer.lower()}:{nonce.lower()}"

    def _signer(self, auth: dict, signature: str, asset: Asset) -> str:
        from eth_account import Account                  # 0.6 s to import: only when a payment arrives
        from eth_account.messages import encode_typed_data
        typed = {"types": {"EIP712Domain": [{"name": "name", "type": "string"}, {"name": "version", "type": "string"},
                                            {"name": "chainId", "type": "uint256"},
                                            {"name": "verifyingContract", "type": "address"}],
                           "TransferWithAuthorization": [
                               {"name": "from", "type": "address"}, {"name": "to", "type": "address"},
                               {"name": "value", "type": "uint256"}, {"name": "validAfter", "type": "uint256"},
                               {"name": "validBefore", "type": "uint256"}, {"name": "nonce", "type": "bytes32"}]},
                 "primaryType": "TransferWithAuthorization",
                 "domain": {**asset.eip712, "chainId": self.chain_id, "verifyingContract": asset.address},
                 "message": {"from": auth["from"], "to": auth["to"], "value": int(auth["value"]),
                             "validAfter": int(auth["validAfter"]), "validBefore": int(auth["validBefore"]),
                             "nonce": auth["nonce"]}}
        try:
            return Account.recover_message(encode_typed_data(full_message=typed), signature=signature).lower()
        except Exception:       # any malformed signature or field is simply not the payer's
            return ""


class SvmChain(Chain):
    """Solana, `exact` scheme: a partially signed transfer the facilitator co-signs as fee
    payer. The transaction is checked by the facilitator; the claim key is its hash."""
    type_name = "svm"
    required_settings = ("fee_payer",)

    def extra(self, asset: Asset) -> dict[str, Any]:
        return {"feePayer": self.settings.get("fee_payer", "")}

    def check(self, payment: Payment, offer: Offer) -> tuple[str, str]:
        tx = payment.inner.get("transaction")
        if not isinstance(tx, str) or len(tx) < 64:
            raise PaymentRefused("invalid_payload", "the payment lacks a transaction")
        return "", f"{self.network}:tx:{hashlib.sha256(tx.encode()).hexdigest()}"


@hookimpl
def gateway_register_payment_methods(register):
    register(EvmChain)
    register(SvmChain)
