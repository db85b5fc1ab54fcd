"""Real recorded upstream streams (captures quoted in the research notes), replayed as the
upstream and read through all three client formats with the official SDKs."""
import json
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tests.conformance.wire import allowed, check_stream, parse_sse
from tests.conftest import DEMO_MODELS, UPSTREAM_PRICES

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
async def replay(aiohttp_server, start_gateway):
    """An Anthropic upstream that answers every call with a recorded stream."""
    recording = (FIXTURES / "anthropic-stream-with-tools.sse").read_bytes()

    async def messages(request):
        assert request.headers["anthropic-version"]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for frame in recording.split(b"\n\n"):
            if frame.strip():
                await resp.write(frame + b"\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/messages", messages)
    server = await aiohttp_server(app)
    gw = await start_gateway({"providers": {"rec": {"type": "anthropic", "base_url": str(server.make_url("")),
                                                    "api_key": "k"}},
                              "models": {"chat": DEMO_MODELS + [{"id": "rec/claude", "provider": "rec",
                                                                 "upstream": "claude-3-7-sonnet", **UPSTREAM_PRICES}]}})
    key, _ = await gw.key(1)
    return gw, key


TOOLS_A = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {}}}}]


async def test_recording_through_chat_completions(replay):
    gw, key = replay
    text, args, finish, usage = "", "", None, None
    async for chunk in await gw.openai(key).chat.completions.create(
            model="rec/claude", stream=True, tools=TOOLS_A, messages=[{"role": "user", "content": "Tigers?"}]):
        usage = chunk.usage or usage
        for ch in chunk.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
            for tc in ch.delta.tool_calls or []:
                assert tc.index == 0
                args += tc.function.arguments or ""
    assert text == "I'll search." and json.loads(args) == {"query": "Detroit Tigers"}
    assert finish == "tool_calls" and (usage.prompt_tokens, usage.completion_tokens) == (465, 88)


async def test_recording_through_messages_is_relayed_verbatim(replay):
    gw, key = replay
    async with gw.anthropic(key).messages.stream(model="rec/claude", max_tokens=100,
                                                 messages=[{"role": "user", "content": "Tigers?"}]) as stream:
        final = await stream.get_final_message()
    assert [b.type for b in final.content] == ["text", "tool_use"]
    assert final.content[1].input == {"query": "Detroit Tigers"} and final.id == "msg_01KM"
    assert final.stop_reason == "tool_use" and (final.usage.input_tokens, final.usage.output_tokens) == (465, 88)


async def test_recording_through_responses(replay):
    gw, key = replay
    events = [e async for e in await gw.openai(key).responses.create(
        model="rec/claude", input="Tigers?", stream=True,
        tools=[{"type": "function", "name": "search", "parameters": {"type": "object", "properties": {}}}])]
    final = events[-1].response
    assert [i.type for i in final.output] == ["message", "function_call"]
    assert final.output_text == "I'll search." and json.loads(final.output[1].arguments) == {"query": "Detroit Tigers"}
    assert (final.usage.input_tokens, final.usage.output_tokens) == (465, 88)


@pytest.mark.parametrize("fmt,path,body", [
    ("chat_completions", "/api/v1/chat/completions",
     {"tools": TOOLS_A, "messages": [{"role": "user", "content": "Tigers?"}], "stream_options": {"include_usage": True}}),
    ("messages", "/api/v1/messages", {"max_tokens": 100, "messages": [{"role": "user", "content": "Tigers?"}]}),
    ("responses", "/api/v1/responses", {"input": "Tigers?", "tools": [
        {"type": "function", "name": "search", "parameters": {"type": "object", "properties": {}}, "strict": False}]}),
])
async def test_recording_validates_against_the_published_schemas(replay, fmt, path, body):
    """Real frames from an older API version lack keys today's schema requires; relayed or
    translated, what the client gets has them all."""
    gw, key = replay
    body = {"model": "rec/claude", "stream": True, **body}
    async with aiohttp.ClientSession() as session:
        async with session.post(gw.url + path, json=body, headers={"Authorization": f"Bearer {key}"}) as resp:
            raw = await resp.read()
    refused = [str(v) for v in check_stream(fmt, parse_sse(raw), body) if not allowed(fmt, v)]
    assert not refused, "\n".join(refused)
