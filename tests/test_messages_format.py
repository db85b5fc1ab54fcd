"""Format B (messages) end to end with the official anthropic SDK: pass-through to an
Anthropic upstream, faithful translation to others, model-id resolution, errors in the
messages error shape, and exact billing."""
import json

import aiohttp
import anthropic
import pytest

from tests.conformance.wire import parse_sse
from tests.conftest import DEMO_MODELS, MICRO, UPSTREAM_PRICES, anthropic_upstream, openai_upstream
from tests.conftest import upstream_cost as cost
from tests.fakes import Reply, ToolCallSpec

WEATHER = {"name": "get_weather", "description": "Weather for a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
HI = [{"role": "user", "content": "hi"}]



@pytest.fixture
async def setup(start_gateway, fake_anthropic, fake_openai):
    providers = {**anthropic_upstream(fake_anthropic)["providers"], **openai_upstream(fake_openai)["providers"]}
    cfg = {"providers": providers, "models": {"chat": DEMO_MODELS + [
            {"id": "anthropic/claude-sonnet-4-5", "provider": "up-anthropic", "upstream": "claude-sonnet-4-5",
             **UPSTREAM_PRICES},
            {"id": "anthropic/claude-haiku-4-5", "provider": "up-anthropic", "upstream": "claude-haiku-4-5",
             "list_input_usd_per_mtok": 1, "list_output_usd_per_mtok": 5},
            {"id": "up/gpt", "provider": "up-openai", "upstream": "gpt-4o-mini", **UPSTREAM_PRICES}]}}
    gw = await start_gateway(cfg)
    key, account = await gw.key(1)
    return gw, fake_anthropic, fake_openai, gw.anthropic(key), account


# ---- Anthropic upstream: the client's request and the provider's answer pass unchanged

async def test_anthropic_upstream_gets_the_body_as_sent_and_answers_unchanged(setup):
    gw, fake, _, client, account = setup
    fake.enqueue(Reply(text="Hello.", input_tokens=30, output_tokens=4))
    system = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    msg = await client.messages.create(model="claude-sonnet-4-5-20250929", max_tokens=200, system=system,
                                       messages=HI, metadata={"user_id": "u1"},
                                       extra_headers={"anthropic-beta": "some-beta-2026"})
    assert msg.content[0].text == "Hello." and msg.stop_reason == "end_turn"
    assert msg.model == "claude-sonnet-4-5" and msg.id.startswith("msg_")         # the provider's own message
    assert (msg.usage.input_tokens, msg.usage.output_tokens) == (30, 4)
    sent = fake.requests[-1]
    assert sent.rejected is None
    assert sent.body == {"model": "claude-sonnet-4-5", "max_tokens": 200, "system": system, "messages": HI,
                         "metadata": {"user_id": "u1"}}
    assert sent.headers["anthropic-beta"] == "some-beta-2026"
    assert sent.headers["x-api-key"] == "sk-ant-test-upstream" and "chk_" not in json.dumps(sent.headers)
    # billed: "hi" + "Be brief." = 11 chars -> 3 tokens estimated; 4 output tokens
    row = await gw.store.fetchone("SELECT endpoint, usd_micro, model FROM usage")
    assert tuple(row) == ("messages", cost(3, 4), "anthropic/claude-sonnet-4-5")
    assert await gw.balance(account) == MICRO - cost(3, 4)


async def test_anthropic_stream_passes_frames_through(setup):
    gw, fake, _, client, _ = setup
    fake.enqueue(Reply(text="Checking.", reasoning="The user wants weather.",
                       tool_calls=[ToolCallSpec("get_weather", '{"city":"Paris"}'),
                                   ToolCallSpec("get_weather", '{"city":"Oslo"}')]))
    async with client.messages.stream(model="anthropic/claude-sonnet-4-5", max_tokens=2048, tools=[WEATHER],
                                      thinking={"type": "enabled", "budget_tokens": 1024},
                                      messages=[{"role": "user", "content": "Paris and Oslo?"}]) as stream:
        final = await stream.get_final_message()
    kinds = [b.type for b in final.content]
    assert kinds == ["thinking", "text", "tool_use", "tool_use"]
    assert final.content[0].signature                      # the signature survives for the next turn
    assert [b.input for b in final.content[2:]] == [{"city": "Paris"}, {"city": "Oslo"}]
    assert final.stop_reason == "tool_use"
    assert fake.requests[-1].body["thinking"] == {"type": "enabled", "budget_tokens": 1024}


async def test_tool_round_trip_with_thinking_goes_back_signed(setup):
    gw, fake, _, client, _ = setup
    fake.enqueue(Reply(text="", reasoning="Need weather.", tool_calls=[ToolCallSpec("get_weather", '{"city":"Paris"}')]),
                 Reply(text="14C."))
    messages = [{"role": "user", "content": "Paris?"}]
    first = await client.messages.create(model="anthropic/claude-sonnet-4-5", max_tokens=2048, tools=[WEATHER],
                                         thinking={"type": "enabled", "budget_tokens": 1024}, messages=messages)
    call = next(b for b in first.content if b.type == "tool_use")
    messages += [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "14C"}]}]
    second = await client.messages.create(model="anthropic/claude-sonnet-4-5", max_tokens=2048, tools=[WEATHER],
                                          thinking={"type": "enabled", "budget_tokens": 1024}, messages=messages)
    assert second.content[0].text == "14C." and fake.requests[-1].rejected is None


@pytest.mark.parametrize("asked,served", [
    ("anthropic/claude-sonnet-4-5", "claude-sonnet-4-5"),
    ("claude-sonnet-4-5", "claude-sonnet-4-5"),
    ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5"),
    ("claude-3-5-haiku-latest", "claude-haiku-4-5"),        # haiku tier -> the cheapest Anthropic model
    ("claude-haiku-4-5-20251001", "claude-haiku-4-5"),
])
async def test_model_ids_resolve_to_the_menu(setup, asked, served):
    gw, fake, _, client, _ = setup
    await client.messages.create(model=asked, max_tokens=10, messages=HI)
    assert fake.requests[-1].body["model"] == served


@pytest.mark.parametrize("model,words", [("claude-opus-9-99", "'claude-opus-9-99' is not served here"),
                                         ("svc/smart", "svc/smart is not available on /messages")])
async def test_unknown_ids_and_smart_are_400_in_the_messages_shape(setup, model, words):
    gw, fake, _, client, account = setup
    with pytest.raises(anthropic.BadRequestError) as info:
        await client.messages.create(model=model, max_tokens=10, messages=HI)
    assert info.value.body == {"type": "error", "error": {"type": "invalid_request_error",
                                                          "message": info.value.body["error"]["message"]},
                               "request_id": info.value.response.headers["x-request-id"]}   # as Anthropic's do
    assert words in info.value.body["error"]["message"]
    assert fake.requests == [] and await gw.balance(account) == MICRO


# ---- other upstreams: a faithful messages-format answer ------------------------------

async def test_openai_upstream_answers_as_a_message(setup):
    gw, _, fake, client, account = setup
    fake.enqueue(Reply(text="Hi there.", input_tokens=20, cache_read_tokens=5, output_tokens=3))
    msg = await client.messages.create(model="up/gpt", max_tokens=100, system="Be kind.", messages=HI,
                                       stop_sequences=["END"])
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == "Hi there."
    assert msg.stop_reason == "end_turn" and msg.model == "up/gpt"
    # OpenAI counts cached input inside prompt_tokens; the messages format counts it apart
    assert (msg.usage.input_tokens, msg.usage.cache_read_input_tokens, msg.usage.output_tokens) == (20, 5, 3)
    body = fake.requests[-1].body
    assert body["messages"] == [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "hi"}]
    assert (body["stop"], body["max_tokens"]) == (["END"], 100)
    assert await gw.balance(account) == MICRO - cost(3, 3)      # "Be kind." + "hi" = 10 chars


async def test_openai_upstream_streams_parallel_tool_calls_as_blocks(setup):
    gw, _, fake, client, _ = setup
    fake.enqueue(Reply(text="Let me check.", tool_calls=[ToolCallSpec("get_weather", '{"city":"Paris"}'),
                                                          ToolCallSpec("get_weather", '{"city":"Oslo"}')]))
    events = []
    async with client.messages.stream(model="up/gpt", max_tokens=100, tools=[WEATHER],
                                      tool_choice={"type": "any", "disable_parallel_tool_use": False},
                                      messages=[{"role": "user", "content": "Paris and Oslo?"}]) as stream:
        async for event in stream:
            events.append(event.type)
        final = await stream.get_final_message()
    assert [b.type for b in final.content] == ["text", "tool_use", "tool_use"]
    assert final.content[0].text == "Let me check."
    assert [b.input for b in final.content[1:]] == [{"city": "Paris"}, {"city": "Oslo"}]
    assert final.stop_reason == "tool_use"
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert events.count("content_block_start") == events.count("content_block_stop") == 3
    assert fake.requests[-1].body["tool_choice"] == "required"
    assert fake.requests[-1].body["parallel_tool_calls"] is True


async def test_tool_results_translate_to_tool_messages(setup):
    gw, _, fake, client, _ = setup
    fake.enqueue(Reply(text="", tool_calls=[ToolCallSpec("get_weather", '{"city":"Paris"}', id="call_1"),
                                            ToolCallSpec("get_weather", '{"city":"Oslo"}', id="call_2")]),
                 Reply(text="Paris 14C, Oslo 3C."))
    messages = [{"role": "user", "content": "Paris and Oslo?"}]
    first = await client.messages.create(model="up/gpt", max_tokens=100, tools=[WEATHER], messages=messages)
    assert first.stop_reason == "tool_use" and [b.id for b in first.content] == ["call_1", "call_2"]
    messages += [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
                 {"role": "user", "content": [
                     {"type": "text", "text": "Here you go."},
                     {"type": "tool_result", "tool_use_id": "call_2", "content": [{"type": "text", "text": "3C"}]},
                     {"type": "tool_result", "tool_use_id": "call_1", "content": "14C"}]}]
    second = await client.messages.create(model="up/gpt", max_tokens=100, tools=[WEATHER], messages=messages)
    assert second.content[0].text == "Paris 14C, Oslo 3C."
    sent = fake.requests[-1]
    assert sent.rejected is None
    assert sent.body["messages"][1]["tool_calls"][0]["function"] == {"name": "get_weather",
                                                                     "arguments": '{"city":"Paris"}'}
    assert sent.body["messages"][2:] == [{"role": "tool", "tool_call_id": "call_2", "content": "3C"},
                                         {"role": "tool", "tool_call_id": "call_1", "content": "14C"},
                                         {"role": "user", "content": "Here you go."}]


async def test_max_tokens_stop_and_demo_upstream(setup):
    gw, _, fake, client, _ = setup
    fake.enqueue(Reply(text="cut", stop="max_tokens"))
    msg = await client.messages.create(model="up/gpt", max_tokens=5, messages=HI)
    assert msg.stop_reason == "max_tokens"
    demo = await client.messages.create(model="demo/echo", max_tokens=100, messages=[{"role": "user", "content": "yo"}])
    assert "You said: yo" in demo.content[0].text and demo.stop_reason == "end_turn"


async def test_documents_cannot_go_to_a_non_anthropic_upstream(setup):
    gw, _, fake, client, account = setup
    with pytest.raises(anthropic.BadRequestError) as info:
        await client.messages.create(model="up/gpt", max_tokens=10, messages=[{"role": "user", "content": [
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}},
            {"type": "text", "text": "summarise"}]}])
    assert "document" in info.value.body["error"]["message"]
    assert fake.requests == [] and await gw.balance(account) == MICRO


async def test_failure_mid_stream_is_an_error_event(setup):
    gw, _, fake, client, account = setup
    fake.enqueue(Reply(text="a b c d e f", text_chunks=6, fail_after_events=2))
    with pytest.raises(anthropic.APIError):
        async with client.messages.stream(model="up/gpt", max_tokens=100, messages=HI) as stream:
            await stream.get_final_message()
    assert await gw.balance(account) == MICRO


async def test_the_error_event_names_the_request_as_anthropics_do(setup):
    gw, _, fake, _, _ = setup
    key, _ = await gw.key(1)
    fake.enqueue(Reply(text="a b c d e f", text_chunks=6, fail_after_events=2))
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{gw.url}/api/v1/messages", headers={"x-api-key": key},
                          json={"model": "up/gpt", "max_tokens": 100, "stream": True, "messages": HI}) as r:
            request_id, frames = r.headers["X-Request-Id"], parse_sse(await r.read())
    assert frames[-1].event == "error"
    assert json.loads(frames[-1].data)["request_id"] == request_id


# ---- keys, limits, errors --------------------------------------------------------------

async def raw_post(gw, headers, body):
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{gw.url}/api/v1/messages", headers=headers, json=body) as r:
            return r.status, await r.json()


async def test_keys_by_either_header_and_401s(setup):
    gw, fake, _, _, _ = setup
    key, _ = await gw.key(1)
    body = {"model": "demo/echo", "max_tokens": 10, "messages": HI}
    for headers in ({"x-api-key": key, "anthropic-version": "2023-06-01"},
                    {"Authorization": f"Bearer {key}", "anthropic-version": "2026-10-21"}):
        status, msg = await raw_post(gw, headers, body)
        assert status == 200 and msg["type"] == "message"
    status, err = await raw_post(gw, {}, body)
    assert status == 401 and err["error"]["type"] == "authentication_error"
    status, err = await raw_post(gw, {"x-api-key": "chk_wrong"}, body)
    assert status == 401 and err["error"]["type"] == "authentication_error"


async def test_402_413_and_field_errors_use_the_messages_shape(setup):
    gw, _, _, _, _ = setup
    key, account = await gw.key(0)
    status, err = await raw_post(gw, {"x-api-key": key}, {"model": "demo/echo", "max_tokens": 10, "messages": HI})
    assert status == 402 and err["error"]["type"] == "billing_error"
    status, err = await raw_post(gw, {"x-api-key": key}, {"model": "demo/echo", "max_tokens": 10,
                                                          "messages": [{"role": "user", "content": "x" * 800_001}]})
    assert status == 413 and err["error"]["type"] == "request_too_large"
    status, err = await raw_post(gw, {"x-api-key": key}, {"model": "demo/echo", "messages": HI})
    assert status == 400 and err == {"type": "error", "error": {"type": "invalid_request_error",
                                                                "message": "max_tokens: is required"},
                                     "request_id": err["request_id"]}
    assert isinstance(err["request_id"], str) and err["request_id"]
    status, err = await raw_post(gw, {"x-api-key": key}, {"model": "demo/echo", "max_tokens": 40000, "messages": HI})
    assert status == 400 and "at most 32768" in err["error"]["message"]


async def test_dropped_stream_charges_what_was_relayed(setup):
    import asyncio
    gw, _, fake, _, _ = setup
    key, account = await gw.key(1)
    fake.enqueue(Reply(text="word " * 100, text_chunks=100, chunk_delay=0.02, output_tokens=100))
    async with aiohttp.ClientSession() as s:
        resp = await s.post(f"{gw.url}/api/v1/messages", headers={"x-api-key": key},
                            json={"model": "up/gpt", "max_tokens": 500, "stream": True, "messages": HI})
        for _ in range(12):
            await resp.content.readline()
        resp.close()
    for _ in range(200):
        row = await gw.store.fetchone("SELECT outcome, output_tokens, usd_micro FROM usage WHERE account_id = ?",
                                      (account,))
        if row:
            break
        await asyncio.sleep(0.02)
    assert row["outcome"] == "client_gone" and 0 < row["output_tokens"] < 100
    assert row["usd_micro"] == cost(1, row["output_tokens"])
    assert await gw.balance(account) == MICRO - row["usd_micro"] == await gw.ledger_sum(account)
