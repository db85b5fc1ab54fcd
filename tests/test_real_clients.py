"""What third-party clients (agent CLIs, SDKs) need: output caps clamped rather than refused,
no retries of what cannot succeed, unavailable models said plainly, namespace tools,
a clear 401 for a key sent the wrong way, and a base URL that answers a probe."""
import aiohttp
import anthropic
import openai
import pytest

from tests.conftest import DEMO_MODELS, anthropic_upstream, openai_upstream, upstream_cost
from tests.fakes import Reply, ToolCallSpec

HI = [{"role": "user", "content": "hi"}]
NO_KEY = {"providers": {"nokey": {"type": "openai", "base_url": "http://127.0.0.1:9/v1",
                                  "api_key": "${SURELY_UNSET_KEY_VAR:-}"}},
          "models": {"chat": DEMO_MODELS + [{"id": "nokey/m", "provider": "nokey", "list_input_usd_per_mtok": 1,
                                            "list_output_usd_per_mtok": 1}]}}


async def test_messages_max_tokens_above_the_cap_is_clamped_and_reserved_clamped(start_gateway, fake_anthropic):
    gw = await start_gateway(anthropic_upstream(fake_anthropic))
    # 32768 output tokens at 4 USD/Mtok hold 0.131072 USD; 64000 would hold 0.256 and be refused (402).
    key, account = await gw.key("0.2")
    fake_anthropic.enqueue(Reply(text="ok", input_tokens=10, output_tokens=5))
    msg = await gw.anthropic(key, timeout=60).messages.create(model="up/claude", max_tokens=64000, messages=HI)
    assert msg.content[0].text == "ok"
    assert fake_anthropic.requests[-1].body["max_tokens"] == 32768
    charged = 200_000 - await gw.balance(account)
    assert 0 < charged <= upstream_cost(msg.usage.input_tokens, msg.usage.output_tokens)   # the hold was released


@pytest.mark.parametrize("endpoint,field,sent,cap", [("chat", "max_tokens", 9000, 8192),
                                                      ("chat", "max_completion_tokens", 10**6, 8192),
                                                      ("responses", "max_output_tokens", 40000, 32768)])
async def test_other_output_caps_are_clamped(start_gateway, fake_openai, endpoint, field, sent, cap):
    gw = await start_gateway(openai_upstream(fake_openai))
    # demo/echo output costs 1 USD/Mtok: 0.035 USD holds 32768 tokens plus the input, never 40000
    key, _ = await gw.key(10 if endpoint == "chat" else "0.035")
    client = gw.openai(key)
    if endpoint == "chat":
        await client.chat.completions.create(model="up/gpt", messages=HI, **{field: sent})
        assert fake_openai.requests[-1].body["max_tokens"] == cap
    else:
        resp = await client.responses.create(model="demo/echo", input="hi", max_output_tokens=sent)
        assert resp.status == "completed"


@pytest.mark.parametrize("value", [0, -3, 1.5, "100"])
async def test_zero_negative_and_non_integer_caps_stay_400(gw, value):
    key, _ = await gw.key(1)
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/api/v1/messages", json={"model": "demo/echo", "max_tokens": value,
                                                                 "messages": HI}, headers={"x-api-key": key}) as resp:
            body = await resp.json()
    assert resp.status == 400 and body["error"]["message"].startswith("max_tokens: ")


async def test_errors_that_cannot_succeed_say_do_not_retry(gw):
    async with aiohttp.ClientSession() as http:
        for headers, body, status in [({"Authorization": "Bearer chk_wrong"}, {"model": "demo/echo", "messages": HI}, 401),
                                      ({}, {"model": "nope/x", "messages": HI}, 400),
                                      ({}, {"model": "demo/echo", "messages": "x"}, 400)]:
            async with http.post(f"{gw.url}/api/v1/chat/completions", json=body, headers=headers) as resp:
                assert resp.status == status and resp.headers["x-should-retry"] == "false"
        async with http.post(f"{gw.url}/api/v1/messages", json={"model": "demo/echo", "max_tokens": 5,
                                                                 "messages": HI}) as resp:
            assert resp.status == 401 and resp.headers["x-should-retry"] == "false"
        async with http.get(f"{gw.url}/api/v1/models") as resp:
            assert resp.status == 200 and "x-should-retry" not in resp.headers


async def test_a_model_whose_provider_has_no_key_is_not_listed_and_not_retryable(start_gateway):
    gw = await start_gateway(NO_KEY)
    key, _ = await gw.key(1)
    client = gw.openai(key)
    assert [m.id for m in (await client.models.list()).data] == ["demo/echo"]
    listing = await client.get("/chat/models", cast_to=dict)
    assert {m["id"]: m["available"] for m in listing["models"]} == {"demo/echo": True, "nokey/m": False}
    with pytest.raises(openai.BadRequestError) as info:
        await openai.AsyncOpenAI(base_url=f"{gw.url}/api/v1", api_key=key, max_retries=3).chat.completions.create(
            model="nokey/m", messages=HI)
    assert info.value.code == "model_not_available" and "SURELY_UNSET_KEY_VAR" in info.value.message
    assert info.value.response.headers["x-should-retry"] == "false"
    with pytest.raises(anthropic.BadRequestError) as info:
        await gw.anthropic(key).messages.create(model="nokey/m", max_tokens=5, messages=HI)
    assert info.value.body["error"]["type"] == "invalid_request_error"


NAMESPACE_TOOLS = [{"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}},
                   {"type": "namespace", "name": "agents", "description": "sub-agents",
                    "tools": [{"type": "function", "name": "spawn", "description": "start a sub-agent",
                               "parameters": {"type": "object", "properties": {"task": {"type": "string"}}}}]},
                   {"type": "web_search"}]


async def test_namespace_function_tools_reach_the_upstream_and_round_trip(start_gateway, fake_openai):
    gw = await start_gateway(openai_upstream(fake_openai))
    key, _ = await gw.key(10)
    client = gw.openai(key)
    fake_openai.enqueue(Reply(text="", tool_calls=[ToolCallSpec("agents__spawn", '{"task":"tests"}', id="call_1")],
                              stop="tool_use"))
    resp = await client.responses.create(model="up/gpt", input="run the tests in a sub-agent",
                                         tools=NAMESPACE_TOOLS)
    sent = [t["function"]["name"] for t in fake_openai.requests[-1].body["tools"]]
    assert sent == ["shell", "agents__spawn"]                    # hosted tools are still ignored
    call = resp.output[0].model_dump()
    assert (call["type"], call["name"], call["namespace"], call["arguments"]) == (
        "function_call", "spawn", "agents", '{"task":"tests"}')
    fake_openai.enqueue(Reply(text="done"))
    follow = await client.responses.create(model="up/gpt", tools=NAMESPACE_TOOLS, input=[
        {"role": "user", "content": "run the tests in a sub-agent"}, call,
        {"type": "function_call_output", "call_id": "call_1", "output": "3 passed"}])
    assert follow.output_text == "done"
    replayed = fake_openai.requests[-1].body["messages"][1]["tool_calls"][0]["function"]["name"]
    assert replayed == "agents__spawn"


async def test_namespace_calls_stream_with_the_clients_names(gw):
    key, _ = await gw.key(10)
    events = [e async for e in await gw.openai(key).responses.create(
        model="demo/echo", input="please spawn one", tools=NAMESPACE_TOOLS, stream=True)]
    added = [e.item for e in events if e.type == "response.output_item.added"]
    assert added[0].type == "function_call" and (added[0].name, added[0].namespace) == ("spawn", "agents")


@pytest.mark.parametrize("header", ["Basic dXNlcjpwYXNz", "chk_missing_the_scheme", "Bearer"])
async def test_a_key_without_the_bearer_scheme_is_a_401_saying_how(gw, header):
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/api/v1/chat/completions", json={"model": "demo/echo", "messages": HI},
                             headers={"Authorization": header}) as resp:
            body = await resp.json()
    assert resp.status == 401 and "Authorization: Bearer chk_" in body["error"]["message"]
    assert "missing_the_scheme" not in body["error"]["message"]       # never echo a credential


@pytest.mark.parametrize("path", ["/api", "/api/v1", "/api/v1/"])
async def test_the_base_url_answers_a_probe(gw, path):
    async with aiohttp.ClientSession() as http:
        for method in ("HEAD", "GET"):
            async with http.request(method, gw.url + path) as resp:
                assert resp.status == 200, (method, path)

