"""Fuzz each provider's response parser through HTTP: an upstream answering a valid
body with one field deleted or given the wrong type gets either a good answer or a
502, never a 500, and a 502 is never charged."""
import base64
import copy
import random

import aiohttp
import pytest
from aiohttp import web

from tests.conftest import DEMO_MODELS, UPSTREAM_PRICES
from tests.fakes.media_script import png_bytes

CHAT_BODIES = {
    "openai": {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
               "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                   "role": "assistant", "content": "hi", "tool_calls": [
                       {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}}],
               "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                         "prompt_tokens_details": {"cached_tokens": 1},
                         "completion_tokens_details": {"reasoning_tokens": 1}}},
    "anthropic": {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "stop_reason": "tool_use",
                  "stop_sequence": None,
                  "content": [{"type": "thinking", "thinking": "hm", "signature": "sig"}, {"type": "text", "text": "hi"},
                              {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}}],
                  "usage": {"input_tokens": 3, "output_tokens": 2, "cache_read_input_tokens": 1}},
    "gemini": {"candidates": [{"content": {"role": "model", "parts": [
                   {"text": "hi"}, {"functionCall": {"name": "f", "args": {"a": 1}}}]}, "finishReason": "STOP"}],
               "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 2, "totalTokenCount": 5,
                                 "thoughtsTokenCount": 1}, "modelVersion": "m"},
    "openai_responses": {"id": "resp_1", "object": "response", "status": "completed", "model": "m", "output": [
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "hm"}]},
        {"type": "message", "id": "msg_1", "role": "assistant",
         "content": [{"type": "output_text", "text": "hi", "annotations": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": "{}"}],
        "usage": {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5,
                  "input_tokens_details": {"cached_tokens": 1}, "output_tokens_details": {"reasoning_tokens": 1}}},
}
WRONG = ["oops", "abc", -1, 1e308, None, [], {}, True, [1, "x"], {"x": {"y": 1}}]
CASES = 40          # mutations per provider


def paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from paths(v, prefix + (i,))


def mutations(body, seed: int, count: int):
    """`count` copies of body, each with one node deleted or replaced by a wrong value."""
    rng = random.Random(seed)
    every = list(paths(body))
    for _ in range(count):
        out = copy.deepcopy(body)
        path = rng.choice(every)
        if not path:
            yield rng.choice(WRONG)
            continue
        parent = out
        for step in path[:-1]:
            parent = parent[step]
        if rng.random() < 0.3 and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = rng.choice(WRONG)
        yield out


class Scripted:
    """Answers every request with the next scripted body (JSON), whatever the path."""

    def __init__(self):
        self.bodies: list = []
        self.app = web.Application()
        self.app.router.add_route("*", "/{tail:.*}", self.handle)

    async def handle(self, request):
        await request.read()
        body = self.bodies.pop(0) if self.bodies else {}
        if callable(body):
            return await body(request)
        return web.json_response(body)


async def post(gw, path, body, key):
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{gw.url}{path}", json=body, headers={"Authorization": f"Bearer {key}"}) as r:
            return r.status, await r.text()


@pytest.mark.parametrize("kind", list(CHAT_BODIES))
async def test_chat_parsers_answer_malformed_bodies_with_a_502(aiohttp_server, start_gateway, kind):
    up = Scripted()
    server = await aiohttp_server(up.app)
    base = str(server.make_url("/v1" if kind.startswith("openai") else ""))
    gw = await start_gateway({
        "providers": {"up": {"type": kind, "base_url": base, "api_key": "k-test-12345678"}},
        "models": {"chat": DEMO_MODELS + [{"id": "up/m", "provider": "up", "upstream": "m", "tools": True,
                                           **UPSTREAM_PRICES}]}})
    key, account = await gw.key(1)
    request = {"model": "up/m", "messages": [{"role": "user", "content": "hi"}],
               "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}
    up.bodies = [CHAT_BODIES[kind]]
    status, text = await post(gw, "/api/v1/chat/completions", request, key)
    assert status == 200, text                                  # the unmutated body is understood
    balance = await gw.balance(account)
    seen = set()
    for body in mutations(CHAT_BODIES[kind], seed=len(kind), count=CASES):
        up.bodies = [body]
        status, text = await post(gw, "/api/v1/chat/completions", request, key)
        seen.add(status)
        assert status in (200, 502), (body, text)
        after = await gw.balance(account)
        if status == 502:
            assert after == balance, (body, text)               # a malformed answer is never charged
        balance = after
    assert 502 in seen
    assert balance == await gw.ledger_sum(account)


def fal_steps(result):
    async def submit(request):
        base = f"http://{request.host}/o/app/requests/r1"
        return web.json_response({"request_id": "r1", "status_url": base + "/status", "response_url": base})
    return [submit, {"status": "COMPLETED"}, result]


async def serve_png(request):
    return web.Response(body=png_bytes(), content_type="image/png")


MEDIA = {
    "fal": (lambda url: {"images": [{"url": url, "content_type": "image/png"}], "seed": 1}, fal_steps),
    "replicate": (lambda url: {"id": "p1", "status": "succeeded", "output": [url],
                               "urls": {"get": "x", "cancel": "y"}}, lambda body: [body]),
    "openai": (lambda url: {"created": 1, "data": [{"b64_json": base64.b64encode(png_bytes()).decode()}]},
               lambda body: [body]),
    "gemini": (lambda url: {"candidates": [{"content": {"role": "model", "parts": [
                   {"text": "Here it is."}, {"inlineData": {"mimeType": "image/png",
                                                            "data": base64.b64encode(png_bytes()).decode()}}]},
                   "finishReason": "STOP", "index": 0}], "modelVersion": "m"}, lambda body: [body]),
}


@pytest.mark.parametrize("kind", list(MEDIA))
async def test_media_parsers_answer_malformed_bodies_with_a_502(aiohttp_server, start_gateway, tmp_path, kind):
    up = Scripted()
    server = await aiohttp_server(up.app)
    png_url = str(server.make_url("/file.png"))
    gw = await start_gateway({
        "providers": {"up": {"type": kind, "base_url": str(server.make_url("/v1" if kind == "openai" else "")),
                             "api_key": "k-test-12345678", **({} if kind == "openai" else {"poll_seconds": 0.01})}},
        "models": {"image": [{"id": "up/img", "provider": "up", "upstream": "o/app", "list_usd_per_image": 0.02,
                              "timeout_seconds": 3}]},
        "media": {"artifacts": {"dir": str(tmp_path / "art")}, "allow_private_urls": True}})
    key, account = await gw.key(1)
    good, steps = MEDIA[kind]
    request = {"model": "up/img", "prompt": "a cat"}
    up.bodies = steps(good(png_url)) + [serve_png]
    status, text = await post(gw, "/api/v1/images/generations", request, key)
    assert status == 200, text
    balance, seen = await gw.balance(account), set()
    for body in mutations(good(png_url), seed=len(kind), count=CASES):
        up.bodies = steps(body) + [serve_png]
        status, text = await post(gw, "/api/v1/images/generations", request, key)
        seen.add(status)
        assert status in (200, 502), (body, text)
        after = await gw.balance(account)
        if status == 502:
            assert after == balance, (body, text)
        balance = after
    assert 502 in seen
    assert balance == await gw.ledger_sum(account)
