"""svc/free and the daily free allowance (exact, across a UTC day boundary, under
concurrency), and svc/smart with each classifier path and for media."""
import asyncio

import aiohttp
import openai
import pytest
from aiohttp import web

from plugins.allowance import CLOCK
from tests.conftest import DEMO_MODELS, MICRO, UPSTREAM_PRICES
from tests.fakes import Reply

ENGINES = ("sqlite", "postgresql")     # every money test runs on both storage engines

DAY = 86400
NOON = 20_000 * DAY + DAY // 2          # a fixed UTC noon
HI = [{"role": "user", "content": "hi"}]     # 1 input token estimated



class Clock:
    def __init__(self, now=NOON):
        self.now = now

    def __call__(self):
        return self.now

    def install(self, app):
        app[CLOCK] = self


def upstream_models(fake, **free):
    return {"providers": {"up": {"type": "openai", "base_url": str(fake.server.make_url("/v1")),
                                 "api_key": "sk-test-upstream"}},
            "models": {"chat": DEMO_MODELS + [
                {"id": "up/free", "provider": "up", "upstream": "gpt-4o-mini", **UPSTREAM_PRICES},
                {"id": "up/big", "provider": "up", "upstream": "gpt-4.1", **UPSTREAM_PRICES},
                {"id": "up/paid", "provider": "up", "upstream": "gpt-4o", **UPSTREAM_PRICES}]},
            "free": {"daily_allowance_usd": 0.001, "models": ["up/free"],
                     "frontier": {"models": ["up/big"], "output_cap": 10}, **free}}


async def usage(gw, account):
    return await gw.store.fetchall("SELECT usd_micro, billing FROM usage WHERE account_id = ? ORDER BY id", (account,))


# ---- svc/free ---------------------------------------------------------------------------

async def test_svc_free_rotates_at_midnight_utc(start_gateway, fake_openai):
    clock = Clock(NOON)
    gw = await start_gateway(upstream_models(fake_openai, featured=["up/free", "demo/echo"]),
                             before_start=clock.install)
    key, _ = await gw.key(1)
    client = gw.openai(key)
    first = await client.chat.completions.create(model="svc/free", messages=HI)
    clock.now += DAY // 2 - 1                        # 23:59:59 the same day
    same = await client.chat.completions.create(model="svc/free", messages=HI)
    clock.now += 1                                   # midnight
    next_day = await client.chat.completions.create(model="svc/free", messages=HI)
    assert first.model == same.model != next_day.model
    assert {first.model, next_day.model} == {"up/free", "demo/echo"}
    assert first.model_extra["billing"]["requested_model"] == "svc/free"
    assert f"svc/free is {first.model} today" in first.model_extra["billing"]["note"]
    assert "svc/free" in [m.id async for m in client.models.list()]


# ---- the allowance ----------------------------------------------------------------------

async def test_allowance_fully_partly_exhausted_and_next_day(start_gateway, fake_openai):
    clock = Clock()
    gw = await start_gateway(upstream_models(fake_openai), before_start=clock.install)
    key, account = await gw.key(1)
    client = gw.openai(key)

    async def call(output_tokens, model="up/free"):
        fake_openai.enqueue(Reply(output_tokens=output_tokens))
        r = await client.chat.completions.create(model=model, max_tokens=100, messages=HI)
        return r.model_extra["billing"]

    b = await call(50)                                # 201: all of it free
    assert (b["usd"], b["usage_usd"]) == (0, 0.000201) and b["note"].startswith("free: covered by the daily")
    b = await call(100)                               # 401: free again; 1000 - 201 - 401 = 398 left
    assert b["usd"] == 0
    b = await call(100)                               # 401: 398 free, 3 from credits
    assert b["usd"] == 0.000003 and "partly free: $0.000398" in b["note"]
    b = await call(100)                               # exhausted: 401 from credits
    assert b["usd"] == 0.000401 and b["note"].startswith("charged from prepaid credits")
    assert await gw.balance(account) == MICRO - 404 == await gw.ledger_sum(account)
    account_info = await client.get("/account", cast_to=dict)
    assert account_info["free_allowance_left_usd"] == 0
    clock.now += DAY                                  # the next UTC day: a fresh allowance
    assert (await client.get("/account", cast_to=dict))["free_allowance_left_usd"] == 0.001
    assert (await call(100))["usd"] == 0
    assert await gw.balance(account) == MICRO - 404


async def test_frontier_models_are_free_up_to_the_output_cap(start_gateway, fake_openai):
    gw = await start_gateway(upstream_models(fake_openai), before_start=Clock().install)
    key, account = await gw.key(1)
    fake_openai.enqueue(Reply(output_tokens=50))
    r = await gw.openai(key).chat.completions.create(model="up/big", max_tokens=100, messages=HI)
    # eligible: 1 input + 10 output tokens = 41; the other 40 output tokens = 160 from credits
    assert r.model_extra["billing"]["usd"] == 0.00016 and "partly free: $0.000041" in r.model_extra["billing"]["note"]
    assert await gw.balance(account) == MICRO - 160


async def test_other_models_and_smart_never_use_the_allowance(start_gateway, fake_openai):
    cfg = upstream_models(fake_openai)
    cfg["router"] = {"tiers": {t: "up/free" for t in ("easy", "medium", "hard", "frontier")}}
    gw = await start_gateway(cfg, before_start=Clock().install)
    key, account = await gw.key(1)
    for model in ("up/paid", "svc/smart"):
        fake_openai.enqueue(Reply(output_tokens=10))
        r = await gw.openai(key).chat.completions.create(model=model, max_tokens=100, messages=HI)
        assert r.model_extra["billing"]["usd"] == 0.000041
    assert await gw.balance(account) == MICRO - 82


async def test_an_empty_account_can_use_free_models(start_gateway, fake_openai):
    gw = await start_gateway(upstream_models(fake_openai), before_start=Clock().install)
    key, account = await gw.key(0)
    fake_openai.enqueue(Reply(output_tokens=10))
    r = await gw.openai(key).chat.completions.create(model="up/free", max_tokens=100, messages=HI)
    assert r.model_extra["billing"]["usd"] == 0
    with pytest.raises(openai.APIStatusError) as info:       # a paid model still needs credits
        await gw.openai(key).chat.completions.create(model="up/paid", max_tokens=100, messages=HI)
    assert info.value.status_code == 402


async def test_concurrent_calls_never_overspend_the_allowance(start_gateway, fake_openai):
    gw = await start_gateway(upstream_models(fake_openai), before_start=Clock().install)
    key, account = await gw.key(1)
    fake_openai.enqueue(*[Reply(output_tokens=100) for _ in range(10)])
    client = gw.openai(key)
    await asyncio.gather(*[client.chat.completions.create(model="up/free", max_tokens=100, messages=HI)
                           for _ in range(10)])
    rows = await usage(gw, account)
    used = (await gw.store.fetchone("SELECT used_micro FROM free_usage WHERE account_id = ?", (account,)))[0]
    assert used == 1000                                       # exactly the allowance, never more
    assert sum(r["usd_micro"] for r in rows) + used == 10 * 401
    assert await gw.balance(account) == MICRO - (10 * 401 - 1000) == await gw.ledger_sum(account)


# ---- svc/smart ---------------------------------------------------------------------------

def smart_config(fake, **router):
    cfg = upstream_models(fake)
    cfg["models"]["chat"].append({"id": "up/classifier", "provider": "up", "upstream": "gpt-4o-mini",
                                  **UPSTREAM_PRICES})
    cfg["router"] = {"tiers": {"easy": "demo/echo", "medium": "up/free", "hard": "up/paid", "frontier": "up/big"},
                     "classifier": {"model": "up/classifier", "timeout_ms": 1000}, **router}
    return cfg


async def test_smart_llm_classifier_decides(start_gateway, fake_openai):
    gw = await start_gateway(smart_config(fake_openai))
    key, _ = await gw.key(1)
    fake_openai.enqueue(Reply(text="hard"), Reply(text="routed answer"))
    r = await gw.openai(key).chat.completions.create(model="svc/smart", messages=[{"role": "user", "content": "hello"}])
    billing = r.model_extra["billing"]
    assert r.model == "up/paid" and r.choices[0].message.content == "routed answer"
    assert (billing["requested_model"], billing["difficulty"], billing["classifier"]) == ("svc/smart", "hard", "llm")
    assert "svc/smart routed to up/paid (hard, by llm)" in billing["note"]
    assert fake_openai.requests[0].body["max_tokens"] == 16      # the classifier's own short call


async def test_smart_llm_too_slow_falls_back_to_the_local_classifier(start_gateway, aiohttp_server, fake_openai):
    async def slow(request):
        await asyncio.sleep(2)
        return web.json_response({})
    app = web.Application()
    app.router.add_post("/v1/chat/completions", slow)
    slow_server = await aiohttp_server(app)
    cfg = smart_config(fake_openai)
    cfg["providers"]["slow"] = {"type": "openai", "base_url": str(slow_server.make_url("/v1")), "api_key": "x"}
    cfg["models"]["chat"][-1]["provider"] = "slow"
    gw = await start_gateway(cfg)
    key, _ = await gw.key(1)
    prompt = "Prove that every group of order p^2 is abelian, with each step justified."
    r = await gw.openai(key).chat.completions.create(model="svc/smart", messages=[{"role": "user", "content": prompt}])
    billing = r.model_extra["billing"]
    assert billing["classifier"] == "local" and billing["difficulty"] in ("hard", "frontier")


async def test_smart_falls_back_when_nothing_can_decide(start_gateway, fake_openai):
    cfg = smart_config(fake_openai, heuristic=False)
    cfg["providers"]["up"]["base_url"] = "http://127.0.0.1:9/v1"       # the classifier is unreachable
    cfg["router"]["tiers"]["medium"] = "demo/echo"
    gw = await start_gateway(cfg)
    key, _ = await gw.key(1)
    r = await gw.openai(key).chat.completions.create(model="svc/smart", messages=HI)
    assert (r.model_extra["billing"]["classifier"], r.model_extra["billing"]["difficulty"]) == ("fallback", "medium")


async def test_smart_on_responses(start_gateway, fake_openai):
    gw = await start_gateway(smart_config(fake_openai))
    key, _ = await gw.key(1)
    fake_openai.enqueue(Reply(text="easy"))
    r = await gw.openai(key).responses.create(model="svc/smart", input="hi")
    assert r.model == "demo/echo" and "You said: hi" in r.output_text


# ---- svc/smart for media -----------------------------------------------------------------

MEDIA = {"image": [
    {"id": "demo/cheap", "provider": "demo", "upstream": "d", "list_usd_per_image": 0.01, "options": {"aspect_ratio": ["1:1"]}},
    {"id": "demo/fine", "provider": "demo", "upstream": "d", "list_usd_per_image": 0.08,
     "options": {"quality": {"values": ["high", "medium"], "default": "medium"}}}],
    "video": [{"id": "demo/clip", "provider": "demo", "upstream": "t", "list_usd_per_second": 0.1,
               "options": {"duration_seconds": {"values": [4], "default": 4}}}]}
SMART_MEDIA = {"image": {"generate": {"low": "demo/cheap", "medium": "demo/fine", "high": "demo/fine"}},
               "video": {"text_to_video": {"low": "demo/clip", "medium": "demo/clip", "high": "demo/clip"}}}


async def test_smart_media_tiers(start_gateway, tmp_path):
    gw = await start_gateway({"models": MEDIA, "media": {"artifacts": {"dir": str(tmp_path)}},
                              "router": {"media": SMART_MEDIA}})
    key, _ = await gw.key(5)

    async def post(path, body):
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{gw.url}{path}", json=body, headers={"Authorization": f"Bearer {key}"}) as r:
                return r.status, await r.json()
    status, body = await post("/api/v1/images/generations", {"model": "svc/smart", "prompt": "p", "quality": "low",
                                                             "aspect_ratio": "1:1"})
    assert status == 200 and body["billing"]["model"] == "demo/cheap" and body["billing"]["requested_model"] == "svc/smart"
    status, body = await post("/api/v1/images/generations", {"model": "svc/smart", "prompt": "p", "aspect_ratio": "21:9"})
    assert status == 200 and body["billing"]["model"] == "demo/fine"          # medium by default; 21:9 dropped
    status, body = await post("/api/v1/videos/generations", {"model": "svc/smart", "prompt": "p", "duration_seconds": 9})
    assert status == 200 and body["billing"]["model"] == "demo/clip"          # 9 s not offered: dropped
    for field, value in (("resolution", "1080p"), ("video_url", "https://example.com/a.mp4")):
        status, err = await post("/api/v1/videos/generations", {"model": "svc/smart", "prompt": "p", field: value})
        assert status == 400 and err["error"]["param"] == field
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{gw.url}/api/v1/media/models") as r:
            assert (await r.json())["smart"] == SMART_MEDIA
