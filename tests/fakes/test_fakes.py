"""Self-test of the fake upstreams, driven by the official SDKs (no gateway involved).

If the vendors' own clients parse what the fakes send, and the fakes refuse
what the vendors refuse, gateway tests built on them mean something.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import anthropic
import openai
import pytest

from . import FakeAnthropic, FakeOpenAIChat, Reply, ToolCallSpec

pytestmark = pytest.mark.asyncio

WEATHER_TOOL_OPENAI = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
WEATHER_TOOL_ANTHROPIC = {
    "name": "get_weather",
    "description": "Get weather",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
TWO_CALLS = [
    ToolCallSpec("get_weather", '{"city":"Paris"}'),
    ToolCallSpec("get_weather", '{"city":"Tokyo"}', id="call_fixed_2"),
]


@pytest.fixture
async def openai_fake(aiohttp_server):
    fake = FakeOpenAIChat()
    server = await aiohttp_server(fake.app)
    client = openai.AsyncOpenAI(base_url=str(server.make_url("/v1")), api_key=fake.api_key, max_retries=0)
    yield fake, client, server
    await client.close()


@pytest.fixture
async def anthropic_fake(aiohttp_server):
    fake = FakeAnthropic()
    server = await aiohttp_server(fake.app)
    client = anthropic.AsyncAnthropic(base_url=str(server.make_url("")), api_key=fake.api_key, max_retries=0)
    yield fake, client, server
    await client.close()


async def post(server, path: str, body: dict, headers: dict[str, str]) -> tuple[int, dict, Any]:
    """Raw request, for what the SDKs would not let us send."""
    async with aiohttp.ClientSession() as session:
        async with session.post(server.make_url(path), json=body, headers=headers) as response:
            return response.status, await response.json(), response.headers


# ---------------------------------------------------------------- OpenAI


async def test_openai_plain_completion(openai_fake):
    fake, client, _ = openai_fake
    fake.enqueue(Reply(text="Hi there", cache_read_tokens=5))
    result = await client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "Hello"}], max_completion_tokens=50
    )
    assert result.model == "gpt-4o"
    assert result.choices[0].message.content == "Hi there"
    assert result.choices[0].finish_reason == "stop"
    assert result.usage.prompt_tokens == 17  # 12 uncached + 5 cached
    assert result.usage.prompt_tokens_details.cached_tokens == 5
    assert result.usage.total_tokens == 24
    recorded = fake.requests[0]
    assert recorded.rejected is None
    assert recorded.headers["authorization"] == "Bearer sk-test-upstream"
    assert recorded.body["messages"][0]["content"] == "Hello"


async def test_openai_stream_parallel_tool_calls(openai_fake):
    fake, client, _ = openai_fake
    fake.enqueue(Reply(text="", tool_calls=TWO_CALLS))
    stream = await client.chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "Weather in Paris and Tokyo?"}],
        tools=[WEATHER_TOOL_OPENAI],
        stream=True,
        stream_options={"include_usage": True},
    )
    calls: dict[int, dict] = {}
    finish, usage, chunks = None, None, 0
    async for chunk in stream:
        chunks += 1
        if not chunk.choices:
            usage = chunk.usage
            continue
        assert chunk.usage is None
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for delta in choice.delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"id": None, "name": None, "arguments": "", "fragments": 0})
            if delta.id:
                call["id"], call["name"] = delta.id, delta.function.name
            else:
                call["fragments"] += 1
            call["arguments"] += delta.function.arguments or ""
    assert sorted(calls) == [0, 1]
    assert [json.loads(calls[i]["arguments"]) for i in (0, 1)] == [{"city": "Paris"}, {"city": "Tokyo"}]
    assert calls[0]["id"].startswith("call_") and calls[1]["id"] == "call_fixed_2"
    assert all(call["fragments"] >= 2 for call in calls.values())
    assert finish == "tool_calls"
    assert usage.prompt_tokens == 12 and usage.completion_tokens == 7


async def test_openai_stream_wire_framing(openai_fake):
    """data:-only lines, no usage chunk unless asked, [DONE] last."""
    fake, _, server = openai_fake
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}], "stream": True}
    async with aiohttp.ClientSession() as session:
        async with session.post(
            server.make_url("/v1/chat/completions"), json=body, headers={"Authorization": "Bearer sk-test-upstream"}
        ) as response:
            assert response.headers["Content-Type"].startswith("text/event-stream")
            raw = (await response.read()).decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events[:-1])
    chunks = [json.loads(e[6:]) for e in events[:-2]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
    assert all("usage" not in c and c["choices"] for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == Reply().text


async def test_openai_non_stream_tool_calls(openai_fake):
    fake, client, _ = openai_fake
    fake.enqueue(Reply(text="", tool_calls=TWO_CALLS, stop="max_tokens"))
    result = await client.chat.completions.create(
        model="gpt-5", messages=[{"role": "user", "content": "Hi"}], tools=[WEATHER_TOOL_OPENAI]
    )
    message = result.choices[0].message
    assert message.content is None
    assert [c.function.arguments for c in message.tool_calls] == ['{"city":"Paris"}', '{"city":"Tokyo"}']
    assert result.choices[0].finish_reason == "length"  # an explicit stop wins over the tool stop


async def test_stream_records_client_disconnect(openai_fake):
    fake, _, server = openai_fake
    fake.enqueue(Reply(text="x" * 50, text_chunks=50, chunk_delay=0.01))
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}], "stream": True}
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            server.make_url("/v1/chat/completions"), json=body, headers={"Authorization": "Bearer sk-test-upstream"}
        )
        await response.content.readline()
        response.close()
    for _ in range(50):
        if fake.requests[-1].disconnected:
            break
        await asyncio.sleep(0.01)
    assert fake.requests[-1].disconnected


async def test_openai_rejects_unanswered_tool_call(openai_fake):
    fake, client, _ = openai_fake
    messages = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
            ],
        },
        {"role": "user", "content": "Well?"},
    ]
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model="gpt-4o", messages=messages, tools=[WEATHER_TOOL_OPENAI])
    assert "did not have response messages: call_1" in caught.value.message
    assert caught.value.body["param"] == "messages.[1].role"
    assert fake.requests[-1].rejected.startswith("An assistant message with 'tool_calls'")


@pytest.mark.parametrize(
    "extra, fragment",
    [
        ({"foo": 1}, "Unrecognized request argument supplied: foo"),
        ({"stream_options": {"include_usage": True}}, "only allowed when 'stream' is enabled"),
        ({"model": "o3-mini", "max_tokens": 10}, "Use 'max_completion_tokens' instead."),
        ({"tool_choice": "auto"}, "'tool_choice' is only allowed when 'tools' are specified"),
        ({"n": 2}, "n=1"),
        ({"messages": []}, "empty array"),
        ({"messages": [{"role": "tool", "tool_call_id": "call_x", "content": "1"}]}, "preceeding message"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "ftp://x"}}]}]}, "url"),
        (
            {"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
              "function": {"name": "f", "arguments": {"a": 1}}}]}]},
            "expected a string, but got an object",
        ),
    ],
)  # fmt: skip
async def test_openai_rejections(openai_fake, extra, fragment):
    fake, _, server = openai_fake
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}], **extra}
    status, payload, _ = await post(server, "/v1/chat/completions", body, {"Authorization": "Bearer sk-test-upstream"})
    assert status == 400
    assert set(payload["error"]) == {"message", "type", "param", "code"}
    assert fragment in payload["error"]["message"]
    assert fake.requests[-1].rejected == payload["error"]["message"]


async def test_openai_auth_and_scripted_errors(openai_fake):
    fake, client, server = openai_fake
    status, payload, _ = await post(
        server, "/v1/chat/completions", {"model": "gpt-4o", "messages": []}, {"Authorization": "Bearer wrong"}
    )
    assert status == 401 and payload["error"]["code"] == "invalid_api_key"
    fake.enqueue(Reply(error_status=429, error_message="slow down"))
    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Hi"}])
    assert caught.value.response.headers["retry-after"] == "1"
    assert caught.value.body["message"] == "slow down"


async def test_openai_mid_stream_error(openai_fake):
    fake, client, _ = openai_fake
    fake.enqueue(Reply(text="abcdefgh", text_chunks=4, fail_after_events=2))
    stream = await client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "Hi"}], stream=True
    )
    received = []
    with pytest.raises(openai.APIError, match="fake upstream error"):
        async for chunk in stream:
            received.append(chunk.choices[0].delta.content)
    assert "".join(r or "" for r in received) == "abcd"  # two deltas of "ab|cd|ef|gh"


# ---------------------------------------------------------------- Anthropic


async def test_anthropic_plain_message(anthropic_fake):
    fake, client, _ = anthropic_fake
    fake.enqueue(Reply(text="Bonjour", cache_read_tokens=4))
    result = await client.messages.create(
        model="claude-sonnet-4-6", max_tokens=100, messages=[{"role": "user", "content": "Hello"}]
    )
    assert result.model == "claude-sonnet-4-6"
    assert [b.type for b in result.content] == ["text"] and result.content[0].text == "Bonjour"
    assert result.stop_reason == "end_turn"
    assert result.usage.input_tokens == 12 and result.usage.cache_read_input_tokens == 4
    recorded = fake.requests[0]
    assert recorded.rejected is None
    assert recorded.headers["anthropic-version"] in ("2023-06-01", "2026-10-21")
    assert recorded.headers.get("authorization") == "Bearer sk-ant-test-upstream" or (
        recorded.headers.get("x-api-key") == "sk-ant-test-upstream"
    )


async def test_anthropic_stream_thinking_and_tool_use(anthropic_fake):
    fake, client, _ = anthropic_fake
    fake.enqueue(Reply(reasoning="The user wants weather.", text="Checking.", tool_calls=TWO_CALLS[:1]))
    async with client.messages.stream(
        model="claude-sonnet-4-6",
        max_tokens=4096,
        thinking={"type": "enabled", "budget_tokens": 1024},
        tools=[WEATHER_TOOL_ANTHROPIC],
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    ) as stream:
        final = await stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use"]
    thinking, text, tool_use = final.content
    assert thinking.thinking == "The user wants weather." and thinking.signature
    assert text.text == "Checking."
    assert tool_use.id.startswith("toolu_") and tool_use.input == {"city": "Paris"}
    assert final.stop_reason == "tool_use"
    assert final.usage.output_tokens == 7 and final.usage.input_tokens == 12


async def test_anthropic_tool_round_trip_and_thinking_rule(anthropic_fake):
    """A correct tool_result turn passes; dropping the thinking block is refused."""
    fake, client, _ = anthropic_fake
    tool_use = {"type": "tool_use", "id": "toolu_01A", "name": "get_weather", "input": {"city": "Paris"}}
    thinking = {"type": "thinking", "thinking": "hmm", "signature": "sig"}
    answer = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01A", "content": "14C"}]}
    common = dict(
        model="claude-sonnet-4-6",
        max_tokens=2048,
        thinking={"type": "enabled", "budget_tokens": 1024},
        tools=[WEATHER_TOOL_ANTHROPIC],
    )
    ask = {"role": "user", "content": "Weather?"}
    ok = await client.messages.create(
        messages=[ask, {"role": "assistant", "content": [thinking, tool_use]}, answer], **common
    )
    assert ok.stop_reason == "end_turn"
    with pytest.raises(anthropic.BadRequestError, match="Expected `thinking` or `redacted_thinking`"):
        await client.messages.create(messages=[ask, {"role": "assistant", "content": [tool_use]}, answer], **common)


async def test_anthropic_rejects_empty_text_block(anthropic_fake):
    fake, client, _ = anthropic_fake
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client.messages.create(
            model="claude-sonnet-4-6",
            max_tokens=100,
            messages=[{"role": "user", "content": [{"type": "text", "text": ""}]}],
        )
    assert caught.value.status_code == 400
    assert caught.value.body["error"] == {
        "type": "invalid_request_error",
        "message": "messages: text content blocks must be non-empty",
    }
    assert caught.value.body["request_id"].startswith("req_")
    assert fake.requests[-1].rejected == "messages: text content blocks must be non-empty"


async def test_anthropic_mid_stream_error(anthropic_fake):
    fake, client, _ = anthropic_fake
    fake.enqueue(Reply(text="partial answer here", fail_after_events=1))
    with pytest.raises(anthropic.APIError, match="overloaded_error"):
        async with client.messages.stream(
            model="claude-sonnet-4-6", max_tokens=100, messages=[{"role": "user", "content": "Hi"}]
        ) as stream:
            async for _ in stream:
                pass


async def test_anthropic_stream_wire_framing(anthropic_fake):
    """Every event has an event: line naming its data.type; no [DONE]; error event on failure."""
    fake, _, server = anthropic_fake
    fake.enqueue(Reply(fail_after_events=0))
    headers = {"x-api-key": "sk-ant-test-upstream", "anthropic-version": "2023-06-01"}
    body = {"model": "claude-x", "max_tokens": 10, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
    async with aiohttp.ClientSession() as session:
        async with session.post(server.make_url("/v1/messages"), json=body, headers=headers) as response:
            raw = (await response.read()).decode()
    events = [e.split("\n") for e in raw.split("\n\n") if e]
    names = [lines[0].removeprefix("event: ") for lines in events]
    assert names == ["message_start", "ping", "content_block_start", "error"]
    for name, (_, data) in zip(names, events):
        assert json.loads(data.removeprefix("data: "))["type"] == name
    error = json.loads(events[-1][1][6:])
    assert error["error"]["type"] == "overloaded_error" and error["request_id"].startswith("req_")


async def test_anthropic_missing_version_header(anthropic_fake):
    fake, _, server = anthropic_fake
    body = {"model": "claude-x", "max_tokens": 10, "messages": [{"role": "user", "content": "Hi"}]}
    status, payload, _ = await post(server, "/v1/messages", body, {"x-api-key": "sk-ant-test-upstream"})
    assert status == 400
    assert payload["type"] == "error"
    assert payload["error"] == {"type": "invalid_request_error", "message": "anthropic-version: header is required"}


@pytest.mark.parametrize(
    "version, extra, fragment",
    [
        ("2026-10-21", {"temperature": 1.0}, "temperature: Extra inputs are not permitted"),
        ("2023-06-01", {"foo": 1}, "foo: Extra inputs are not permitted"),
        ("2023-06-01", {"max_tokens": None}, "max_tokens"),
        ("2023-06-01", {"messages": [{"role": "system", "content": "x"}]}, "role"),
        ("2026-10-21", {"messages": [{"role": "assistant", "content": "x"}]}, 'first message must use the "user" role'),
        ("2023-06-01", {"messages": [{"role": "user", "content": [{"type": "image", "source": {
            "type": "base64", "media_type": "image/png", "data": "data:image/png;base64,AAAA"}}]}]}, "base64"),
        ("2023-06-01", {"messages": [{"role": "user", "content": [{"type": "image", "source": {
            "type": "base64", "media_type": "image/bmp", "data": "AAAA"}}]}]}, "media_type"),
        ("2023-06-01", {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "text", "text": "and?"},
                                         {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]}]},
         "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_1"),
        ("2023-06-01", {"messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_9", "content": "ok"}]}]},
         "unexpected `tool_use_id` found in `tool_result` blocks: toolu_9"),
        ("2023-06-01", {"tools": [{"name": "f", "input_schema": {"type": "array"}}]}, "Input should be 'object'"),
        ("2023-06-01", {"tool_choice": {"type": "auto"}}, "while providing tools"),
    ],
)  # fmt: skip
async def test_anthropic_rejections(anthropic_fake, version, extra, fragment):
    fake, _, server = anthropic_fake
    body = {"model": "claude-x", "max_tokens": 10, "messages": [{"role": "user", "content": "Hi"}], **extra}
    headers = {"Authorization": "Bearer sk-ant-test-upstream", "anthropic-version": version}
    status, payload, _ = await post(server, "/v1/messages", body, headers)
    assert status == 400, payload
    assert payload["error"]["type"] == "invalid_request_error"
    assert fragment in payload["error"]["message"]


async def test_anthropic_version_rules_and_auth(anthropic_fake):
    """Sampling params and mid-turn system messages depend on the version; both auth headers work."""
    fake, _, server = anthropic_fake
    body = {
        "model": "claude-x",
        "max_tokens": 10,
        "temperature": 0.2,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    old_style = {"x-api-key": fake.api_key, "anthropic-version": "2023-06-01"}
    status, _, _ = await post(server, "/v1/messages", body, old_style)
    assert status == 200
    body = {
        "model": "claude-x",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "Hi"}, {"role": "system", "content": "Be brief."}],
    }
    headers = {"Authorization": f"Bearer {fake.api_key}", "anthropic-version": "2026-10-21"}
    status, _, _ = await post(server, "/v1/messages", body, headers)
    assert status == 200
    fake.enqueue(Reply(error_status=529, error_message="busy"))
    status, payload, response_headers = await post(server, "/v1/messages", body, headers)
    assert status == 529 and payload["error"] == {"type": "overloaded_error", "message": "busy"}
    assert response_headers["retry-after"] == "1"
    status, payload, _ = await post(server, "/v1/messages", body, {**headers, "x-api-key": "nope"})
    assert status == 401 and payload["error"]["type"] == "authentication_error"
    assert [r.rejected is None for r in fake.requests] == [True, True, True, False]
