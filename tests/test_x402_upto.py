"""x402 `upto` end to end: the official x402 client's upto scheme signs a Permit2
authorization for the call's reserve, and the gateway settles only what the call used,
against a fake facilitator that re-verifies the signature against the signed maximum,
enforces the payee and facilitator binding and refuses a second settle. `exact` works as
before beside it."""
import asyncio
import base64
import json

import aiohttp
import httpx
import pytest
from eth_account import Account
from x402 import x402Client
from x402.http.clients.httpx import x402_httpx_transport
from x402.mechanisms.evm.exact import ExactEvmScheme
from x402.mechanisms.evm.upto import UptoEvmScheme

from tests.conftest import DEMO_MODELS, UPSTREAM_PRICES, upstream_cost
from tests.fakes import MediaReply, Reply
from tests.fakes.facilitator import FakeFacilitator
from tests.fakes.replicate import FakeReplicate
from tests.test_x402 import DISC, NETWORK, PAYEE, USDC, chains, decode, paid_row, post

ENGINES = ("sqlite", "postgresql")     # every money test runs on both storage engines

FACILITATOR = Account.create().address
BODY = {"model": "up/gpt", "max_tokens": 4000, "messages": [{"role": "user", "content": "hi"}]}
MAXIMUM = upstream_cost(1, 4000)       # 1 input token estimated + max_tokens: 16,001 micro-USD


@pytest.fixture
async def env(aiohttp_server, start_gateway, fake_openai, tmp_path):
    facilitator = FakeFacilitator(upto_address=FACILITATOR)
    fac_server = await aiohttp_server(facilitator.app)
    images = FakeReplicate()
    images.server = await aiohttp_server(images.app)
    gw = await start_gateway({
        "providers": {"up": {"type": "openai", "base_url": str(fake_openai.server.make_url("/v1")),
                             "api_key": "sk-test-upstream"},
                      "rep": {"type": "replicate", "base_url": str(images.server.make_url("")),
                              "api_key": "r8_test", "poll_seconds": 0.01}},
        "models": {"chat": DEMO_MODELS + [{"id": "up/gpt", "provider": "up", "upstream": "gpt-4o-mini",
                                           **UPSTREAM_PRICES}],
                   "image": [{"id": "rep/flux", "provider": "rep", "upstream": "black-forest-labs/flux-schnell",
                              "list_usd_per_image": 0.006}],
                   "video": [{"id": "rep/veo", "provider": "rep", "upstream": "google/veo-3",
                              "list_usd_per_second": 0.5, "options": {"duration_seconds": {"values": [8], "default": 8}}}]},
        "media": {"artifacts": {"dir": str(tmp_path / "art")}, "allow_private_urls": True},
        "payments": {"x402": {"facilitator": {"url": str(fac_server.make_url(""))},
                              "chains": chains("usdc", "disc")}}})
    return gw, facilitator, fake_openai, images


def upto_client(account, *, asset: str = USDC, inner=None) -> httpx.AsyncClient:
    client = x402Client()
    client.register("eip155:*", UptoEvmScheme(account))
    client.set_spend_controls(False)          # the test tokens are not the SDK's default assets
    client.register_policy(lambda v, reqs: [r for r in reqs if r.asset.lower() == asset.lower()])
    return httpx.AsyncClient(transport=x402_httpx_transport(client, inner), timeout=30)


class Capture(httpx.AsyncBaseTransport):
    """Lets the unpaid request through (to get the 402) and keeps the paid one, unsent:
    a signed authorization to replay or tamper with."""

    def __init__(self):
        self.inner, self.payment = httpx.AsyncHTTPTransport(), None

    async def handle_async_request(self, request):
        if "payment-signature" in request.headers:
            self.payment = request.headers["payment-signature"]
            return httpx.Response(599, content=b"captured")
        return await self.inner.handle_async_request(request)


async def signed(gw, body=BODY, path="/api/v1/chat/completions") -> dict:
    capture = Capture()
    async with upto_client(Account.create(), inner=capture) as http:
        await http.post(f"{gw.url}{path}", json=body)
    return decode(capture.payment)


def header(payment: dict) -> dict:
    return {"PAYMENT-SIGNATURE": base64.b64encode(json.dumps(payment).encode()).decode()}


# ---- the offer -------------------------------------------------------------------------

async def test_402_offers_upto_beside_exact(env):
    gw, facilitator, upstream, _ = env
    status, body, headers = await post(gw, "/api/v1/chat/completions", BODY)
    assert status == 402
    accepts = decode(headers["PAYMENT-REQUIRED"])["accepts"]
    assert [(a["scheme"], a["asset"]) for a in accepts] == [("exact", USDC), ("exact", DISC), ("upto", USDC),
                                                            ("upto", DISC)]
    usdc = accepts[2]
    assert usdc["amount"] == str(MAXIMUM) and usdc["payTo"] == PAYEE and usdc["network"] == NETWORK
    assert usdc["extra"] == {"name": "USDC", "version": "2", "assetTransferMethod": "permit2",
                             "facilitatorAddress": FACILITATOR}
    assert accepts[3]["amount"] == accepts[1]["amount"]          # the token discount, as for exact
    assert usdc["maxTimeoutSeconds"] == 900                      # long enough to settle after a slow render
    assert {a["scheme"] for a in body["accepts"]} == {"exact"}   # v1 has no upto


async def test_no_upto_where_the_facilitator_does_not_settle_it(aiohttp_server, start_gateway):
    facilitator = FakeFacilitator()                              # /supported lists exact only
    server = await aiohttp_server(facilitator.app)
    gw = await start_gateway({"payments": {"x402": {"facilitator": {"url": str(server.make_url(""))},
                                                    "chains": chains("usdc")}}})
    status, _, headers = await post(gw, "/api/v1/chat/completions", {**BODY, "model": "demo/echo"})
    assert status == 402
    assert {a["scheme"] for a in decode(headers["PAYMENT-REQUIRED"])["accepts"]} == {"exact"}


async def test_upto_can_be_switched_off_per_asset(aiohttp_server, start_gateway):
    facilitator = FakeFacilitator(upto_address=FACILITATOR)
    server = await aiohttp_server(facilitator.app)
    [chain] = chains("usdc", "disc")
    chain["assets"][1]["upto"] = False
    gw = await start_gateway({"payments": {"x402": {"facilitator": {"url": str(server.make_url(""))},
                                                    "chains": [chain]}}})
    _, _, headers = await post(gw, "/api/v1/chat/completions", {**BODY, "model": "demo/echo"})
    accepts = decode(headers["PAYMENT-REQUIRED"])["accepts"]
    assert [(a["scheme"], a["asset"]) for a in accepts if a["scheme"] == "upto"] == [("upto", USDC)]


# ---- paying what was used --------------------------------------------------------------

async def test_chat_settles_what_it_used_not_the_maximum(env):
    gw, facilitator, upstream, _ = env
    upstream.enqueue(Reply(text="Short.", output_tokens=3))
    account = Account.create()
    async with upto_client(account) as http:
        r = await http.post(f"{gw.url}/api/v1/chat/completions", json=BODY)
    assert r.status_code == 200, r.text
    used = upstream_cost(1, 3)                                   # 13 micro-USD = 13 USDC units
    billing = r.json()["billing"]
    assert billing["usd"] == used / 1e6 and billing["quote_usd"] == MAXIMUM / 1e6
    assert "up to $0.016001" in billing["note"]
    settlement = decode(r.headers["PAYMENT-RESPONSE"])
    assert settlement["success"] and settlement["amount"] == str(used) and settlement["payer"] == account.address
    verify, settle = [body for action, body in facilitator.calls]
    assert verify["paymentRequirements"]["amount"] == str(MAXIMUM)      # verify: the maximum
    assert settle["paymentRequirements"]["amount"] == str(used)         # settle: the actual charge
    assert facilitator.upto_settled == [(account.address, facilitator.upto_settled[0][1], used)]
    assert [tuple(r) for r in await paid_row(gw)] == [("settled", used, settlement["transaction"], str(used))]


async def test_discount_token_settles_the_discounted_usage(env):
    gw, facilitator, upstream, _ = env
    upstream.enqueue(Reply(text="Short.", output_tokens=3))
    async with upto_client(Account.create(), asset=DISC) as http:
        r = await http.post(f"{gw.url}/api/v1/chat/completions", json=BODY)
    assert r.status_code == 200, r.text
    # 13 micro-USD less 10%, at 0.02 USD a token with 18 decimals: 585,000,000,000,000 units, exact
    assert decode(r.headers["PAYMENT-RESPONSE"])["amount"] == "585000000000000"
    assert r.json()["billing"]["usd"] == 0.000012                 # 11.7 rounded up


async def test_image_settles_for_the_images_produced(env):
    gw, facilitator, _, images = env
    async with upto_client(Account.create()) as http:
        r = await http.post(f"{gw.url}/api/v1/images/generations", json={"model": "rep/flux", "prompt": "x", "n": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["data"]) == 2 and body["billing"]["images"] == 2
    assert decode(r.headers["PAYMENT-RESPONSE"])["amount"] == "6000"       # two images at 0.003
    assert body["billing"]["usd"] == 0.006 and body["billing"]["quote_usd"] == 0.006
    assert [amount for _, _, amount in facilitator.upto_settled] == [6000]


async def test_video_settles_the_render_cost_not_the_list_price_held(env):
    gw, facilitator, _, images = env
    images.enqueue(MediaReply(video=True))
    async with upto_client(Account.create()) as http:
        r = await http.post(f"{gw.url}/api/v1/videos/generations", json={"model": "rep/veo", "prompt": "waves"})
    assert r.status_code == 200, r.text
    billing = r.json()["billing"]
    # authorized up to the list price of 8 s at 0.50/s; charged the service price, half of it
    assert billing["quote_usd"] == 4.0 and billing["usd"] == 2.0
    assert decode(r.headers["PAYMENT-RESPONSE"])["amount"] == "2000000"
    assert [amount for _, _, amount in facilitator.upto_settled] == [2_000_000]


async def test_upstream_failure_settles_nothing(env):
    gw, facilitator, upstream, _ = env
    upstream.enqueue(Reply(error_status=500))
    async with upto_client(Account.create()) as http:
        r = await http.post(f"{gw.url}/api/v1/chat/completions", json=BODY)
    assert r.status_code == 502
    assert [action for action, _ in facilitator.calls] == ["verify"] and facilitator.upto_settled == []
    assert [row[0] for row in await paid_row(gw)] == ["unused"]


async def test_exact_beside_upto_pays_the_whole_quote(env):
    gw, facilitator, upstream, _ = env
    upstream.enqueue(Reply(text="Short.", output_tokens=3))
    client = x402Client()
    client.register("eip155:*", ExactEvmScheme(Account.create()))
    client.set_spend_controls(False)
    client.register_policy(lambda v, reqs: [r for r in reqs if r.asset.lower() == USDC.lower()])
    async with httpx.AsyncClient(transport=x402_httpx_transport(client), timeout=30) as http:
        r = await http.post(f"{gw.url}/api/v1/chat/completions", json=BODY)
    assert r.status_code == 200, r.text
    assert r.json()["billing"]["usd"] == MAXIMUM / 1e6 and facilitator.upto_settled == []


# ---- replays and tampering: refused before any work, nothing settled ---------------------

async def test_one_authorization_sent_20_times_at_once_is_served_and_settled_once(env):
    gw, facilitator, upstream, _ = env
    upstream.enqueue(Reply(text="Short.", output_tokens=3))
    payment = header(await signed(gw))
    results = await asyncio.gather(*[post(gw, "/api/v1/chat/completions", BODY, payment) for _ in range(20)])
    statuses = [status for status, _, _ in results]
    assert statuses.count(200) == 1 and statuses.count(402) == 19
    assert len(upstream.requests) == 1 and len(facilitator.upto_settled) == 1


def _raise_maximum(p):
    p["payload"]["permit2Authorization"]["permitted"]["amount"] = str(MAXIMUM * 10)


def _raise_maximum_everywhere(p):
    _raise_maximum(p)
    p["accepted"]["amount"] = str(MAXIMUM * 10)


def _other_payee(p):
    p["payload"]["permit2Authorization"]["witness"]["to"] = Account.create().address


def _other_facilitator(p):
    p["payload"]["permit2Authorization"]["witness"]["facilitator"] = Account.create().address


def _other_nonce(p):
    p["payload"]["permit2Authorization"]["nonce"] = str(int(p["payload"]["permit2Authorization"]["nonce"]) + 1)


@pytest.mark.parametrize("tamper,reason", [
    (_raise_maximum, "permit2_amount_mismatch"),
    (_raise_maximum_everywhere, "invalid_upto_payment_requirements"),
    (_other_payee, "invalid_permit2_recipient_mismatch"),
    (_other_facilitator, "invalid_upto_facilitator_mismatch"),
    (_other_nonce, "invalid_permit2_signature"),
])
async def test_tampered_authorizations_are_refused(env, tamper, reason):
    gw, facilitator, upstream, _ = env
    payment = await signed(gw)
    tamper(payment)
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{gw.url}/api/v1/chat/completions", json=BODY, headers=header(payment)) as r:
            assert r.status == 402
            assert (await r.json())["error"].startswith(f"payment refused ({reason})")
            assert decode(r.headers["PAYMENT-REQUIRED"])["accepts"]     # the client can sign anew and retry
    assert upstream.requests == [] and facilitator.calls == [] and facilitator.upto_settled == []
    assert await paid_row(gw) == []
