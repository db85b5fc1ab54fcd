"""A fake x402 facilitator (`/verify`, `/settle`, `/supported`) that checks payments for
real, independently of the gateway's code:

- `exact` (EIP-3009): it recovers the EIP-712 signer itself, checks payee, exact amount
  and time window, and remembers settled nonces the way the token contract would, so a
  second settlement of one payment fails.
- `upto` (Permit2, when `upto_address` is set): it recovers the Permit2 witness signer
  against the signed maximum, enforces the payee and facilitator binding and the upto
  proxy as spender, takes the phase-dependent amount (the maximum at /verify, at most the
  maximum at /settle, 0 allowed), and refuses a second settle of one authorization."""
from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

from aiohttp import web
from eth_account import Account
from eth_account.messages import encode_typed_data

V1_CHAIN_IDS = {"base": 8453, "base-sepolia": 84532}


def chain_id(network: str) -> int:
    return int(network.split(":")[1]) if network.startswith("eip155:") else V1_CHAIN_IDS[network]


def signer(auth: dict, signature: str, domain: dict) -> str:
    typed = {"types": {"EIP712Domain": [{"name": "name", "type": "string"}, {"name": "version", "type": "string"},
                                        {"name": "chainId", "type": "uint256"},
                                        {"name": "verifyingContract", "type": "address"}],
                       "TransferWithAuthorization": [
                           {"name": "from", "type": "address"}, {"name": "to", "type": "address"},
                           {"name": "value", "type": "uint256"}, {"name": "validAfter", "type": "uint256"},
                           {"name": "validBefore", "type": "uint256"}, {"name": "nonce", "type": "bytes32"}]},
             "primaryType": "TransferWithAuthorization", "domain": domain,
             "message": {"from": auth["from"], "to": auth["to"], "value": int(auth["value"]),
                         "validAfter": int(auth["validAfter"]), "validBefore": int(auth["validBefore"]),
                         "nonce": auth["nonce"]}}
    return Account.recover_message(encode_typed_data(full_message=typed), signature=signature)


PERMIT2 = "0x000000000022D473030F116dDEE9F6B43aC78BA3"
UPTO_PROXY = "0x4020A4f3b7b90ccA423B9fabCc0CE57C6C240002"
UPTO_TYPES = {
    "EIP712Domain": [{"name": "name", "type": "string"}, {"name": "chainId", "type": "uint256"},
                     {"name": "verifyingContract", "type": "address"}],
    "PermitWitnessTransferFrom": [{"name": "permitted", "type": "TokenPermissions"},
                                  {"name": "spender", "type": "address"}, {"name": "nonce", "type": "uint256"},
                                  {"name": "deadline", "type": "uint256"}, {"name": "witness", "type": "Witness"}],
    "TokenPermissions": [{"name": "token", "type": "address"}, {"name": "amount", "type": "uint256"}],
    "Witness": [{"name": "to", "type": "address"}, {"name": "facilitator", "type": "address"},
                {"name": "validAfter", "type": "uint256"}],
}


def permit2_signer(auth: dict, sig: str, network: str) -> str:
    p, w = auth["permitted"], auth["witness"]
    typed = {"types": UPTO_TYPES, "primaryType": "PermitWitnessTransferFrom",
             "domain": {"name": "Permit2", "chainId": chain_id(network), "verifyingContract": PERMIT2},
             "message": {"permitted": {"token": p["token"], "amount": int(p["amount"])}, "spender": auth["spender"],
                         "nonce": int(auth["nonce"]), "deadline": int(auth["deadline"]),
                         "witness": {"to": w["to"], "facilitator": w["facilitator"],
                                     "validAfter": int(w["validAfter"])}}}
    return Account.recover_message(encode_typed_data(full_message=typed), signature=sig)


@dataclass
class FakeFacilitator:
    used_nonces: set = field(default_factory=set)
    calls: list = field(default_factory=list)          # (action, body)
    fail_next_settle: str | None = None                # an errorReason to answer once
    settled: list = field(default_factory=list)        # tx hashes
    upto_address: str | None = None                    # set: it settles upto on eip155:84532
    upto_settled: list = field(default_factory=list)   # (payer, nonce, amount) per upto settlement
    settle_gate: object = None                         # an asyncio.Event /settle waits on, when set
    exact_settled: list = field(default_factory=list)  # (payer, nonce, value) per exact settlement
    # Called with "verify" (before answering a verify), "settle" (a settle arrived, nothing
    # moved yet) and "settled" (the transfer is done, the answer not yet sent): a test can
    # kill the gateway at each of those moments.
    on_step: object = None

    def step(self, name: str) -> None:
        if self.on_step is not None:
            self.on_step(name)

    @property
    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/verify", self.verify)
        app.router.add_post("/settle", self.settle)
        app.router.add_get("/supported", self.supported)
        return app

    def check(self, body: dict, action: str = "verify") -> tuple[str | None, str]:
        """-> (invalid reason or None, payer)."""
        if body["paymentRequirements"].get("scheme") == "upto":
            return self.check_upto(body, action)
        req, payload = body["paymentRequirements"], body["paymentPayload"]
        inner = payload["payload"]
        auth, sig = inner["authorization"], inner["signature"]
        amount = req.get("amount") or req.get("maxAmountRequired")
        domain = {**req["extra"], "chainId": chain_id(req["network"]), "verifyingContract": req["asset"]}
        key = (req["network"], req["asset"].lower(), auth["nonce"])
        if auth["to"].lower() != req["payTo"].lower():
            return "invalid_exact_evm_payload_recipient_mismatch", auth["from"]
        if int(auth["value"]) != int(amount):
            return "invalid_exact_evm_payload_authorization_value_mismatch", auth["from"]
        if int(auth["validBefore"]) < time.time() + 6:
            return "invalid_exact_evm_payload_authorization_valid_before", auth["from"]
        if signer(auth, sig, domain).lower() != auth["from"].lower():
            return "invalid_exact_evm_payload_signature", auth["from"]
        if key in self.used_nonces:
            return "invalid_exact_evm_nonce_already_used", auth["from"]
        return None, auth["from"]

    def check_upto(self, body: dict, action: str) -> tuple[str | None, str]:
        req, inner = body["paymentRequirements"], body["paymentPayload"]["payload"]
        auth, sig = inner["permit2Authorization"], inner["signature"]
        payer, permitted, witness = auth["from"], auth["permitted"], auth["witness"]
        amount, maximum = int(req["amount"]), int(permitted["amount"])
        if self.upto_address is None or witness["facilitator"].lower() != self.upto_address.lower():
            return "invalid_upto_evm_payload_facilitator_mismatch", payer
        if witness["to"].lower() != req["payTo"].lower():
            return "invalid_permit2_recipient_mismatch", payer
        if auth["spender"].lower() != UPTO_PROXY.lower():
            return "invalid_permit2_spender", payer
        if permitted["token"].lower() != req["asset"].lower():
            return "permit2_token_mismatch", payer
        if action == "verify" and amount != maximum:
            return "permit2_amount_mismatch", payer
        if amount > maximum:
            return "invalid_upto_evm_payload_settlement_exceeds_amount", payer
        if int(auth["deadline"]) < time.time() + 6 or int(witness["validAfter"]) > time.time():
            return "permit2_deadline_expired", payer
        if permit2_signer(auth, sig, req["network"]).lower() != payer.lower():
            return "invalid_permit2_signature", payer
        if (req["network"], payer.lower(), str(auth["nonce"])) in self.used_nonces:
            return "permit2_nonce_already_used", payer
        return None, payer

    async def verify(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("verify", body))
        reason, payer = self.check(body)
        self.step("verify")
        return web.json_response({"isValid": reason is None, "invalidReason": reason, "payer": payer})

    async def settle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("settle", body))
        if self.settle_gate is not None:
            await self.settle_gate.wait()
        network = body["paymentRequirements"]["network"]
        self.step("settle")
        if body["paymentRequirements"].get("scheme") == "upto":
            return self.settle_upto(body)
        reason, payer = self.check(body, "settle")
        if reason is None and self.fail_next_settle:
            reason, self.fail_next_settle = self.fail_next_settle, None
        if reason:
            return web.json_response({"success": False, "errorReason": reason, "transaction": "",
                                      "network": network, "payer": payer})
        req, auth = body["paymentRequirements"], body["paymentPayload"]["payload"]["authorization"]
        self.used_nonces.add((req["network"], req["asset"].lower(), auth["nonce"]))
        tx = "0x" + secrets.token_hex(32)
        self.settled.append(tx)
        self.exact_settled.append((payer, auth["nonce"], int(auth["value"])))
        self.step("settled")
        return web.json_response({"success": True, "transaction": tx, "network": network, "payer": payer})

    def settle_upto(self, body: dict) -> web.Response:
        req, auth = body["paymentRequirements"], body["paymentPayload"]["payload"]["permit2Authorization"]
        reason, payer = self.check(body, "settle")
        if reason:
            return web.json_response({"success": False, "errorReason": reason, "transaction": "",
                                      "network": req["network"], "payer": payer})
        self.used_nonces.add((req["network"], payer.lower(), str(auth["nonce"])))
        amount = int(req["amount"])
        tx = "0x" + secrets.token_hex(32) if amount else ""      # nothing moves for 0
        self.upto_settled.append((payer, str(auth["nonce"]), amount))
        return web.json_response({"success": True, "transaction": tx, "network": req["network"], "payer": payer,
                                  "amount": str(amount)})

    async def supported(self, request: web.Request) -> web.Response:
        kinds = [{"x402Version": 2, "scheme": "exact", "network": "eip155:84532"},
                 {"x402Version": 1, "scheme": "exact", "network": "base-sepolia"}]
        if self.upto_address:
            kinds.append({"x402Version": 2, "scheme": "upto", "network": "eip155:84532",
                          "extra": {"facilitatorAddress": self.upto_address}})
        return web.json_response({"kinds": kinds, "extensions": [], "signers": {}})
