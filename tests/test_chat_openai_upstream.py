"""Format A (chat completions) end to end: the official openai SDK -> gateway -> a strict
fake OpenAI upstream. Money is checked to the micro-USD.

Prices (conftest.UPSTREAM_PRICES): service 1.00 / 4.00 USD per million tokens, so a call
costs input_tokens x 1 + output_tokens x 4 micro-USD, rounded up once.
"""
import json

import openai
import pytest

from tests.conftest import MICRO, openai_upstream, upstream_cost as cost
from tests.fakes import Reply, ToolCallSpec

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}



@pytest.fixture
async def setup(start_gateway, fake_openai):
    gw = await start_gateway(openai_upstream(fake_openai))
    key, account = await gw.key(1)
    return gw, fake_openai, gw.openai(key), account


async def test_plain_completion_bills_exactly(setup):
    gw, fake, client, account = setup
    fake.enqueue(Reply(text="Paris is sunny.", input_tokens=40, output_tokens=9))
    content = "What is the weather in Paris?"          # 29 chars -> 8 tokens estimated
    resp = await client.chat.completions.create(model="up/gpt", max_tokens=100,
                                                messages=[{"role": "user", "content": content}])
    assert resp.choices[0].message.content == "Paris is sunny."
    assert resp.choices[0].finish_reason == "stop"
    assert resp.model == "up/gpt"
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (40, 9)
    billing = resp.model_extra["billing"]
    assert billing["input_tokens_billed"] == 8 and billing["output_tokens_billed"] == 9
    assert billing["usd"] == cost(8, 9) / MICRO == 0.000044
    assert billing["quote_usd"] == billing["ceiling_usd"] == cost(8, 100) / MICRO
    assert billing["list_usd"] == 0.000088          # list price is twice the service price
    assert await gw.balance(account) == MICRO - cost(8, 9)
    assert await gw.ledger_sum(account) == MICRO - cost(8, 9)


async def test_client_key_never_goes_upstream(setup):
    gw, fake, client, _ = setup
    await client.chat.completions.create(model="up/gpt", messages=[{"role": "user", "content": "hi"}])
    sent = fake.requests[-1]
    assert sent.headers["authorization"] == "Bearer sk-test-upstream"
    assert "chk_" not in json.dumps(sent.headers)
    assert sent.body["model"] == "gpt-4o-mini" and sent.body["max_tokens"] == 1024


async def test_passthrough_parameters_reach_upstream(setup):
    gw, fake, client, _ = setup
    await client.chat.completions.create(model="up/gpt", messages=[{"role": "user", "content": "hi"}],
                                         seed=7, temperature=0.2, stop=["END"], user="u-1")
    body = fake.requests[-1].body
    assert (body["seed"], body["temperature"], body["stop"], body["user"]) == (7, 0.2, ["END"], "u-1")
    assert fake.requests[-1].rejected is None


async def test_reasoning_models_get_max_completion_tokens(start_gateway, fake_openai):
    gw = await start_gateway(openai_upstream(fake_openai, max_tokens_field="max_completion_tokens"))
    key, _ = await gw.key(1)
    await gw.openai(key).chat.completions.create(model="up/reasoner", max_completion_tokens=50,
                                                 messages=[{"role": "user", "content": "hi"}])
    assert fake_openai.requests[-1].rejected is None
    assert fake_openai.requests[-1].body["max_completion_tokens"] == 50
    assert "max_tokens" not in fake_openai.requests[-1].body


async def test_stream_relays_chunks_usage_and_billing(setup):
    gw, fake, client, account = setup
    fake.enqueue(Reply(text="one two three four", input_tokens=30, output_tokens=12, text_chunks=4))
    stream = await client.chat.completions.create(model="up/gpt", stream=True, max_tokens=64,
                                                  messages=[{"role": "user", "content": "count to four"}])
    chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "one two three four"
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 4   # not buffered into one
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    last = chunks[-1]
    assert last.choices == [] and (last.usage.prompt_tokens, last.usage.completion_tokens) == (30, 12)
    # "count to four" = 13 chars -> 4 tokens estimated
    assert last.model_extra["billing"]["usd"] == cost(4, 12) / MICRO
    assert fake.requests[-1].body["stream_options"] == {"include_usage": True}
    assert await gw.balance(account) == MICRO - cost(4, 12)


async def test_streamed_parallel_tool_calls_keep_their_indices(setup):
    gw, fake, client, _ = setup
    fake.enqueue(Reply(text="", tool_calls=[ToolCallSpec("get_weather", '{"city":"Paris"}'),
                                            ToolCallSpec("get_weather", '{"city":"Oslo"}')]))
    stream = await client.chat.completions.create(model="up/gpt", stream=True, tools=[WEATHER],
                                                  messages=[{"role": "user", "content": "Paris and Oslo?"}])
    calls: dict[int, dict] = {}
    finish = None
    async for chunk in stream:
        for choice in chunk.choices:
            for tc in choice.delta.tool_calls or []:
                entry = calls.setdefault(tc.index, {"id": None, "name": None, "args": ""})
                entry["id"] = tc.id or entry["id"]
                entry["name"] = (tc.function.name if tc.function else None) or entry["name"]
                entry["args"] += (tc.function.arguments or "") if tc.function else ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls"
    assert sorted(calls) == [0, 1]
    assert [json.loads(calls[i]["args"]) for i in (0, 1)] == [{"city": "Paris"}, {"city": "Oslo"}]
    assert calls[0]["id"] != calls[1]["id"]


async def test_tool_round_trip_is_accepted_by_the_upstream(setup):
    gw, fake, client, _ = setup
    fake.enqueue(Reply(text="", tool_calls=[ToolCallSpec("get_weather", '{"city":"Paris"}')]),
                 Reply(text="It is 14C in Paris."))
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    first = await client.chat.completions.create(model="up/gpt", tools=[WEATHER], tool_choice="auto",
                                                 messages=messages)
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 14}'}]
    second = await client.chat.completions.create(model="up/gpt", tools=[WEATHER], messages=messages)
    assert second.choices[0].message.content == "It is 14C in Paris."
    sent = fake.requests[-1]
    assert sent.rejected is None
    assert sent.body["messages"][-1] == {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 14}'}
    assert fake.requests[0].body["tool_choice"] == "auto"


async def test_image_parts_reach_the_upstream(setup):
    gw, fake, client, _ = setup
    image = "data:image/png;base64,iVBORw0KGgo="
    await client.chat.completions.create(model="up/gpt", messages=[{"role": "user", "content": [
        {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": image}}]}])
    parts = fake.requests[-1].body["messages"][0]["content"]
    assert parts[1] == {"type": "image_url", "image_url": {"url": image}}


@pytest.mark.parametrize("status,expected,sdk_error", [
    (500, 502, openai.InternalServerError),
    (400, 400, openai.BadRequestError),
    (429, 429, openai.RateLimitError),
])
async def test_upstream_errors_are_mapped_and_never_charged(setup, status, expected, sdk_error):
    gw, fake, client, account = setup
    fake.enqueue(Reply(error_status=status, error_message="boom"))
    with pytest.raises(sdk_error) as info:
        await client.chat.completions.create(model="up/gpt", messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == expected
    assert "boom" in info.value.message
    assert await gw.balance(account) == MICRO
    assert await gw.ledger_sum(account) == MICRO


async def test_failure_mid_stream_reaches_the_client_and_is_not_charged(setup):
    gw, fake, client, account = setup
    fake.enqueue(Reply(text="a b c d e f", text_chunks=6, fail_after_events=2))
    stream = await client.chat.completions.create(model="up/gpt", stream=True,
                                                  messages=[{"role": "user", "content": "hi"}])
    got = []
    with pytest.raises(openai.APIError) as info:
        async for chunk in stream:
            got.append(chunk)
    assert "mid-stream" in str(info.value.message)
    assert got, "the chunks before the failure were relayed"
    assert await gw.balance(account) == MICRO


async def test_upstream_unreachable_is_502_uncharged(start_gateway):
    cfg = {"providers": {"dead": {"type": "openai", "base_url": "http://127.0.0.1:9/v1", "api_key": "x"}},
           "models": {"chat": [{"id": "dead/m", "provider": "dead", "list_input_usd_per_mtok": 1,
                                "list_output_usd_per_mtok": 1}]}}
    gw = await start_gateway(cfg)
    key, account = await gw.key(1)
    with pytest.raises(openai.InternalServerError) as info:
        await gw.openai(key).chat.completions.create(model="dead/m", messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == 502 and "could not reach dead" in info.value.message
    assert await gw.balance(account) == MICRO


async def test_upstream_cut_off_mid_body_is_502_uncharged(start_gateway, aiohttp_server):
    from aiohttp import web

    async def truncated(request):
        resp = web.StreamResponse(headers={"Content-Type": "application/json", "Content-Length": "500"})
        await resp.prepare(request)
        await resp.write(b'{"id": "chatcmpl-1", "choices": [')
        request.transport.close()               # the upstream dies halfway through its answer
        return resp
    app = web.Application()
    app.router.add_post("/v1/chat/completions", truncated)
    server = await aiohttp_server(app)
    gw = await start_gateway({"providers": {"cut": {"type": "openai", "base_url": str(server.make_url("/v1")),
                                                    "api_key": "x"}},
                              "models": {"chat": [{"id": "cut/m", "provider": "cut", "list_input_usd_per_mtok": 1,
                                                   "list_output_usd_per_mtok": 1}]}})
    key, account = await gw.key(1)
    with pytest.raises(openai.InternalServerError) as info:
        await gw.openai(key).chat.completions.create(model="cut/m", messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == 502 and "mid-response" in info.value.message
    assert await gw.balance(account) == MICRO
