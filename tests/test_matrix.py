"""Every client format against every upstream wire format.

3 client formats (chat completions, messages, responses), each through its official SDK,
x 4 upstreams (OpenAI chat, Anthropic, Gemini, OpenAI responses), each a strict fake
that refuses what the real API refuses. For each pair: text with a system prompt and an
image; two parallel tool calls streamed, then the results sent back; an upstream error;
a failure mid-stream. Every pair must agree on content, stop reasons and usage, and the
ledger must balance to the micro-USD. The demo provider runs the same client code.
"""
import json

import anthropic
import openai
import pytest

from tests.conftest import MICRO, UPSTREAMS, gateway_over
from tests.fakes import Reply, ToolCallSpec

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
SYSTEM, PROMPT = "Answer briefly.", "What is in this picture?"
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CITIES = [{"city": "Paris"}, {"city": "Oslo"}]


class ChatCompletionsClient:
    def __init__(self, gw, key):
        self.c = gw.openai(key)

    async def text(self, model):
        r = await self.c.chat.completions.create(model=model, max_tokens=100, messages=[
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": [{"type": "text", "text": PROMPT},
                                         {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}]}])
        return r.choices[0].message.content, r.choices[0].finish_reason, (r.usage.prompt_tokens, r.usage.completion_tokens)

    async def tools(self, model):
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}]
        user = {"role": "user", "content": "Weather in Paris and Oslo?"}
        calls: dict[int, dict] = {}
        finish = None
        async for chunk in await self.c.chat.completions.create(model=model, max_tokens=200, stream=True,
                                                                tools=tools, messages=[user]):
            for ch in chunk.choices:
                finish = ch.finish_reason or finish
                for tc in ch.delta.tool_calls or []:
                    entry = calls.setdefault(tc.index, {"id": tc.id, "name": tc.function.name, "args": ""})
                    entry["args"] += tc.function.arguments or ""
        ordered = [calls[i] for i in sorted(calls)]
        history = [user, {"role": "assistant", "content": None, "tool_calls": [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["args"]}} for c in ordered]}]
        history += [{"role": "tool", "tool_call_id": c["id"], "content": f"{i}C"} for i, c in enumerate(ordered)]
        r = await self.c.chat.completions.create(model=model, max_tokens=200, tools=tools, messages=history)
        return [(c["name"], json.loads(c["args"])) for c in ordered], finish, r.choices[0].message.content

    async def upstream_error(self, model):
        with pytest.raises(openai.APIStatusError) as info:
            await self.c.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
        return info.value.status_code

    async def mid_stream_failure(self, model):
        with pytest.raises(openai.APIError):
            async for _ in await self.c.chat.completions.create(model=model, stream=True,
                                                                messages=[{"role": "user", "content": "hi"}]):
                pass


class MessagesClient:
    def __init__(self, gw, key):
        self.c = gw.anthropic(key)

    async def text(self, model):
        r = await self.c.messages.create(model=model, max_tokens=100, system=SYSTEM, messages=[
            {"role": "user", "content": [{"type": "text", "text": PROMPT},
                                         {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                      "data": PNG}}]}])
        return r.content[0].text, r.stop_reason, (r.usage.input_tokens, r.usage.output_tokens)

    async def tools(self, model):
        tools = [{"name": "get_weather", "input_schema": SCHEMA}]
        user = {"role": "user", "content": "Weather in Paris and Oslo?"}
        async with self.c.messages.stream(model=model, max_tokens=200, tools=tools, messages=[user]) as stream:
            first = await stream.get_final_message()
        uses = [b for b in first.content if b.type == "tool_use"]
        history = [user, {"role": "assistant", "content": [b.model_dump() for b in first.content]},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": b.id, "content": f"{i}C"}
                                                for i, b in enumerate(uses)]}]
        r = await self.c.messages.create(model=model, max_tokens=200, tools=tools, messages=history)
        return [(b.name, b.input) for b in uses], first.stop_reason, r.content[0].text

    async def upstream_error(self, model):
        with pytest.raises(anthropic.APIStatusError) as info:
            await self.c.messages.create(model=model, max_tokens=10, messages=[{"role": "user", "content": "hi"}])
        assert info.value.body["type"] == "error"
        return info.value.status_code

    async def mid_stream_failure(self, model):
        with pytest.raises(anthropic.APIError):
            async with self.c.messages.stream(model=model, max_tokens=100,
                                              messages=[{"role": "user", "content": "hi"}]) as stream:
                await stream.get_final_message()


class ResponsesClient:
    def __init__(self, gw, key):
        self.c = gw.openai(key)

    async def text(self, model):
        r = await self.c.responses.create(model=model, max_output_tokens=100, instructions=SYSTEM, input=[
            {"role": "user", "content": [{"type": "input_text", "text": PROMPT},
                                         {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}"}]}])
        return r.output_text, r.status, (r.usage.input_tokens, r.usage.output_tokens)

    async def tools(self, model):
        tools = [{"type": "function", "name": "get_weather", "parameters": SCHEMA, "strict": False}]
        user = {"role": "user", "content": "Weather in Paris and Oslo?"}
        events = [e async for e in await self.c.responses.create(model=model, max_output_tokens=200, tools=tools,
                                                                 input=[user], stream=True)]
        assert [e.sequence_number for e in events] == list(range(len(events)))
        calls = [i for i in events[-1].response.output if i.type == "function_call"]
        history = [user, *[c.model_dump(exclude_none=True) for c in calls],
                   *[{"type": "function_call_output", "call_id": c.call_id, "output": f"{i}C"}
                     for i, c in enumerate(calls)]]
        r = await self.c.responses.create(model=model, max_output_tokens=200, tools=tools, input=history)
        return [(c.name, json.loads(c.arguments)) for c in calls], events[-1].response.status, r.output_text

    async def upstream_error(self, model):
        with pytest.raises(openai.APIStatusError) as info:
            await self.c.responses.create(model=model, input="hi")
        return info.value.status_code

    async def mid_stream_failure(self, model):
        events = [e async for e in await self.c.responses.create(model=model, input="hi", stream=True)]
        assert [e.type for e in events[-2:]] == ["error", "response.failed"]


CLIENTS = {"chat_completions": ChatCompletionsClient, "messages": MessagesClient, "responses": ResponsesClient}
TOOL_STOP = {"chat_completions": "tool_calls", "messages": "tool_use", "responses": "completed"}
END_STOP = {"chat_completions": "stop", "messages": "end_turn", "responses": "completed"}


@pytest.fixture(params=list(UPSTREAMS))
async def upstream(request, aiohttp_server, start_gateway):
    fake, gw = await gateway_over(request.param, aiohttp_server, start_gateway)
    key, account = await gw.key(1)
    return request.param, fake, gw, key, account


async def ledger_balances(gw, account):
    rows = await gw.store.fetchall("SELECT usd_micro FROM usage WHERE account_id = ?", (account,))
    assert await gw.balance(account) == MICRO - sum(r["usd_micro"] for r in rows) == await gw.ledger_sum(account)


@pytest.mark.parametrize("fmt", list(CLIENTS))
async def test_text_system_and_image(upstream, fmt):
    name, fake, gw, key, account = upstream
    fake.enqueue(Reply(text="A small square.", input_tokens=40, output_tokens=5))
    text, stop, usage = await CLIENTS[fmt](gw, key).text("up/model")
    assert text == "A small square." and stop == END_STOP[fmt]
    assert usage == (40, 5)
    assert all(r.rejected is None for r in fake.requests), [r.rejected for r in fake.requests]
    assert PNG in json.dumps(fake.requests[-1].body)          # the image reached the upstream
    assert SYSTEM in json.dumps(fake.requests[-1].body)
    await ledger_balances(gw, account)


@pytest.mark.parametrize("fmt", list(CLIENTS))
async def test_parallel_tool_calls_and_results(upstream, fmt):
    name, fake, gw, key, account = upstream
    fake.enqueue(Reply(text="", tool_calls=[ToolCallSpec("get_weather", json.dumps(c)) for c in CITIES]),
                 Reply(text="Paris 0C, Oslo 1C."))
    calls, stop, final = await CLIENTS[fmt](gw, key).tools("up/model")
    assert calls == [("get_weather", c) for c in CITIES]
    assert stop == TOOL_STOP[fmt]
    assert final == "Paris 0C, Oslo 1C."
    assert len(fake.requests) == 2 and all(r.rejected is None for r in fake.requests), \
        [r.rejected for r in fake.requests]
    await ledger_balances(gw, account)


@pytest.mark.parametrize("fmt", list(CLIENTS))
async def test_upstream_error_is_502_and_free(upstream, fmt):
    name, fake, gw, key, account = upstream
    fake.enqueue(Reply(error_status=500, error_message="upstream exploded"))
    assert await CLIENTS[fmt](gw, key).upstream_error("up/model") == 502
    assert await gw.balance(account) == MICRO


@pytest.mark.parametrize("fmt", list(CLIENTS))
async def test_failure_mid_stream_reaches_the_client_and_is_free(upstream, fmt):
    name, fake, gw, key, account = upstream
    fake.enqueue(Reply(text="one two three four five", text_chunks=5, fail_after_events=2))
    await CLIENTS[fmt](gw, key).mid_stream_failure("up/model")
    assert await gw.balance(account) == MICRO


@pytest.mark.parametrize("fmt", list(CLIENTS))
async def test_demo_provider_speaks_every_format(gw, fmt):
    key, account = await gw.key(1)
    client = CLIENTS[fmt](gw, key)
    text, stop, _ = await client.text("demo/echo")
    assert "You said: What is in this picture?" in text and stop == END_STOP[fmt]
    calls, stop, final = await client.tools("demo/echo")
    assert calls[0][0] == "get_weather" and stop == TOOL_STOP[fmt]
    assert final.startswith("Demo received the tool result")
    await ledger_balances(gw, account)
