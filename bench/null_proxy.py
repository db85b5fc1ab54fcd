"""The baseline: a plain aiohttp pass-through proxy, the floor for a Python gateway. One
shared ClientSession; JSON relayed whole, SSE relayed chunk by chunk. It listens with the
gateway's backlog (1024): with aiohttp's default of 128, 200 clients connecting at once
overflow it and some wait for SYN retries, which skews the c=200 comparison."""
from __future__ import annotations

import argparse

import aiohttp
from aiohttp import web


def make_app(upstream: str) -> web.Application:
    app = web.Application()
    session_key = web.AppKey("session", aiohttp.ClientSession)

    async def session_ctx(app):
        app[session_key] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1000),
                                                 timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        yield
        await app[session_key].close()

    async def proxy(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        async with app[session_key].post(upstream, data=body, headers={"Content-Type": "application/json"}) as up:
            if up.content_type != "text/event-stream":
                return web.Response(body=await up.read(), status=up.status, content_type=up.content_type)
            resp = web.StreamResponse(status=up.status, headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            async for data in up.content.iter_any():
                await resp.write(data)
            await resp.write_eof()
            return resp

    app.cleanup_ctx.append(session_ctx)
    app.router.add_post("/api/v1/chat/completions", proxy)
    return app


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True)
    args = p.parse_args()
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    web.run_app(make_app(args.upstream), host="127.0.0.1", port=args.port, print=None, access_log=None,
                backlog=1024)


if __name__ == "__main__":
    main()
