"""A fake x402 facilitator (`/verify`, `/settle`, `/supported`) that checks EIP-3009
payments for real: it recovers the EIP-712 signer itself (independently of the
gateway's code), checks payee, exact amount and time window, and remembers settled
nonces the way the token contract would, so a second settlement of one payment fails."""
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


@dataclass
class FakeFacilitator:
    used_nonces: set = field(default_factory=set)
    calls: list = field(default_factory=list)          # (action, body)
    fail_next_settle: str | None = None                # an errorReason to answer once
    settled: list = field(default_factory=list)        # tx hashes

    @property
    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/verify", self.verify)
        app.router.add_post("/settle", self.settle)
        app.router.add_get("/supported", self.supported)
        return app

    def check(self, body: dict) -> tuple[str | None, str]:
        """-> (invalid reason or None, payer)."""
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

    async def verify(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("verify", body))
        reason, payer = self.check(body)
        return web.json_response({"isValid": reason is None, "invalidReason": reason, "payer": payer})

    async def settle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("settle", body))
        network = body["paymentRequirements"]["network"]
        reason, payer = self.check(body)
        if reason is None and self.fail_next_settle:
            reason, self.fail_next_settle = self.fail_next_settle, None
        if reason:
            return web.json_response({"success": False, "errorReason": reason, "transaction": "",
                                      "network": network, "payer": payer})
        req, auth = body["paymentRequirements"], body["paymentPayload"]["payload"]["authorization"]
        self.used_nonces.add((req["network"], req["asset"].lower(), auth["nonce"]))
        tx = "0x" + secrets.token_hex(32)
        self.settled.append(tx)
        return web.json_response({"success": True, "transaction": tx, "network": network, "payer": payer})

    async def supported(self, request: web.Request) -> web.Response:
        return web.json_response({"kinds": [{"x402Version": 2, "scheme": "exact", "network": "eip155:84532"},
                                            {"x402Version": 1, "scheme": "exact", "network": "base-sepolia"}],
                                  "extensions": [], "signers": {}})
