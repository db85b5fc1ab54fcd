"""SPEC rules around the call pipeline: 429s on the account routes too, the rate headers a
browser may read, exact CLI grants, /messages on credits only, and usage?limit bounds."""
import subprocess

import aiohttp
import anthropic
import pytest

from plugins.auth import hash_key
from tests.test_cli import GATEWAY

HI = [{"role": "user", "content": "hi"}]


async def call(gw, method, path, key=None, **kw):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as http:
        async with http.request(method, gw.url + path, headers={**headers, **kw.pop("headers", {})}, **kw) as r:
            return r.status, r.headers, await r.json()


@pytest.mark.parametrize("path,body", [("/api/v1/account/agents/register", {"name": "scout"}),
                                       ("/api/v1/account/credits/purchase", {"usd": 5})])
async def test_account_routes_are_rate_limited_too(start_gateway, path, body):
    gw = await start_gateway({"limits": {"per_key": {"rpm": 2}}})
    key, _ = await gw.key(1)
    statuses = [(await call(gw, "POST", path, key, json=body))[0] for _ in range(3)]
    assert statuses[:2] != [429, 429] and statuses[2] == 429
    status, headers, err = await call(gw, "POST", path, key, json=body)
    assert status == 429 and int(headers["Retry-After"]) >= 1 and headers["RateLimit-Remaining"] == "0"


async def test_browsers_may_read_the_rate_headers(gw):
    _, headers, _ = await call(gw, "GET", "/api/v1/models", headers={"Origin": "https://app.example"})
    exposed = {h.strip().lower() for h in headers["Access-Control-Expose-Headers"].split(",")}
    assert {"ratelimit-limit", "ratelimit-remaining", "ratelimit-reset", "retry-after"} <= exposed


@pytest.mark.parametrize("limit", ["0", "501", "-1", "abc", "1.5"])
async def test_usage_limit_out_of_range_is_400(gw, limit):
    key, _ = await gw.key(1)
    status, _, err = await call(gw, "GET", f"/api/v1/account/usage?limit={limit}", key)
    assert status == 400 and err["error"]["param"] == "limit"
    assert (await call(gw, "GET", "/api/v1/account/usage?limit=500", key))[0] == 200


async def test_messages_never_spend_the_free_allowance(start_gateway):
    gw = await start_gateway({"free": {"daily_allowance_usd": 1, "models": ["demo/echo"]}})
    key, account = await gw.key(0)
    with pytest.raises(anthropic.APIStatusError) as info:           # credits only: none, so 402
        await gw.anthropic(key).messages.create(model="demo/echo", max_tokens=50, messages=HI)
    assert info.value.status_code == 402
    reply = await gw.openai(key).chat.completions.create(model="demo/echo", messages=HI)
    assert reply.model_extra["billing"]["usd"] == 0                 # the same model is free on chat
    assert await gw.balance(account) == 0


async def test_credits_grant_is_capped_exact_and_clear_about_prefixes(start_gateway, tmp_path):
    gw = await start_gateway()
    key, _ = await gw.key(0)
    for name in ("a", "b"):                # two accounts whose keys share a 12-character prefix
        await gw.store.keys.create_account(name, hash_key(f"chk_SHAREDPREFIX_{name}"), "chk_SHAREDPR", 0)

    def grant(who, usd):
        return subprocess.run([*GATEWAY, "credits", "grant", "--config", str(tmp_path / "gateway.yaml"), who, usd],
                              capture_output=True, text=True, timeout=60, cwd=tmp_path)
    big = grant(key, "1e12")
    assert big.returncode == 2 and "at most 1000000 USD, got '1e12'" in big.stderr
    assert grant(key, "999999.999999").stdout.strip().endswith("balance $999999.999999")
    assert grant(key, "0.000001").stdout.strip().endswith("balance $1000000")      # exact, never 1e+06
    assert (await call(gw, "GET", "/api/v1/account", key))[2]["balance_usd"] == 1_000_000
    ambiguous = grant("chk_SHAREDPR", "1")
    assert ambiguous.returncode == 1
    assert "the prefix 'chk_SHAREDPR' matches keys of 2 accounts; give more of the key" in ambiguous.stderr
