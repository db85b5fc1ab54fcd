"""Model listings need no key and show the service price next to the list price (the
shipped catalog itself is linted in test_catalog.py)."""
import aiohttp


async def get(gw, path):
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{gw.url}{path}") as r:
            assert r.status == 200
            return await r.json()


async def test_models_list_for_the_openai_sdk(start_gateway):
    gw = await start_gateway({"free": {"featured": ["demo/echo"]}})
    ids = [m.id async for m in gw.openai("no-key-needed").models.list()]
    assert ids == ["demo/echo", "svc/free"]      # svc/smart appears once a router is configured
    body = await get(gw, "/api/v1/models")
    assert body["object"] == "list" and body["data"][0]["owned_by"] == "demo"


async def test_chat_models_listing_prices(start_gateway):
    gw = await start_gateway({"pricing": {"discount": 0.4}, "models": {"chat": [
        {"id": "demo/echo", "provider": "demo", "list_input_usd_per_mtok": 2.5, "list_output_usd_per_mtok": 10,
         "note": "demo"},
        {"id": "demo/own", "provider": "demo", "list_input_usd_per_mtok": 1, "list_output_usd_per_mtok": 1,
         "input_usd_per_mtok": 0.9, "output_usd_per_mtok": 0.95},
        {"id": "demo/flat", "provider": "demo", "pricing": "per_request", "usd_per_request": 0.002}]}})
    body = await get(gw, "/api/v1/chat/models")
    assert body["endpoint"] == "/api/v1/chat/completions" and body["pricing"] == "per_token"
    assert body["max_tokens"] == {"default": 1024, "cap": 8192}
    echo, own, flat = body["models"]
    assert (echo["input_usd_per_mtok"], echo["output_usd_per_mtok"]) == (1.0, 4.0)
    assert (echo["list_input_usd_per_mtok"], echo["list_output_usd_per_mtok"], echo["note"]) == (2.5, 10.0, "demo")
    assert (own["input_usd_per_mtok"], own["output_usd_per_mtok"]) == (0.9, 0.95)
    assert flat["pricing"] == "per_request" and flat["usd_per_request"] == 0.002


async def test_per_request_models_charge_their_price(start_gateway):
    gw = await start_gateway({"models": {"chat": [
        {"id": "demo/flat", "provider": "demo", "pricing": "per_request", "usd_per_request": 0.002}]}})
    key, account = await gw.key(1)
    resp = await gw.openai(key).chat.completions.create(model="demo/flat", messages=[{"role": "user", "content": "x"}])
    assert resp.model_extra["billing"]["usd"] == 0.002
    assert await gw.balance(account) == 1_000_000 - 2_000
