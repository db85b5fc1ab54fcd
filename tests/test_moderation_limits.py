"""Moderation (422, nothing charged, before any upstream call) and rate limits (429, exact
under 200 concurrent calls, with Retry-After and RateLimit-* headers, never charged)."""
import asyncio

import aiohttp
import pytest
from aiohttp import web

from tests.conftest import MICRO

RULES = {"moderation": {"rules": [{"category": "weapons", "patterns": ["(?i)\\bbuild a bomb\\b"]}]}}
BAD = [{"role": "user", "content": "Tell me how to BUILD A BOMB please"}]


async def post(gw, path, body, key=None):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{gw.url}{path}", json=body, headers=headers) as r:
            return r.status, await r.json(), r.headers


@pytest.mark.parametrize("path,body", [
    ("/api/v1/chat/completions", {"model": "demo/echo", "messages": BAD}),
    ("/api/v1/responses", {"model": "demo/echo", "input": BAD[0]["content"]}),
])
async def test_flagged_requests_are_422_and_free(start_gateway, path, body):
    gw = await start_gateway(RULES)
    key, account = await gw.key(1)
    status, err, _ = await post(gw, path, body, key)
    assert status == 422 and err["error"]["code"] == "moderation_flagged" and err["error"]["param"] == "weapons"
    assert await gw.balance(account) == MICRO
    assert tuple(await gw.store.fetchone("SELECT COUNT(*) FROM holds")) == (0,)


async def test_messages_format_gets_its_own_shape(start_gateway):
    gw = await start_gateway(RULES)
    key, _ = await gw.key(1)
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{gw.url}/api/v1/messages", headers={"x-api-key": key},
                          json={"model": "demo/echo", "max_tokens": 10, "messages": BAD}) as r:
            assert r.status == 422 and (await r.json())["error"]["type"] == "invalid_request_error"


async def test_media_prompts_are_moderated(start_gateway):
    gw = await start_gateway({**RULES, "models": {"image": [
        {"id": "demo/image", "provider": "demo", "upstream": "d", "list_usd_per_image": 0.01}]}})
    key, account = await gw.key(1)
    status, err, _ = await post(gw, "/api/v1/images/generations",
                                {"model": "demo/image", "prompt": "how to build a bomb"}, key)
    assert status == 422 and await gw.balance(account) == MICRO


@pytest.fixture
async def moderation_api(aiohttp_server):
    """An OpenAI-shape moderation endpoint: flags anything mentioning 'forbidden'."""
    seen = []

    async def moderations(request):
        body = await request.json()
        seen.append(body)
        hit = "forbidden" in body["input"]
        return web.json_response({"id": "modr-1", "model": body["model"], "results": [
            {"flagged": hit, "categories": {"harassment": False, "violence": hit}}]})
    app = web.Application()
    app.router.add_post("/v1/moderations", moderations)
    server = await aiohttp_server(app)
    return server, seen


async def test_upstream_moderation_provider(start_gateway, moderation_api):
    server, seen = moderation_api
    gw = await start_gateway({"providers": {"mod": {"type": "openai", "base_url": str(server.make_url("/v1")),
                                                    "api_key": "sk-mod"}},
                              "moderation": {"provider": {"provider": "mod", "model": "omni-moderation-latest"}}})
    key, account = await gw.key(1)
    status, err, _ = await post(gw, "/api/v1/chat/completions",
                                {"model": "demo/echo", "messages": [{"role": "user", "content": "forbidden words"}]}, key)
    assert status == 422 and err["error"]["param"] == "violence"
    status, _, _ = await post(gw, "/api/v1/chat/completions", {"model": "demo/echo",
                                                               "messages": [{"role": "user", "content": "fine"}]}, key)
    assert status == 200 and seen[-1] == {"model": "omni-moderation-latest", "input": "fine"}


@pytest.mark.parametrize("fail_closed,expected", [(False, 200), (True, 503)])
async def test_moderation_provider_down(start_gateway, fail_closed, expected):
    gw = await start_gateway({"providers": {"mod": {"type": "openai", "base_url": "http://127.0.0.1:9/v1",
                                                    "api_key": "x"}},
                              "moderation": {"provider": {"provider": "mod"}, "fail_closed": fail_closed}})
    key, _ = await gw.key(1)
    status, _, _ = await post(gw, "/api/v1/chat/completions",
                              {"model": "demo/echo", "messages": [{"role": "user", "content": "hi"}]}, key)
    assert status == expected


# ---- rate limits -------------------------------------------------------------------------

HI = {"model": "demo/echo", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}


async def test_rpm_is_exact_under_200_concurrent_calls(start_gateway, shared_state):
    gw = await start_gateway({"limits": {"per_key": {"rpm": 50}}, **shared_state})
    key, account = await gw.key(1)
    results = await asyncio.gather(*[post(gw, "/api/v1/chat/completions", HI, key) for _ in range(200)])
    statuses = [r[0] for r in results]
    assert statuses.count(200) == 50 and statuses.count(429) == 150
    refused = next(r for r in results if r[0] == 429)
    _, err, headers = refused
    assert err["error"]["code"] == "rate_limit_requests" and int(headers["Retry-After"]) >= 1
    assert headers["RateLimit-Limit"] == "50" and headers["RateLimit-Remaining"] == "0"
    rows = await gw.store.fetchall("SELECT usd_micro FROM usage")
    assert len(rows) == 50                                              # refused calls cost and record nothing
    assert await gw.balance(account) == MICRO - sum(r["usd_micro"] for r in rows)
    ok = next(r for r in results if r[0] == 200)
    assert ok[2]["RateLimit-Limit"] == "50"


async def test_tpm_counts_input_estimate_plus_cap_and_gives_back_the_unused(start_gateway, shared_state):
    gw = await start_gateway({"limits": {"per_key": {"tpm": 300}}, **shared_state})
    key, _ = await gw.key(1)
    status, err, _ = await post(gw, "/api/v1/chat/completions", {**HI, "max_tokens": 400}, key)
    assert status == 429 and "this call needs 401" in err["error"]["message"]
    for _ in range(5):   # each holds 201 tokens but uses ~20: the rest comes back, so all pass
        status, _, _ = await post(gw, "/api/v1/chat/completions", {**HI, "max_tokens": 200}, key)
        assert status == 200


async def test_keyless_callers_are_limited_by_address(start_gateway, shared_state):
    gw = await start_gateway({"limits": {"per_address": {"rpm": 2}, "per_key": {"rpm": 100}}, **shared_state})
    statuses = [(await post(gw, "/api/v1/chat/completions", HI))[0] for _ in range(3)]
    assert statuses == [402, 402, 429]                                  # the third is limited before payment
    key, _ = await gw.key(1)
    assert (await post(gw, "/api/v1/chat/completions", HI, key))[0] == 200   # keys have their own buckets


async def test_rpm_is_a_sliding_minute_not_a_refilling_bucket(start_gateway, shared_state):
    """60 calls, then a pause that a refilling bucket would top up by one: still refused
    (however long a burst takes, rpm admits that many in any 60 s)."""
    gw = await start_gateway({"limits": {"per_key": {"rpm": 60}}, **shared_state})
    key, _ = await gw.key(1)
    statuses = await asyncio.gather(*[post(gw, "/api/v1/chat/completions", HI, key) for _ in range(61)])
    assert sorted(s for s, _, _ in statuses) == [200] * 60 + [429]
    await asyncio.sleep(1.1)
    status, err, headers = await post(gw, "/api/v1/chat/completions", HI, key)
    assert status == 429 and 57 <= int(headers["Retry-After"]) <= 60


async def test_the_memory_store_counts_windows_and_buckets_exactly():
    """The in-process store, on a clock the test moves: what is left, the wait of a refusal,
    refills, and tokens given back (never above capacity)."""
    from plugins.limitstores import Bucket, MemoryLimits
    now = [1000.0]
    store = MemoryLimits(clock=lambda: now[0])
    rpm, tpm = Bucket("k:rpm", 1, 2.0, True), Bucket("k:tpm", 90, 120.0)
    first = await store.take([rpm, tpm])
    assert (first.refused, first.left) == (None, [1.0, 30.0])
    now[0] += 15.0                                       # the bucket refills 30 tokens in 15 s
    refused = await store.take([rpm, tpm])
    assert (refused.refused, refused.left, refused.wait) == (1, [1.0, 60.0], 15.0)   # nothing taken
    await store.give_back(Bucket("k:tpm", 50, 120.0))
    second = await store.take([rpm, tpm])
    assert (second.refused, second.left) == (None, [0.0, 20.0])
    now[0] += 30.0
    full = await store.take([rpm])
    assert (full.refused, full.left, full.wait) == (0, [0.0], 15.0)    # the first take leaves the window at 1060
    await store.give_back(Bucket("k:tpm", 500, 120.0))
    assert store.buckets["k:tpm"] == (120.0, now[0])
    now[0] += 15.0
    assert (await store.take([rpm])).left == [0.0]       # 1060: the first take is out of the window
