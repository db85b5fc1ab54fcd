"""x402 end to end: the real PyPI x402 client (v2, and v1) pays the gateway, against a
fake facilitator that checks EIP-712 signatures for real. Refused and never charged:
replays (one after another and all at once), wrong amount, payee or asset, expired,
forged signature, failed upstream. Credit purchases and agents."""
import asyncio
import base64
import json
import secrets
import time

import aiohttp
import httpx
import pytest
from eth_account import Account
from eth_account.messages import encode_typed_data
from x402 import x402Client
from x402.http.clients.httpx import x402_httpx_transport
from x402.mechanisms.evm.exact import ExactEvmScheme
from x402.mechanisms.evm.exact.v1.client import ExactEvmSchemeV1

from plugins import hookimpl
from tests.conftest import DEMO_MODELS, MICRO, UPSTREAM_PRICES
from tests.fakes import Reply
from tests.fakes.facilitator import FakeFacilitator

ENGINES = ("sqlite", "postgresql")     # every money test runs on both storage engines

NETWORK = "eip155:84532"
USDC = "0x036CbD53842c5426634e7929541eC2318f3dCF7e"
DISC = "0x1111111111111111111111111111111111111111"
PAYEE = Account.create().address
BODY = {"model": "up/gpt", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}
QUOTE = 401          # micro-USD: 1 input token estimated + 100 output at 1.00 / 4.00 per million


def chains(*order):
    assets = {"usdc": {"symbol": "USDC", "address": USDC, "decimals": 6, "eip712": {"name": "USDC", "version": "2"}},
              "disc": {"symbol": "DISC", "address": DISC, "decimals": 18, "usd_rate": 0.02, "discount": 0.10,
                       "eip712": {"name": "Discount Token", "version": "1"}}}
    return [{"type": "evm", "network": NETWORK, "pay_to": PAYEE, "assets": [assets[a] for a in order]}]


@pytest.fixture
async def env(aiohttp_server, start_gateway, fake_openai):
    facilitator = FakeFacilitator()
    fac_server = await aiohttp_server(facilitator.app)
    gw = await start_gateway({
        "providers": {"up": {"type": "openai", "base_url": str(fake_openai.server.make_url("/v1")),
                             "api_key": "sk-test-upstream"}},
        "models": {"chat": DEMO_MODELS + [{"id": "up/gpt", "provider": "up", "upstream": "gpt-4o-mini",
                                           **UPSTREAM_PRICES}]},
        "payments": {"x402": {"facilitator": {"url": str(fac_server.make_url(""))}, "chains": chains("usdc", "disc")}},
        "credits": {"purchase": {"min_usd": 3, "max_usd": 1000,
                                 "bonus": {"first_purchase_pct": 10, "tiers": [{"min_usd": 100, "pct": 5}]}}}})
    return gw, facilitator, fake_openai


def payer_client(account, *, asset: str | None = None, inner=None) -> httpx.AsyncClient:
    client = x402Client()
    client.register("eip155:*", ExactEvmScheme(account))
    client.register_v1("base-sepolia", ExactEvmSchemeV1(account))
    client.set_spend_controls(False)          # the test tokens are not the SDK's default assets
    if asset:
        client.register_policy(lambda v, reqs: [r for r in reqs if r.asset.lower() == asset.lower()])
    return httpx.AsyncClient(transport=x402_httpx_transport(client, inner), timeout=30)


class V1Only(httpx.AsyncBaseTransport):
    """What a v1-only client sees: the 402 body, no v2 header."""

    def __init__(self):
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request):
        resp = await self.inner.handle_async_request(request)
        if resp.status_code == 402:
            await resp.aread()
            headers = [(k, v) for k, v in resp.headers.raw if k.lower() != b"payment-required"]
            return httpx.Response(402, headers=headers, content=resp.content)
        return resp


class Recorder(httpx.AsyncBaseTransport):
    """Keeps every request's headers, to replay a payment."""

    def __init__(self):
        self.inner, self.sent = httpx.AsyncHTTPTransport(), []

    async def handle_async_request(self, request):
        self.sent.append(dict(request.headers))
        return await self.inner.handle_async_request(request)


def decode(header: str) -> dict:
    return json.loads(base64.b64decode(header))


async def post(gw, path, body, headers=None):
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{gw.url}{path}", json=body, headers=headers or {}) as r:
            return r.status, await r.json(), dict(r.headers)


# ---- the challenge ---------------------------------------------------------------------

async def test_unpaid_call_gets_402_both_ways(env):
    gw, facilitator, upstream = env
    status, body, headers = await post(gw, "/api/v1/chat/completions", BODY)
    assert status == 402 and upstream.requests == []
    assert body["x402Version"] == 1 and "payment required" in body["error"]
    usdc, disc = body["accepts"]
    assert (usdc["network"], usdc["maxAmountRequired"], usdc["asset"], usdc["payTo"]) == (
        "base-sepolia", str(QUOTE), USDC, PAYEE)
    assert usdc["resource"] == f"{gw.url}/api/v1/chat/completions".replace(gw.url, "http://127.0.0.1:8080")
    assert usdc["extra"] == {"name": "USDC", "version": "2"}
    # 401 micro-USD less 10%, at 0.02 USD per token, in 18-decimal units: exact, never a float
    assert disc["maxAmountRequired"] == "18045000000000000"
    v2 = decode(headers["PAYMENT-REQUIRED"])
    assert v2["x402Version"] == 2 and [a["amount"] for a in v2["accepts"]] == [str(QUOTE), "18045000000000000"]
    assert {a["network"] for a in v2["accepts"]} == {NETWORK}
    assert headers["Cache-Control"] == "no-store"
    assert "PAYMENT-REQUIRED" in headers["Access-Control-Expose-Headers"]


# ---- paying ----------------------------------------------------------------------------

async def paid_row(gw):
    return await gw.store.fetchall("SELECT status, usd_micro, tx, amount FROM x402_payments")


async def test_v2_client_pays_and_gets_its_answer(env):
    gw, facilitator, upstream = env
    upstream.enqueue(Reply(text="Paid answer.", output_tokens=3))
    async with payer_client(Account.create()) as http:
        r = await http.post(f"{gw.url}/api/v1/chat/completions", json=BODY)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["message"]["content"] == "Paid answer."
    assert body["billing"]["usd"] == body["billing"]["quote_usd"] == QUOTE / MICRO
    assert "paid $0.000401 with x402 (USDC on eip155:84532)" in body["billing"]["note"]
    settlement = decode(r.headers["PAYMENT-RESPONSE"])
    assert settlement["success"] is True and settlement["transaction"] == facilitator.settled[0]
    assert [tuple(row) for row in await paid_row(gw)] == [("settled", QUOTE, facilitator.settled[0], str(QUOTE))]
    row = await gw.store.fetchone("SELECT usd_micro, outcome FROM usage")
    assert tuple(row) == (QUOTE, "ok")


async def test_v1_client_pays_with_x_payment(env):
    gw, facilitator, upstream = env
    async with payer_client(Account.create(), inner=V1Only()) as http:
        r = await http.post(f"{gw.url}/api/v1/chat/completions", json=BODY)
    assert r.status_code == 200, r.text
    assert "X-PAYMENT-RESPONSE" in r.headers and "PAYMENT-RESPONSE" not in r.headers
    assert decode(r.headers["X-PAYMENT-RESPONSE"])["success"] is True
    assert facilitator.calls[-1][1]["x402Version"] == 1


async def test_discount_token_is_ten_percent_cheaper(env):
    gw, facilitator, upstream = env
    async with payer_client(Account.create(), asset=DISC) as http:
        r = await http.post(f"{gw.url}/api/v1/chat/completions", json=BODY)
    assert r.status_code == 200, r.text
    billing = r.json()["billing"]
    assert billing["quote_usd"] == 0.000401 and billing["usd"] == 0.000361     # 360.9 rounded up
    assert "DISC on eip155:84532" in billing["note"]


# ---- refusals: nothing is done and nothing moves --------------------------------------

async def capture_payment(gw) -> dict:
    recorder = Recorder()
    async with payer_client(Account.create(), inner=recorder) as http:
        r = await http.post(f"{gw.url}/api/v1/chat/completions", json=BODY)
    assert r.status_code == 200
    return {"PAYMENT-SIGNATURE": recorder.sent[-1]["payment-signature"]}


async def test_replay_one_after_another_is_refused(env):
    gw, facilitator, upstream = env
    header = await capture_payment(gw)
    status, body, _ = await post(gw, "/api/v1/chat/completions", BODY, header)
    assert status == 402 and "already used" in body["error"]
    assert len(upstream.requests) == 1 and len(facilitator.settled) == 1


async def test_replay_all_at_once_pays_once(env):
    gw, facilitator, upstream = env
    payment = sign(Account.create(), amount=QUOTE)
    results = await asyncio.gather(*[post(gw, "/api/v1/chat/completions", BODY, payment) for _ in range(10)])
    statuses = [r[0] for r in results]
    assert statuses.count(200) == 1 and statuses.count(402) == 9
    assert len(upstream.requests) == 1 and len(facilitator.settled) == 1


def sign(account, *, amount=QUOTE, asset=USDC, to=PAYEE, valid_before=None, signer=None, domain_name="USDC"):
    """A v2 payment built by hand, so each field can be wrong on purpose."""
    auth = {"from": account.address, "to": to, "value": str(amount), "validAfter": "0",
            "validBefore": str(valid_before or int(time.time()) + 300), "nonce": "0x" + secrets.token_hex(32)}
    typed = {"types": {"EIP712Domain": [{"name": "name", "type": "string"}, {"name": "version", "type": "string"},
                                        {"name": "chainId", "type": "uint256"},
                                        {"name": "verifyingContract", "type": "address"}],
                       "TransferWithAuthorization": [
                           {"name": "from", "type": "address"}, {"name": "to", "type": "address"},
                           {"name": "value", "type": "uint256"}, {"name": "validAfter", "type": "uint256"},
                           {"name": "validBefore", "type": "uint256"}, {"name": "nonce", "type": "bytes32"}]},
             "primaryType": "TransferWithAuthorization",
             "domain": {"name": domain_name, "version": "2", "chainId": 84532, "verifyingContract": asset},
             "message": {**auth, "value": int(auth["value"]), "validAfter": 0, "validBefore": int(auth["validBefore"])}}
    signature = (signer or account).sign_message(encode_typed_data(full_message=typed)).signature.hex()
    accepted = {"scheme": "exact", "network": NETWORK, "amount": str(amount), "asset": asset, "payTo": PAYEE,
                "maxTimeoutSeconds": 300, "extra": {"name": "USDC", "version": "2"}}
    payload = {"x402Version": 2, "accepted": accepted,
               "payload": {"authorization": auth, "signature": "0x" + signature.removeprefix("0x")}}
    return {"PAYMENT-SIGNATURE": base64.b64encode(json.dumps(payload).encode()).decode()}


@pytest.mark.parametrize("case,words", [
    ("wrong_amount", "does not match"),
    ("wrong_payee", "not to this gateway"),
    ("wrong_asset", "does not match"),
    ("expired", "expired"),
    ("forged", "signature does not match"),
    ("wrong_domain", "signature does not match"),
])
async def test_bad_payments_are_refused_before_any_work(env, case, words):
    gw, facilitator, upstream = env
    account = Account.create()
    header = {"wrong_amount": lambda: sign(account, amount=QUOTE - 1),
              "wrong_payee": lambda: sign(account, to=Account.create().address),
              "wrong_asset": lambda: sign(account, asset="0x2222222222222222222222222222222222222222"),
              "expired": lambda: sign(account, valid_before=int(time.time()) - 1),
              "forged": lambda: sign(account, signer=Account.create()),
              "wrong_domain": lambda: sign(account, domain_name="USD Coin")}[case]()
    status, body, headers = await post(gw, "/api/v1/chat/completions", BODY, header)
    assert status == 402 and words in body["error"], body
    assert "PAYMENT-REQUIRED" in headers                      # the client can pay properly and retry
    assert upstream.requests == [] and facilitator.settled == []
    assert await paid_row(gw) == []


async def test_failed_upstream_settles_nothing(env):
    gw, facilitator, upstream = env
    upstream.enqueue(Reply(error_status=500))
    payment = sign(Account.create())
    status, body, headers = await post(gw, "/api/v1/chat/completions", BODY, payment)
    assert status == 502 and "PAYMENT-RESPONSE" not in headers
    assert [c[0] for c in facilitator.calls] == ["verify"] and facilitator.settled == []
    assert [tuple(r)[0] for r in await paid_row(gw)] == ["unused"]
    status, _, _ = await post(gw, "/api/v1/chat/completions", BODY, payment)      # and it cannot be reused
    assert status == 402


async def test_settlement_failure_is_recorded_and_said(env):
    gw, facilitator, upstream = env
    facilitator.fail_next_settle = "insufficient_funds"
    status, body, headers = await post(gw, "/api/v1/chat/completions", BODY, sign(Account.create()))
    assert status == 200 and "settlement failed (insufficient_funds)" in body["billing"]["note"]
    assert body["billing"]["usd"] == 0
    settlement = decode(headers["PAYMENT-RESPONSE"])
    assert (settlement["success"], settlement["errorReason"], settlement["network"]) == (
        False, "insufficient_funds", NETWORK)
    assert [tuple(r)[0] for r in await paid_row(gw)] == ["settle_failed"]


async def test_stream_and_smart_still_need_a_key(env):
    gw, _, _ = env
    for body in ({**BODY, "stream": True}, {**BODY, "model": "svc/smart"}):
        status, err, _ = await post(gw, "/api/v1/chat/completions", body, sign(Account.create()))
        assert status == 400 and "needs an API key" in err["error"]["message"]


# ---- credit purchase -----------------------------------------------------------------

async def test_credit_purchase_end_to_end_with_bonuses(env):
    gw, facilitator, _ = env
    key, account = await gw.key(1)
    auth = {"Authorization": f"Bearer {key}"}
    status, body, headers = await post(gw, "/api/v1/account/credits/purchase", {"usd": 12.5}, auth)
    assert status == 402 and [a["maxAmountRequired"] for a in body["accepts"]] == ["12500000"]   # no discount token
    async with payer_client(Account.create()) as http:
        r = await http.post(f"{gw.url}/api/v1/account/credits/purchase", json={"usd": 12.5}, headers=auth)
        assert r.status_code == 200, r.text
        first = r.json()
        r = await http.post(f"{gw.url}/api/v1/account/credits/purchase", json={"usd": 100}, headers=auth)
        second = r.json()
    assert first["status"] == "confirmed" and first["credited_usd"] == 12.5
    assert first["bonus_usd"] == 1.25 and first["balance_usd"] == 1 + 12.5 + 1.25          # first purchase: +10%
    assert first["tx"] == facilitator.settled[0] and first["order_id"].startswith("order_")
    assert second["bonus_usd"] == 5 and second["balance_usd"] == 14.75 + 100 + 5            # 100 and up: +5%
    entries = await gw.store.fetchall("SELECT amount_micro, kind, ref FROM ledger WHERE account_id = ? ORDER BY id",
                                      (account,))
    assert [(e["amount_micro"], e["kind"], e["ref"]) for e in entries[1:]] == [
        (12_500_000, "purchase", first["order_id"]), (1_250_000, "bonus", first["order_id"]),
        (100_000_000, "purchase", second["order_id"]), (5_000_000, "bonus", second["order_id"])]
    assert await gw.balance(account) == 119_750_000 == await gw.ledger_sum(account)


async def test_one_payment_credits_once_even_sent_twice_at_once(env):
    gw, facilitator, _ = env
    key, account = await gw.key(0)
    payment = sign(Account.create(), amount=5_000_000)
    headers = {**payment, "Authorization": f"Bearer {key}"}
    results = await asyncio.gather(*[post(gw, "/api/v1/account/credits/purchase", {"usd": 5}, headers)
                                     for _ in range(8)])
    assert sorted(r[0] for r in results) == [200] + [402] * 7
    assert await gw.balance(account) == 5_500_000 == await gw.ledger_sum(account)     # 5 + 10% first bonus


async def test_unsettled_purchase_credits_nothing(env):
    gw, facilitator, _ = env
    key, account = await gw.key(0)
    facilitator.fail_next_settle = "insufficient_funds"
    status, body, _ = await post(gw, "/api/v1/account/credits/purchase", {"usd": 5},
                                 {**sign(Account.create(), amount=5_000_000), "Authorization": f"Bearer {key}"})
    assert status == 402 and "nothing was credited" in body["error"]["message"]
    assert await gw.balance(account) == 0


@pytest.mark.parametrize("usd,words", [(2.99, "from 3 to 1000"), (1000.01, "from 3 to 1000"), ("ten", "not a number"),
                                       (1.0000001, "at most 6 decimals")])
async def test_purchase_limits(env, usd, words):
    gw, _, _ = env
    key, _ = await gw.key(0)
    status, body, _ = await post(gw, "/api/v1/account/credits/purchase", {"usd": usd}, {"Authorization": f"Bearer {key}"})
    assert status == 400 and words in body["error"]["message"]
    status, _, _ = await post(gw, "/api/v1/account/credits/purchase", {"usd": 5})
    assert status == 401


# ---- agents ---------------------------------------------------------------------------

async def test_agents_register_and_own_their_usage(env):
    gw, _, upstream = env
    key, account = await gw.key(1)
    auth = {"Authorization": f"Bearer {key}"}
    status, first, _ = await post(gw, "/api/v1/account/agents/register", {"name": "scout"}, auth)
    assert status == 201 and first["key_attached"] is True and first["agent"]["name"] == "scout"
    status, again, _ = await post(gw, "/api/v1/account/agents/register", {"name": "scout"}, auth)
    assert status == 200 and again["agent"] == first["agent"] and again["key_attached"] is True
    status, other, _ = await post(gw, "/api/v1/account/agents/register", {"name": "ranger"}, auth)
    assert status == 201 and other["key_attached"] is False          # the key stays with scout
    await gw.openai(key).chat.completions.create(model="up/gpt", messages=[{"role": "user", "content": "hi"}])
    row = await gw.store.fetchone("SELECT agent_id FROM usage WHERE account_id = ?", (account,))
    assert row[0] == first["agent"]["id"]
    status, err, _ = await post(gw, "/api/v1/account/agents/register", {"name": "x" * 61}, auth)
    assert status == 400 and "at most 60" in err["error"]["message"]
    status, _, _ = await post(gw, "/api/v1/account/agents/register", {"name": "scout"})
    assert status == 401


# ---- payment chains are plugins -------------------------------------------------------

class TestnetChain:
    """A custom payment chain type, registered by a plugin."""

    @hookimpl
    def gateway_register_payment_methods(self, register):
        from plugins.x402.chains import EvmChain

        class Testnet(EvmChain):
            type_name = "testnet"
        register(Testnet)


async def test_a_plugin_can_add_a_chain_type(aiohttp_server, start_gateway):
    from plugins import get_plugin_manager
    pm = get_plugin_manager()
    pm.register(TestnetChain(), "testnet-chain")
    facilitator = FakeFacilitator()
    server = await aiohttp_server(facilitator.app)
    chain = {**chains("usdc")[0], "type": "testnet"}
    gw = await start_gateway({"payments": {"x402": {"facilitator": {"url": str(server.make_url(""))},
                                                    "chains": [chain]}}}, pm=pm)
    status, body, _ = await post(gw, "/api/v1/chat/completions", {**BODY, "model": "demo/echo"})
    assert status == 402 and body["accepts"][0]["network"] == "base-sepolia"


def test_unknown_chain_type_is_a_config_error(write_config):
    from config import ConfigError
    from gateway import create_app
    cfg = write_config({"payments": {"x402": {"facilitator": {"url": "http://f"},
                                              "chains": [{"type": "warp", "network": NETWORK}]}}})
    with pytest.raises(ConfigError) as info:
        create_app(cfg)
    assert "payments.x402.chains[0].type: no payment chain type 'warp'" in info.value.problems[0]


def test_shipped_chains_stay_off_until_filled_in():
    import config
    from gateway import create_app
    from plugins.x402 import PAYWALL
    assert not create_app(config.load(env={}))[PAYWALL].enabled
    env = {"X402_FACILITATOR_URL": "https://facilitator.example", "X402_PAY_TO_BASE": "0x" + "a" * 40,
           "X402_PAY_TO_SOLANA": "So1ana", "X402_SOLANA_FEE_PAYER": "FeePayer", "X402_TOKEN_A_ADDRESS": "0x" + "b" * 40,
           "X402_TOKEN_A_USD_RATE": "0.05", "X402_TOKEN_A_NAME": "Token A"}
    paywall = create_app(config.load(env=env))[PAYWALL]
    offers = [(o.requirement["network"], o.asset.symbol, o.requirement["amount"], o.requirement["extra"])
              for o in paywall.offers(1_000_000, discounts=True)]
    assert offers == [
        ("eip155:8453", "USDC", "1000000", {"name": "USD Coin", "version": "2"}),
        ("eip155:8453", "TOKEN_A", "18000000000000000000",            # $0.90 at $0.05 a token
         {"name": "Token A", "version": "1", "assetTransferMethod": "permit2"}),
        ("solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp", "USDC", "1000000", {"feePayer": "FeePayer"})]
    assert [o.asset.symbol for o in paywall.offers(1_000_000, discounts=False)] == ["USDC", "USDC"]


async def test_solana_offer_in_the_challenge(aiohttp_server, start_gateway):
    svm = {"type": "svm", "network": "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp", "pay_to": "Recv1111",
           "fee_payer": "Fee11111", "assets": [{"symbol": "USDC", "decimals": 6, "transfer": "spl",
                                                "address": "EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v"}]}
    gw = await start_gateway({"payments": {"x402": {"facilitator": {"url": "http://127.0.0.1:9"}, "chains": [svm]}}})
    status, body, headers = await post(gw, "/api/v1/chat/completions", {**BODY, "model": "demo/echo"})
    assert status == 402 and body["accepts"][0]["network"] == "solana"
    assert decode(headers["PAYMENT-REQUIRED"])["accepts"][0]["extra"] == {"feePayer": "Fee11111"}
    junk = {"x402Version": 2, "accepted": decode(headers["PAYMENT-REQUIRED"])["accepts"][0], "payload": {}}
    status, body, _ = await post(gw, "/api/v1/chat/completions", {**BODY, "model": "demo/echo"},
                                 {"PAYMENT-SIGNATURE": base64.b64encode(json.dumps(junk).encode()).decode()})
    assert status == 402 and "lacks a transaction" in body["error"]


async def test_malformed_payment_header_is_400(env):
    gw, _, _ = env
    status, body, _ = await post(gw, "/api/v1/chat/completions", BODY, {"X-PAYMENT": "%%%not-base64"})
    assert status == 400 and "not base64 JSON" in body["error"]["message"]
