"""How the gateway process serves connections, so slow or idle clients cannot use it up.

- Request headers must arrive within the idle keep-alive time (`server.keepalive_seconds`):
  the server closes a connection that has not completed a request by then, whether it
  sent nothing or is dripping headers. Bodies must arrive within
  `server.request_timeout_seconds` (408, see formats.base.read_json).
- At most `server.max_connections` open connections (fewer if the open-file limit
  would not leave room for the rest of the process); one more is answered a 503 JSON
  error with `Retry-After` and closed at once, so the process never runs out of files.
- At start the process raises its own open-file limit to the hard limit.
- SIGTERM and SIGINT stop it gracefully (in-flight calls finish within 30 s).
- The cyclic garbage collector runs after 10,000 new objects rather than Python's 700: the
  objects of calls in flight are walked far less often (about 2% of a call's instructions
  at 20 calls in flight); garbage without cycles is freed at once either way.
"""
from __future__ import annotations

import asyncio
import gc
import resource
import signal

import orjson
import structlog
from aiohttp import web

log = structlog.get_logger("gateway")
SPARE_FILES = 256       # kept for the database, upstream connections and logs under a full house
GC_YOUNG_OBJECTS = 10_000   # new objects between collections of the youngest generation


def raise_open_file_limit() -> int:
    """Lift the soft RLIMIT_NOFILE to the hard limit; -> the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def refusal(max_connections: int) -> bytes:
    body = orjson.dumps({"error": {
        "message": f"the gateway is serving its maximum of {max_connections} connections; retry shortly",
        "type": "server_error", "param": None, "code": "too_many_connections"}})
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
            b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


class GuardedRunner(web.AppRunner):
    """An AppRunner whose server refuses connections past `max_connections`."""

    def __init__(self, app: web.Application, *, max_connections: int, **kwargs):
        super().__init__(app, **kwargs)
        self.max_connections = max_connections
        self.open = 0

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        made, lost, answer = server.connection_made, server.connection_lost, refusal(self.max_connections)

        def connection_made(handler, transport):
            self.open += 1
            made(handler, transport)
            if self.open > self.max_connections:
                transport.write(answer)
                handler.force_close()
                transport.close()

        def connection_lost(handler, exc=None):
            self.open -= 1
            lost(handler, exc)

        server.connection_made, server.connection_lost = connection_made, connection_lost
        return server


async def serve(app: web.Application, host: str, port: int, settings, *, reuse_port: bool = False) -> None:
    """Serve until SIGTERM or SIGINT, then shut down gracefully. `reuse_port`: one of the
    workers of `gateway run --workers N`, all bound to the same port."""
    files = raise_open_file_limit()
    cap = max(16, min(settings.max_connections, files - SPARE_FILES))
    runner = GuardedRunner(app, max_connections=cap, handler_cancellation=True,
                           access_log=None, keepalive_timeout=settings.keepalive_seconds, shutdown_timeout=30)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024, reuse_port=reuse_port or None)
    try:
        await site.start()
    except BaseException:                # e.g. the port is taken: close what start-up opened (sessions, stores)
        await runner.cleanup()
        raise
    gc.set_threshold(GC_YOUNG_OBJECTS, *gc.get_threshold()[1:])
    log.info("serving", host=host, port=port, open_file_limit=files, max_connections=cap,
             keepalive_seconds=settings.keepalive_seconds, request_timeout_seconds=settings.request_timeout_seconds)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
        log.info("stopping", host=host, port=port)
    finally:
        await runner.cleanup()
        log.info("stopped", host=host, port=port)
