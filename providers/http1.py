"""A small HTTP/1.1 client for the chat upstream calls.

A chat call is a POST of a bytes body with a few headers to a fixed origin, answered with
JSON or server-sent events over a kept-alive connection. aiohttp's ClientSession does that
and much more (URL objects, cookies, redirects, per-request timer contexts and objects), and
that much more was about a fifth of the gateway's own work per call. This client does only
what a chat call needs, on `asyncio.Protocol` with llhttp (httptools) parsing the response:

- one `Pool` per app: kept-alive connections per origin, at most `limit` per origin (callers
  wait for one when all are busy), idle ones dropped after `keepalive` seconds or when the
  server closes them; a connection whose answer was not read to the end, or that failed, is
  closed, never reused; `Connection: close` is honoured.
- https with the system's trusted certificates (SSL_CERT_FILE honoured), hostname checked.
- Content-Length, chunked and close-delimited bodies; 1xx interim answers skipped; gzip and
  deflate bodies decoded as they arrive; a malformed answer is a `MalformedResponse`.
- the body handed straight to a waiting read; reading the socket paused while more than
  MAX_UNREAD bytes wait unread.

Deadlines are the caller's (providers/base.py `_Request`, `SSEReader`), except the connect one.
aiohttp's `TraceConfig`s still see every request (`on_request_start`, `_end`, `_exception`),
so a tracing plugin's client spans cover these calls too.
"""
from __future__ import annotations

import asyncio
import ssl
import sys
import zlib
from collections import deque
from urllib.parse import urlsplit

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

MAX_UNREAD = 1 << 20          # unread body bytes at which reading the socket pauses
MAX_HEAD = 64 * 1024          # bytes an answer may send before its headers end (the parser buffers them)
USER_AGENT = f"Python/{sys.version_info[0]}.{sys.version_info[1]} gateway"
_DECODED = frozenset({"gzip", "x-gzip", "deflate"})
_NO_HEADERS: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())


class HTTPError(Exception):
    """The connection or the upstream's HTTP failed (the provider makes it a 502)."""


class ServerDisconnected(HTTPError):
    """The upstream closed the connection before the answer was complete."""


class MalformedResponse(HTTPError):
    """The upstream's answer is not HTTP the client can read."""


class InvalidHeader(HTTPError, ValueError):
    """A request header name or value holding CR or LF (it would start a line of its own)."""


class Response:
    """An answer: status, reason, headers, `content_length` (as declared), and its body read
    with `readany()` (what has arrived, waiting for some if none has; b"" at the end) or
    `read()` (all of it). `content` is the response itself, so code written for aiohttp's
    `resp.content` reads it unchanged. `close()` before the end closes the connection."""
    __slots__ = ("status", "reason", "headers", "content_length", "_conn", "_chunks", "_size", "_done",
                 "_error", "_waiter", "_decoder", "_until_close", "__weakref__")

    def __init__(self, conn: "Connection"):
        self.status = 0
        self.reason = ""
        self.headers: CIMultiDictProxy[str] = _NO_HEADERS
        self.content_length: int | None = None
        self._conn: Connection | None = conn
        self._chunks: list[bytes] = []
        self._size = 0
        self._done = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future | None = None
        self._decoder = None
        self._until_close = False

    @property
    def content(self) -> "Response":
        return self

    def is_eof(self) -> bool:
        """The whole body has arrived (reads cannot wait)."""
        return self._done

    async def readany(self) -> bytes:
        data = self.ready()
        if data is None:
            data = self.got(await self.wait())
        return data

    # readany in three steps, for a reader that awaits the network read itself (one frame less per read)
    def ready(self) -> bytes | None:
        """What has arrived (b"" at the end), without waiting; None: nothing yet, `wait()`."""
        if self._error is not None:
            raise self._error
        if self._chunks:
            return self._take()
        return b"" if self._done else None

    def wait(self) -> asyncio.Future:
        """A future of the next network read's bytes (None: the end), failed by an error;
        what it gives goes through `got()`."""
        self._waiter = waiter = self._conn.loop.create_future()
        return waiter

    def got(self, data: bytes | None) -> bytes:
        """What a `wait()` brought, with what arrived after it (b"" at the end)."""
        if data is None:
            return self._take() if self._chunks else b""
        return data + self._take() if self._chunks else data

    async def read(self) -> bytes:
        if self._done and self._error is None:
            return self._take()
        chunks = []
        while data := await self.readany():
            chunks.append(data)
        return b"".join(chunks)

    def set_exception(self, error: BaseException) -> None:
        """Fail the waiting read and every later one (a reader's deadline passed)."""
        self._error = error
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)

    def close(self) -> None:
        """Done with the answer: unless it was complete, its connection is closed."""
        conn, self._conn = self._conn, None
        if conn is not None and not self._done:
            conn.close()

    # -- fed by the connection -----------------------------------------------------
    def _take(self) -> bytes:
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._size = 0
        conn = self._conn
        if conn is not None and conn.paused:
            conn.resume()
        return data

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _finish(self) -> None:
        self._done = True
        self._wake()

    def _fail(self, error: BaseException) -> None:
        if not self._done:
            self.set_exception(error)


class Connection(asyncio.Protocol):
    """One kept-alive connection; at most one request on it at a time."""

    def __init__(self, pool: "Pool", origin: "_Origin"):
        self.pool, self.origin, self.loop = pool, origin, pool.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: Response | None = None
        self.head: asyncio.Future | None = None      # the response, once its headers are in
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.reason = b""
        self.interim = False
        self.error: HTTPError | None = None
        self.head_bytes = 0
        self.paused = False
        self.closed = False
        self.counted = False       # holds one of its origin's slots
        self.idle_since = 0.0

    def request(self, data: bytes) -> asyncio.Future:
        """Send a whole request; -> a future of its Response (at its headers)."""
        self.response = Response(self)
        self.head = head = self.loop.create_future()
        self.head_bytes = 0
        self.transport.write(data)
        return head

    def close(self, error: HTTPError | None = None) -> None:
        """Close at once; an answer still coming fails with `error`."""
        if self.closed:
            return
        self.closed = True
        resp, self.response = self.response, None
        if self.transport is not None:
            self.transport.abort()
        self.pool._lost(self)
        head = self.head
        if head is not None and not head.done():
            head.set_exception(error or ServerDisconnected("the connection was closed"))
        elif resp is not None:
            resp._fail(error or ServerDisconnected("the connection was closed"))

    def pause(self) -> None:
        self.paused = True
        self.transport.pause_reading()

    def resume(self) -> None:
        self.paused = False
        if not self.closed:
            self.transport.resume_reading()

    # -- asyncio.Protocol ----------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        resp = self.response
        if resp is None:                    # bytes nobody asked for: the connection is unusable
            self.close()
            return
        try:
            self.parser.feed_data(data)     # (the body's pieces go to resp._chunks)
        except httptools.HttpParserUpgrade:
            self._abort(MalformedResponse("an upgrade to another protocol"))
        except httptools.HttpParserError as exc:
            self._abort(MalformedResponse(str(exc) or exc.__class__.__name__))
        else:
            if self.error is not None:
                self._abort(self.error)
            elif not self.head.done():      # still in the headers: a hostile upstream's endless ones end here
                self.head_bytes += len(data)
                if self.head_bytes > MAX_HEAD:
                    self._abort(MalformedResponse(f"headers longer than {MAX_HEAD // 1024} KB"))
            elif resp._chunks:
                waiter = resp._waiter
                if waiter is not None and not waiter.done():      # a read waits: hand it the bytes
                    waiter.set_result(resp._take())
                elif resp._size > MAX_UNREAD and not resp._done and not self.paused:
                    self.pause()

    def eof_received(self) -> None:
        return None       # the transport closes; connection_lost ends a close-delimited body

    def connection_lost(self, exc: BaseException | None) -> None:
        resp, self.response = self.response, None
        was_closed, self.closed = self.closed, True
        if not was_closed:
            self.pool._lost(self)
        if resp is None:
            return
        if not self.head.done():
            self.head.set_exception(ServerDisconnected("the connection closed before the answer"))
        elif resp._until_close and self.error is None:
            self._end_body(resp)
        else:
            resp._fail(ServerDisconnected("the connection closed mid-body"))

    # -- httptools callbacks -------------------------------------------------------
    def on_status(self, reason: bytes) -> None:
        self.reason = reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        raw, self.raw_headers = self.raw_headers, []
        if status < 200:                    # an interim answer (100 Continue, 103 Early Hints)
            self.interim = True
            return
        resp = self.response
        if resp is None or self.head.done():
            self.error = MalformedResponse("an answer nobody asked for")
            return
        headers = CIMultiDict([(n.decode("latin-1"), v.decode("latin-1")) for n, v in raw])
        resp.status = status
        resp.reason, self.reason = self.reason.decode("latin-1"), b""
        resp.headers = CIMultiDictProxy(headers)
        length = headers.get("Content-Length")
        if length is not None:
            resp.content_length = int(length)     # llhttp checked it is a number
        elif "chunked" not in headers.get("Transfer-Encoding", "").lower() and status not in (204, 304):
            resp._until_close = True
        encoding = headers.get("Content-Encoding")
        if encoding is not None:
            encoding = encoding.strip().lower()
            if encoding in _DECODED:
                resp._decoder = zlib.decompressobj(47)      # a zlib or gzip header, detected
            elif encoding not in ("", "identity"):
                self.error = MalformedResponse(f"an unsupported Content-Encoding: {encoding[:40]}")
                return
        self.head.set_result(resp)

    def on_body(self, body: bytes) -> None:
        resp = self.response
        if resp is None:
            return
        if resp._decoder is not None:
            if self.error is not None:
                return
            try:
                body = resp._decoder.decompress(body)
            except zlib.error:
                self.error = MalformedResponse("a body that does not decompress")
                return
            if not body:
                return
        resp._chunks.append(body)
        resp._size += len(body)

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        if self.error is not None:
            return
        resp, self.response = self.response, None
        if resp is None:
            return
        if not self._end_body(resp):
            self.error = MalformedResponse("a compressed body cut short")
            return
        if self.parser.should_keep_alive() and not self.closed:
            self.pool._release(self)
        else:
            self.close()

    def _end_body(self, resp: Response) -> bool:
        decoder = resp._decoder
        if decoder is not None:
            try:
                tail = decoder.flush()
            except zlib.error:
                tail = b""
            if tail:
                resp._chunks.append(tail)
            if not decoder.eof:
                resp._fail(MalformedResponse("a compressed body cut short"))
                return False
        resp._conn = None
        resp._finish()
        return True

    def _abort(self, error: HTTPError) -> None:
        self.close(error)
        self.error = None


class _Origin:
    __slots__ = ("host", "port", "ssl", "idle", "count", "waiters")

    def __init__(self, host: str, port: int, tls: bool):
        self.host, self.port, self.ssl = host, port, tls
        self.idle: list[Connection] = []        # most recently used last
        self.count = 0                          # open or opening connections
        self.waiters: deque[asyncio.Future] = deque()


class Pool:
    """Kept-alive connections per origin (scheme, host, port), for POSTs of a bytes body.

    `post()` -> the Response at its headers; the caller reads the body and closes it (an
    answer read to its end has already put its connection back). `trace_configs`:
    aiohttp TraceConfigs whose request start/end/exception signals see every request."""

    def __init__(self, limit_per_origin: int = 500, keepalive: float = 15.0, trace_configs=()):
        self.limit = limit_per_origin
        self.keepalive = keepalive
        self.trace_configs = list(trace_configs)
        for config in self.trace_configs:
            config.freeze()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.origins: dict[tuple[str, str, int], _Origin] = {}
        self.targets: dict[str, tuple[_Origin, bytes]] = {}     # url -> its origin and request head
        self.conns: set[Connection] = set()
        self._ssl: ssl.SSLContext | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self.closed = False

    async def post(self, url: str, body: bytes, headers: dict[str, str], connect_timeout: float | None = None
                   ) -> Response:
        if self.trace_configs:
            return await self._traced(url, body, headers, connect_timeout)
        return await self._post(url, body, headers, connect_timeout)

    async def _post(self, url: str, body: bytes, headers: dict[str, str], connect_timeout: float | None) -> Response:
        target = self.targets.get(url) or self._target(url)
        origin = target[0]
        data = target[1] + _header_lines(headers, len(body)) + body
        conn = await self._acquire(origin, connect_timeout)
        try:
            return await conn.request(data)
        except BaseException:
            # Never sent again, even on a kept-alive connection closed before any byte of an
            # answer: the server may have read it (RFC 9112 9.3.1: a POST is not retried by
            # itself). The client sees a 502, which the SDKs retry; nothing is charged.
            conn.close()
            raise

    async def _acquire(self, origin: _Origin, connect_timeout: float | None) -> Connection:
        loop = self.loop
        while True:
            if self.closed:
                raise HTTPError("the gateway is shutting down")
            idle = origin.idle
            while idle:
                conn = idle.pop()
                if not conn.closed and loop.time() - conn.idle_since < self.keepalive:
                    return conn
                conn.close()
            if origin.count < self.limit:
                return await self._connect(origin, connect_timeout)
            waiter = loop.create_future()
            origin.waiters.append(waiter)
            try:
                conn = await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():     # handed a connection or a slot as it left
                    passed = waiter.result()
                    if passed is not None:
                        self._release(passed)
                    else:
                        self._wake(origin)
                raise
            if conn is not None and not conn.closed:
                return conn

    async def _connect(self, origin: _Origin, timeout: float | None) -> Connection:
        origin.count += 1
        try:
            async with asyncio.timeout(timeout if timeout and timeout > 0 else None):
                _, conn = await self.loop.create_connection(
                    lambda: Connection(self, origin), origin.host, origin.port,
                    ssl=self._ssl_context() if origin.ssl else None,
                    server_hostname=origin.host if origin.ssl else None)
        except BaseException:
            origin.count -= 1
            self._wake(origin)
            raise
        conn.counted = True
        self.conns.add(conn)
        return conn

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()     # verifies certificates and hostnames
        return self._ssl

    def _target(self, url: str) -> tuple[_Origin, bytes]:
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        parts = urlsplit(url)
        scheme, host = parts.scheme.lower(), parts.hostname
        if scheme not in ("http", "https") or not host:
            raise HTTPError(f"not an http(s) URL: {url[:100]}")
        port = parts.port or (443 if scheme == "https" else 80)
        key = (scheme, host, port)
        origin = self.origins.get(key)
        if origin is None:
            origin = self.origins[key] = _Origin(host, port, scheme == "https")
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host_header = f"[{host}]" if ":" in host else host
        if parts.port is not None and parts.port != (443 if scheme == "https" else 80):
            host_header += f":{port}"
        if any(c in url for c in "\r\n\t "):
            raise HTTPError(f"not a usable URL: {url[:100]}")
        head = f"POST {path} HTTP/1.1\r\nHost: {host_header}\r\n"
        if len(self.targets) > 1000:       # URLs naming models: bounded by the catalogue
            self.targets.clear()
        self.targets[url] = target = (origin, head.encode("utf-8"))
        return target

    # -- connections coming back ---------------------------------------------------
    def _release(self, conn: Connection) -> None:
        """An answer read to its end: the connection serves a waiting caller or waits idle."""
        origin = conn.origin
        if self.closed:
            conn.close()
            return
        if conn.paused:
            conn.resume()
        while origin.waiters:
            waiter = origin.waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        conn.idle_since = self.loop.time()
        origin.idle.append(conn)
        if self._sweeper is None:
            self._sweeper = self.loop.call_later(self.keepalive, self._sweep)

    def _lost(self, conn: Connection) -> None:
        if conn.counted:
            conn.counted = False
            conn.origin.count -= 1
            self.conns.discard(conn)
            idle = conn.origin.idle
            if conn in idle:
                idle.remove(conn)
            self._wake(conn.origin)

    def _wake(self, origin: _Origin) -> None:
        """A slot freed: the first waiting caller tries again (it may open a connection)."""
        while origin.waiters:
            waiter = origin.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _sweep(self) -> None:
        """Drop connections idle for `keepalive` seconds (one timer per pool, not per connection)."""
        self._sweeper = None
        cutoff = self.loop.time() - self.keepalive
        left = False
        for origin in self.origins.values():
            for conn in [c for c in origin.idle if c.idle_since <= cutoff]:
                conn.close()
            left = left or bool(origin.idle)
        if left and not self.closed:
            self._sweeper = self.loop.call_later(self.keepalive, self._sweep)

    async def close(self) -> None:
        self.closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in list(self.conns):
            conn.close()
        for origin in self.origins.values():
            while origin.waiters:
                waiter = origin.waiters.popleft()
                if not waiter.done():
                    waiter.set_result(None)
        await asyncio.sleep(0)          # the aborted sockets close on the loop's next turn

    # -- tracing -------------------------------------------------------------------
    async def _traced(self, url: str, body: bytes, headers: dict[str, str], connect_timeout: float | None
                      ) -> Response:
        import aiohttp
        from yarl import URL
        method, full = "POST", URL(url)
        traces = [(config, config.trace_config_ctx()) for config in self.trace_configs]
        sent = CIMultiDict(headers)
        for config, ctx in traces:
            await config.on_request_start.send(self, ctx, aiohttp.TraceRequestStartParams(method, full, sent))
        try:
            resp = await self._post(url, body, headers, connect_timeout)
        except BaseException as exc:
            for config, ctx in traces:
                await config.on_request_exception.send(
                    self, ctx, aiohttp.TraceRequestExceptionParams(method, full, sent, exc))
            raise
        for config, ctx in traces:
            await config.on_request_end.send(self, ctx, aiohttp.TraceRequestEndParams(method, full, sent, resp))
        return resp


def _header_lines(headers: dict[str, str], length: int) -> bytes:
    """The request's headers after Host, with Content-Length and the defaults a caller did
    not set. A name or value holding CR or LF (a client's pass-through header could) would
    start a header line of its own: refused."""
    text = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
    if text.count("\n") != len(headers) or text.count("\r") != len(headers):
        raise InvalidHeader("a request header name or value holds a line break")
    lower = {name.lower() for name in headers}
    extra = f"Content-Length: {length}\r\n"
    if "accept-encoding" not in lower:
        extra += "Accept-Encoding: gzip, deflate\r\n"
    if "user-agent" not in lower:
        extra += f"User-Agent: {USER_AGENT}\r\n"
    if "accept" not in lower:
        extra += "Accept: */*\r\n"
    return (text + extra + "\r\n").encode("utf-8")
