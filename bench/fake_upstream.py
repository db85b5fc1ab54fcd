"""A fast fake OpenAI-compatible upstream for the benchmark: a canned JSON completion with
usage, or an SSE stream of N chunks with an optional delay between them. Bodies are built
once, so the upstream costs as little as possible on its core."""
from __future__ import annotations

import argparse
import asyncio

import orjson
from aiohttp import web

COMPLETION = orjson.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 1, "model": "bench",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello from the bench upstream."},
                 "logprobs": None, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20}})


def chunk(delta: dict, finish=None) -> bytes:
    return b"data: " + orjson.dumps({"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1,
                                     "model": "bench", "choices": [{"index": 0, "delta": delta,
                                                                    "finish_reason": finish}]}) + b"\n\n"


def make_app(chunks: int, delay: float) -> web.Application:
    first = chunk({"role": "assistant", "content": ""})
    word = chunk({"content": "word "})
    tail = (chunk({}, "stop") + b"data: " + orjson.dumps({"id": "chatcmpl-bench", "object": "chat.completion.chunk",
                                                          "created": 1, "model": "bench", "choices": [],
                                                          "usage": {"prompt_tokens": 12, "completion_tokens": chunks,
                                                                    "total_tokens": 12 + chunks}})
            + b"\n\ndata: [DONE]\n\n")

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if b'"stream":true' not in body and b'"stream": true' not in body:
            return web.Response(body=COMPLETION, content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(first)
        for _ in range(chunks):
            if delay:
                await asyncio.sleep(delay)
            await resp.write(word)
        await resp.write(tail)
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--chunks", type=int, default=20)
    p.add_argument("--delay", type=float, default=0.0, help="seconds between stream chunks")
    args = p.parse_args()
    web.run_app(make_app(args.chunks, args.delay), host="127.0.0.1", port=args.port, print=None, access_log=None,
                backlog=1024)        # room for 200 connections opened at once (aiohttp's default is 128)


if __name__ == "__main__":
    main()
