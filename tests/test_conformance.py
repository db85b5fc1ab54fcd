"""Wire-format conformance, tried as a strictly typed client would: raw HTTP (no lenient SDK)
in each client format over each upstream kind, every body and every SSE event validated
against OpenAI's and Anthropic's published OpenAPI schemas (pinned in tests/conformance/
schemas), plus the event order each provider documents and keys the schema does not declare.

Set CONFORMANCE_REPORT=path to append one JSON line per case with all violations found
(allowed ones included), for counting.
"""
from __future__ import annotations

import json
import os

import aiohttp
import pytest

from tests.conformance.wire import allowed, check_body, check_stream, parse_sse
from tests.conftest import DEMO_MODELS, UPSTREAMS, gateway_over
from tests.fakes import Reply, ToolCallSpec

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
SYSTEM = "Answer briefly."
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}

UPSTREAM_KINDS = [*UPSTREAMS, "demo"]
CALLS = {"tool": [{"city": "Paris"}], "parallel_tools": [{"city": "Paris"}, {"city": "Oslo"}]}
REPLIES = {
    "text": Reply(text="A small square.", input_tokens=40, output_tokens=5),
    "system": Reply(text="Brief.", input_tokens=20, output_tokens=2),
    "image": Reply(text="A small square.", input_tokens=40, output_tokens=5),
    "tool": Reply(text="", tool_calls=[ToolCallSpec("get_weather", json.dumps(c)) for c in CALLS["tool"]]),
    "parallel_tools": Reply(text="", tool_calls=[ToolCallSpec("get_weather", json.dumps(c))
                                                 for c in CALLS["parallel_tools"]]),
    "max_tokens": Reply(text="One two three four", stop="max_tokens", output_tokens=4),
    "upstream_error": Reply(error_status=500, error_message="upstream exploded"),
    "mid_stream_failure": Reply(text="one two three four five", text_chunks=5, fail_after_events=2),
}
STREAM_ONLY = {"mid_stream_failure"}
DEMO_CASES = {"text", "system", "image", "tool", "max_tokens"}   # the demo has no upstream to fail


def user_content(fmt: str, case: str):
    text = {"tool": "What is the weather in Paris?", "parallel_tools": "Weather in Paris and Oslo?",
            "max_tokens": "Please count one two three four five six seven eight nine ten"}.get(case, "Say hello.")
    if case != "image":
        return text
    image = {"chat_completions": {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
             "messages": {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
             "responses": {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}"}}[fmt]
    kind = "input_text" if fmt == "responses" else "text"
    return [{"type": kind, "text": "What is in this picture?"}, image]


def request_body(fmt: str, case: str, stream: bool) -> dict:
    limit = 5 if case == "max_tokens" else 200
    content = user_content(fmt, case)
    tools = case in CALLS
    if fmt == "chat_completions":
        messages = ([{"role": "system", "content": SYSTEM}] if case == "system" else []) + \
                   [{"role": "user", "content": content}]
        body = {"model": "up/model", "messages": messages, "max_tokens": limit}
        if tools:
            body["tools"] = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}]
        if stream:
            body["stream_options"] = {"include_usage": True}
    elif fmt == "messages":
        body = {"model": "up/model", "max_tokens": limit, "messages": [{"role": "user", "content": content}]}
        if case == "system":
            body["system"] = SYSTEM
        if tools:
            body["tools"] = [{"name": "get_weather", "input_schema": SCHEMA}]
    else:
        body = {"model": "up/model", "max_output_tokens": max(limit, 16), "input": [{"role": "user", "content": content}],
                "metadata": {"suite": "conformance"}}
        if case == "system":
            body["instructions"] = SYSTEM
        if tools:
            body["tools"] = [{"type": "function", "name": "get_weather", "parameters": SCHEMA, "strict": False}]
    return {**body, "stream": stream}


PATHS = {"chat_completions": "/api/v1/chat/completions", "messages": "/api/v1/messages",
         "responses": "/api/v1/responses"}
CASES = [(fmt, up, case, stream) for fmt in PATHS for up in UPSTREAM_KINDS for case in REPLIES for stream in (False, True)
         if (stream or case not in STREAM_ONLY) and (up != "demo" or case in DEMO_CASES)]


@pytest.fixture
async def served(request, aiohttp_server, start_gateway):
    """A gateway serving `up/model` from the named upstream kind; -> (name, gateway, fake, key)."""
    name = request.param
    fake = None
    if name == "demo":
        models = [{**DEMO_MODELS[0], "id": "up/model"}]
        gw = await start_gateway({"models": {"chat": DEMO_MODELS + models}})
    else:
        fake, gw = await gateway_over(name, aiohttp_server, start_gateway)
    key, _ = await gw.key(1)
    return name, gw, fake, key


async def call(gw, key: str, fmt: str, body: dict) -> tuple[int, str, bytes]:
    headers = {"Authorization": f"Bearer {key}", "anthropic-version": "2023-06-01"}
    async with aiohttp.ClientSession() as session:
        async with session.post(gw.url + PATHS[fmt], json=body, headers=headers) as resp:
            return resp.status, resp.content_type, await resp.read()


def violations_of(fmt: str, status: int, content_type: str, raw: bytes, request: dict) -> list:
    if content_type == "text/event-stream":
        return check_stream(fmt, parse_sse(raw), request)
    return check_body(fmt, status, json.loads(raw), request)


@pytest.mark.parametrize(("fmt", "served", "case", "stream"), CASES, indirect=["served"],
                         ids=[f"{f}-{u}-{c}-{'stream' if s else 'body'}" for f, u, c, s in CASES])
async def test_output_validates_against_the_published_schema(fmt, served, case, stream):
    upstream, gw, fake, key = served
    if fake is not None:
        fake.enqueue(REPLIES[case])
    body = request_body(fmt, case, stream)
    status, content_type, raw = await call(gw, key, fmt, body)
    expect_error = case == "upstream_error"
    assert (status >= 400) == expect_error, raw[:500]
    if stream and not expect_error:
        assert content_type == "text/event-stream", raw[:500]
    found = violations_of(fmt, status, content_type, raw, body)
    if os.environ.get("CONFORMANCE_REPORT"):
        with open(os.environ["CONFORMANCE_REPORT"], "a") as out:
            out.write(json.dumps({"case": [fmt, upstream, case, stream], "violations": [
                {"kind": v.kind, "schema": v.schema, "path": v.path, "message": v.message,
                 "allowed": allowed(fmt, v)} for v in found]}) + "\n")
    refused = [str(v) for v in found if not allowed(fmt, v)]
    assert not refused, "\n".join(refused)
