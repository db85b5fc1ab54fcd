"""Bad input never gets a 500 or a traceback: each mistake is a 4xx naming the field,
in the OpenAI error shape, and costs nothing."""
import aiohttp
import openai
import pytest

from tests.conftest import MICRO

HI = [{"role": "user", "content": "hi"}]


async def post(gw, body, key=None, raw: bytes | None = None):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{gw.url}/api/v1/chat/completions", headers=headers,
                          data=raw if raw is not None else None, json=None if raw is not None else body) as r:
            return r.status, await r.json(content_type=None)


@pytest.mark.parametrize("body,param,words", [
    ({"messages": HI}, "model", "is required"),
    ({"model": 5, "messages": HI}, "model", "non-empty string"),
    ({"model": "demo/echo"}, "messages", "is required"),
    ({"model": "demo/echo", "messages": []}, "messages", "must not be empty"),
    ({"model": "demo/echo", "messages": "hi"}, "messages", "must be an array"),
    ({"model": "demo/echo", "messages": [{"content": "x"}]}, "messages[0].role", "is required"),
    ({"model": "demo/echo", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", "wizard"),
    ({"model": "demo/echo", "messages": [{"role": "user", "content": 7}]}, "messages[0].content", "string"),
    ({"model": "demo/echo", "messages": [{"role": "user", "content": [{"type": "audio"}]}]},
     "messages[0].content[0].type", "not supported"),
    ({"model": "demo/echo", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "ftp://x"}}]}]}, "messages[0].content[0].image_url.url", "https"),
    ({"model": "demo/echo", "messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id",
     "is required"),
    ({"model": "demo/echo", "messages": HI, "max_tokens": "lots"}, "max_tokens", "integer"),
    ({"model": "demo/echo", "messages": HI, "max_tokens": 0}, "max_tokens", "at least 1"),
    ({"model": "demo/echo", "messages": HI, "max_tokens": 1.5}, "max_tokens", "integer"),
    ({"model": "demo/echo", "messages": HI, "max_completion_tokens": -1}, "max_completion_tokens", "at least 1"),
    ({"model": "demo/echo", "messages": HI, "n": 2}, "n", "must be 1"),
    ({"model": "demo/echo", "messages": HI, "stream": "yes"}, "stream", "true or false"),
    ({"model": "demo/echo", "messages": HI, "temperature": "hot"}, "temperature", "number"),
    ({"model": "demo/echo", "messages": HI, "tools": [{"type": "function"}]}, "tools[0].function",
     "JSON object"),
    ({"model": "demo/echo", "messages": HI, "tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice", "not in tools"),
    ({"model": "demo/echo", "messages": HI, "stop": [1]}, "stop", "strings"),
    ({"model": "nope/model", "messages": HI}, "model", "'nope/model' is not served here"),
])
async def test_bad_fields_are_400_naming_the_field(gw, body, param, words):
    key, account = await gw.key(1)
    status, err = await post(gw, body, key)
    assert status == 400, err
    assert err["error"]["param"] == param
    assert words in err["error"]["message"]
    assert err["error"]["type"] == "invalid_request_error"
    assert await gw.balance(account) == MICRO


@pytest.mark.parametrize("raw,words", [(b"{nope", "not valid JSON"), (b"", "empty"), (b"[1,2]", "JSON object")])
async def test_malformed_bodies_are_400(gw, raw, words):
    status, err = await post(gw, None, raw=raw)
    assert status == 400 and words in err["error"]["message"]


async def test_stream_and_smart_need_a_key(gw):
    status, err = await post(gw, {"model": "demo/echo", "messages": HI, "stream": True})
    assert status == 400 and err["error"]["param"] == "stream"
    status, err = await post(gw, {"model": "svc/smart", "messages": HI})
    assert status == 400 and "svc/smart needs an API key" in err["error"]["message"]


async def test_keyless_call_is_402_saying_what_to_send(gw):
    status, err = await post(gw, {"model": "demo/echo", "messages": HI})
    assert status == 402 and "API key" in err["error"]["message"]


async def test_invalid_key_is_401(gw):
    for key in ("chk_not-a-real-key", "sk-something-else"):
        with pytest.raises(openai.AuthenticationError) as info:
            await gw.openai(key).chat.completions.create(model="demo/echo", messages=HI)
        assert info.value.code == "invalid_api_key" and key[:8] in info.value.message


async def test_input_over_200k_characters_is_413(gw):
    key, account = await gw.key(1)
    status, err = await post(gw, {"model": "demo/echo", "messages": [{"role": "user", "content": "x" * 200_001}]}, key)
    assert status == 413 and "200,001" in err["error"]["message"]
    status, _ = await post(gw, {"model": "demo/echo", "messages": [{"role": "user", "content": "x" * 200_000}]}, key)
    assert status == 200
    assert await gw.balance(account) < MICRO


async def test_unknown_routes_and_methods_are_json(gw):
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{gw.url}/api/v1/nothing-here") as r:
            assert r.status == 404 and (await r.json())["error"]["code"] == "not_found"
        async with s.get(f"{gw.url}/api/v1/chat/completions") as r:
            assert r.status == 405 and "GET is not allowed" in (await r.json())["error"]["message"]


async def test_plugin_routes_and_middlewares_sit_inside_the_core_layer(start_gateway):
    """A plugin's route that fails unexpectedly is a 500 in the OpenAI shape with a request
    id; a plugin's own middleware still wraps calls; OPTIONS without a CORS preflight's
    header is an ordinary request (405 here), and a preflight is answered on any path."""
    from aiohttp import web

    from plugins import get_plugin_manager, hookimpl

    class Broken:
        @hookimpl
        def gateway_register_routes(self, register, config):
            async def boom(request):
                raise RuntimeError("a plugin bug")
            register("GET", "/plugin/boom", boom)

        @hookimpl
        def gateway_configure(self, app, config):
            @web.middleware
            async def stamp(request, handler):
                response = await handler(request)
                response.headers["X-Stamped"] = "yes"
                return response
            app.middlewares.append(stamp)

    pm = get_plugin_manager()
    pm.register(Broken(), "broken")
    gw = await start_gateway(pm=pm)
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{gw.url}/plugin/boom") as r:
            assert r.status == 500 and (await r.json())["error"]["code"] == "internal_error"
            assert r.headers["X-Request-Id"] and "x-should-retry" not in r.headers
        async with s.post(f"{gw.url}/api/v1/chat/completions", data=b"{") as r:
            assert r.status == 400 and r.headers["X-Stamped"] == "yes" and r.headers["x-should-retry"] == "false"
        async with s.options(f"{gw.url}/api/v1/chat/completions") as r:
            assert r.status == 405 and (await r.json())["error"]["code"] == "method_not_allowed"
        async with s.options(f"{gw.url}/nowhere", headers={"Origin": "https://a.example",
                                                          "Access-Control-Request-Method": "POST"}) as r:
            assert r.status == 204 and r.headers["Access-Control-Allow-Origin"] == "*" and r.headers["X-Request-Id"]


async def test_provider_without_key_names_the_variable(start_gateway, monkeypatch):
    monkeypatch.delenv("SOME_PROVIDER_KEY", raising=False)
    gw = await start_gateway({"providers": {"acme": {"type": "openai", "base_url": "https://acme.invalid/v1",
                                                     "api_key": "${SOME_PROVIDER_KEY:-}"}},
                              "models": {"chat": [{"id": "acme/m", "provider": "acme", "list_input_usd_per_mtok": 1,
                                                   "list_output_usd_per_mtok": 1}]}})
    key, account = await gw.key(1)
    with pytest.raises(openai.APIStatusError) as info:
        await gw.openai(key).chat.completions.create(model="acme/m", messages=HI)
    assert info.value.status_code == 400 and "SOME_PROVIDER_KEY" in info.value.message
    assert await gw.balance(account) == MICRO


async def test_every_response_carries_a_request_id(gw):
    """The gateway's own id, unique per request (it is a call's usage row id): an id the
    client sends is logged beside it (tests/test_logs.py), never reused."""
    async with aiohttp.ClientSession() as s:
        ids = set()
        for _ in range(2):
            async with s.get(f"{gw.url}/api/v1/models", headers={"X-Request-Id": "abc123"}) as r:
                ids.add(r.headers["X-Request-Id"])
        for _ in range(3):
            async with s.post(f"{gw.url}/api/v1/chat/completions", data=b"{") as r:
                ids.add(r.headers["X-Request-Id"])
        assert len(ids) == 5 and "abc123" not in ids and all(len(i) >= 16 for i in ids)


async def test_cors_preflight_and_exposed_headers(gw):
    async with aiohttp.ClientSession() as s:
        async with s.options(f"{gw.url}/api/v1/chat/completions", headers={
                "Origin": "https://agent.example", "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "payment-signature, content-type"}) as r:
            assert r.status == 204 and r.headers["Access-Control-Allow-Origin"] == "*"
            assert "PAYMENT-SIGNATURE" in r.headers["Access-Control-Allow-Headers"]
        async with s.post(f"{gw.url}/api/v1/chat/completions", json={}, headers={"Origin": "https://a.example"}) as r:
            assert "PAYMENT-RESPONSE" in r.headers["Access-Control-Expose-Headers"]


async def test_cors_can_be_narrowed(start_gateway):
    gw = await start_gateway({"server": {"cors_origins": ["https://ok.example"]}})
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{gw.url}/api/v1/models", headers={"Origin": "https://ok.example"}) as r:
            assert r.headers["Access-Control-Allow-Origin"] == "https://ok.example"
        async with s.get(f"{gw.url}/api/v1/models", headers={"Origin": "https://evil.example"}) as r:
            assert "Access-Control-Allow-Origin" not in r.headers
