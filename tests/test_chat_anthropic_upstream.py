"""A format-A client (the official openai SDK) served by the Anthropic provider, against
a strict fake Anthropic Messages API that refuses what the real one refuses."""
import json

import openai
import pytest

from tests.conftest import MICRO, anthropic_upstream
from tests.fakes import Reply, ToolCallSpec

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}


@pytest.fixture
async def setup(start_gateway, fake_anthropic):
    gw = await start_gateway(anthropic_upstream(fake_anthropic))
    key, account = await gw.key(1)
    return gw, fake_anthropic, gw.openai(key), account


async def test_text_with_system_prompts_and_dropped_sampling(setup):
    gw, fake, client, _ = setup
    fake.enqueue(Reply(text="Bonjour.", input_tokens=20, cache_read_tokens=5, output_tokens=3))
    resp = await client.chat.completions.create(
        model="up/claude", temperature=0.3, top_p=0.9,
        messages=[{"role": "system", "content": "Be terse."}, {"role": "developer", "content": "French only."},
                  {"role": "user", "content": "Say hello"}])
    assert resp.choices[0].message.content == "Bonjour."
    assert resp.choices[0].finish_reason == "stop"
    # OpenAI's prompt_tokens include cached tokens; Anthropic's input_tokens exclude them.
    assert resp.usage.prompt_tokens == 25 and resp.usage.prompt_tokens_details.cached_tokens == 5
    sent = fake.requests[-1]
    assert sent.rejected is None
    assert sent.headers["anthropic-version"] == "2026-10-21" and sent.headers["x-api-key"] == "sk-ant-test-upstream"
    assert sent.body["system"] == [{"type": "text", "text": "Be terse."}, {"type": "text", "text": "French only."}]
    assert "temperature" not in sent.body and "top_p" not in sent.body   # refused under 2026-10-21


async def test_older_api_version_keeps_sampling(start_gateway, fake_anthropic):
    gw = await start_gateway(anthropic_upstream(fake_anthropic, version="2023-06-01"))
    key, _ = await gw.key(1)
    await gw.openai(key).chat.completions.create(model="up/claude", temperature=0.3,
                                                 messages=[{"role": "user", "content": "hi"}])
    assert fake_anthropic.requests[-1].rejected is None
    assert fake_anthropic.requests[-1].body["temperature"] == 0.3


@pytest.mark.parametrize("stop,finish", [("max_tokens", "length"), ("stop_sequence", "stop"),
                                         ("content_filter", "content_filter")])
async def test_stop_reasons_are_mapped(setup, stop, finish):
    gw, fake, client, _ = setup
    fake.enqueue(Reply(text="partial", stop=stop, stop_sequence="END" if stop == "stop_sequence" else None))
    resp = await client.chat.completions.create(model="up/claude", messages=[{"role": "user", "content": "hi"}])
    assert resp.choices[0].finish_reason == finish


async def test_streamed_parallel_tool_calls_have_distinct_indices(setup):
    gw, fake, client, account = setup
    fake.enqueue(Reply(text="Checking both.", reasoning="Two cities.", input_tokens=50, output_tokens=40,
                       tool_calls=[ToolCallSpec("get_weather", '{"city":"Paris"}'),
                                   ToolCallSpec("get_weather", '{"city":"Oslo"}')]))
    stream = await client.chat.completions.create(model="up/claude", stream=True, tools=[WEATHER],
                                                  messages=[{"role": "user", "content": "Paris and Oslo?"}])
    calls: dict[int, dict] = {}
    text, finish, usage = "", None, None
    async for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for tc in choice.delta.tool_calls or []:
                entry = calls.setdefault(tc.index, {"id": tc.id, "name": tc.function.name, "args": ""})
                entry["args"] += tc.function.arguments or ""
            finish = choice.finish_reason or finish
    assert text == "Checking both." and finish == "tool_calls"
    assert sorted(calls) == [0, 1]
    assert [json.loads(calls[i]["args"]) for i in (0, 1)] == [{"city": "Paris"}, {"city": "Oslo"}]
    assert usage.prompt_tokens == 50 and usage.completion_tokens == 40
    sent = fake.requests[-1].body
    assert sent["tools"] == [{"name": "get_weather", "description": "Weather for a city",
                              "input_schema": WEATHER["function"]["parameters"]}]


async def test_tool_round_trip_translates_tool_messages_into_tool_results(setup):
    gw, fake, client, _ = setup
    fake.enqueue(Reply(text="", tool_calls=[ToolCallSpec("get_weather", '{"city":"Paris"}'),
                                            ToolCallSpec("get_weather", '{"city":"Oslo"}')]),
                 Reply(text="Paris 14C, Oslo 3C."))
    messages = [{"role": "user", "content": "Paris and Oslo?"}]
    first = await client.chat.completions.create(model="up/claude", tools=[WEATHER], tool_choice="required",
                                                 parallel_tool_calls=False, messages=messages)
    calls = first.choices[0].message.tool_calls
    assert len(calls) == 2 and first.choices[0].message.content is None
    assert fake.requests[-1].body["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    # The SDK's own assistant message has content None plus tool_calls; then two tool
    # messages and a user follow-up. Anthropic needs one user turn with both results first.
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": calls[0].id, "content": "14C"},
                 {"role": "tool", "tool_call_id": calls[1].id, "content": "3C"},
                 {"role": "user", "content": "Thanks, summarise."}]
    second = await client.chat.completions.create(model="up/claude", tools=[WEATHER], messages=messages)
    assert second.choices[0].message.content == "Paris 14C, Oslo 3C."
    sent = fake.requests[-1]
    assert sent.rejected is None
    assert [m["role"] for m in sent.body["messages"]] == ["user", "assistant", "user"]
    assistant, results = sent.body["messages"][1], sent.body["messages"][2]["content"]
    assert [b["type"] for b in assistant["content"]] == ["tool_use", "tool_use"]   # no empty text block
    assert [b["type"] for b in results] == ["tool_result", "tool_result", "text"]
    assert [b["tool_use_id"] for b in results[:2]] == [calls[0].id, calls[1].id]


async def test_data_url_images_become_base64_blocks(setup):
    gw, fake, client, _ = setup
    await client.chat.completions.create(model="up/claude", messages=[{"role": "user", "content": [
        {"type": "text", "text": "What is it?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}}]}])
    sent = fake.requests[-1]
    assert sent.rejected is None
    blocks = sent.body["messages"][0]["content"]
    assert blocks[1] == {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                     "data": "iVBORw0KGgo="}}
    assert blocks[2] == {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}}


async def test_unsupported_image_type_is_a_clear_400_before_the_upstream(setup):
    gw, fake, client, account = setup
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model="up/claude", messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/bmp;base64,Qk0="}}]}])
    assert "image/bmp" in info.value.message
    assert fake.requests == [] and await gw.balance(account) == MICRO


async def test_overloaded_mid_stream_reaches_the_client_uncharged(setup):
    gw, fake, client, account = setup
    fake.enqueue(Reply(text="a b c d e f", text_chunks=6, fail_after_events=2))
    stream = await client.chat.completions.create(model="up/claude", stream=True,
                                                  messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.APIError) as info:
        async for _ in stream:
            pass
    assert "overloaded" in str(info.value.message)
    assert await gw.balance(account) == MICRO


async def test_anthropic_errors_before_the_stream_keep_their_status(setup):
    gw, fake, client, account = setup
    fake.enqueue(Reply(error_status=529, error_message="Overloaded"))
    with pytest.raises(openai.InternalServerError) as info:
        await client.chat.completions.create(model="up/claude", stream=True,
                                             messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 502 and "Overloaded" in info.value.message
    assert await gw.balance(account) == MICRO
