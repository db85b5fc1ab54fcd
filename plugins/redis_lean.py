"""A lean Redis client for the one command every call sends: the rate-limit script
(plugins/limitstores.py). Through redis-py's asyncio client, one rate-limit take costs about
530k instructions; through this one about 120k. redis-py keeps everything else (key-cache
pub/sub, admin, readiness).

One connection per process, pipelined: requests are written in the order callers make them
and Redis answers in that order, so each reply resolves the oldest waiting caller. It speaks
RESP2 (what Redis speaks until told HELLO 3), sends AUTH and SELECT from the URL when it
connects, and connects again on the next call once the connection has dropped. It fails
with redis-py's exceptions, so callers handle it as they handle redis-py:
- ConnectionError: Redis cannot be reached, or the connection dropped (a request under way
  may or may not have run);
- TimeoutError: Redis answered nothing for `timeout` seconds while requests waited (the
  connection is dropped: an answer that came later would be matched to the wrong caller);
- ResponseError and its kinds (NoScriptError, ...), or AuthenticationError: Redis's error reply.

Plain `redis://host:port/db` URLs only (`serves`); with TLS (`rediss://`) or options such
as `?socket_timeout=`, the gateway runs its scripts through redis-py.
"""
from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from urllib.parse import unquote, urlsplit

from redis.exceptions import (AuthenticationError, DataError, NoPermissionError, NoScriptError, RedisError,
                              ResponseError)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

ERRORS = {"NOSCRIPT": NoScriptError, "WRONGPASS": AuthenticationError, "NOAUTH": AuthenticationError,
          "NOPERM": NoPermissionError}


def command(*args) -> bytes:
    """A command as RESP2 puts it on the wire: bytes as they are, str as UTF-8, numbers as repr()."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        kind = type(arg)
        if kind is str:
            arg = arg.encode()
        elif kind is int or kind is float:
            arg = repr(arg).encode()
        elif kind is not bytes:
            raise DataError(f"cannot send {kind.__name__} {arg!r} to Redis")
        out.append(b"$%d\r\n%b\r\n" % (len(arg), arg))
    return b"".join(out)


def error(line: bytes) -> RedisError:
    """An error reply as redis-py raises it: `NOSCRIPT No matching script` -> NoScriptError('No matching script')."""
    text = line.decode(errors="replace")
    code, _, rest = text.partition(" ")
    if code in ERRORS:
        return ERRORS[code](rest)
    return ResponseError(rest if code == "ERR" else text)


class Incomplete(Exception):
    """The buffer ends before the reply does."""


def parse(buf: bytes, pos: int):
    """The reply starting at `buf[pos]` -> (it, where the next one starts). Bulk and simple
    strings come as bytes, integers as int, nil as None, arrays as lists, an error as the
    exception redis-py would raise (not raised here: the caller raises a top-level one)."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise Incomplete
    kind, line, pos = buf[pos], buf[pos + 1:end], end + 2
    if kind == 36:                                  # $: bulk string
        n = int(line)
        if n < 0:
            return None, pos
        if len(buf) < pos + n + 2:
            raise Incomplete
        return buf[pos:pos + n], pos + n + 2
    if kind == 42:                                  # *: array
        n = int(line)
        if n < 0:
            return None, pos
        items = []
        for _ in range(n):
            item, pos = parse(buf, pos)
            items.append(item)
        return items, pos
    if kind == 58:                                  # :
        return int(line), pos
    if kind == 43:                                  # +
        return line, pos
    if kind == 45:                                  # -
        return error(line), pos
    raise ValueError(f"not a RESP2 reply: {buf[pos - len(line) - 3:end]!r}")


class Connection(asyncio.Protocol):
    """One connection: `send` writes a request and returns the future its reply resolves."""

    def __init__(self, timeout: float):
        self.loop = asyncio.get_running_loop()
        self.timeout = timeout
        self.waiting: deque[asyncio.Future] = deque()      # in the order the requests were written
        self.buffer = b""                                    # the start of a reply not all received
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.heard = 0.0           # when Redis last answered, or a request was sent with none waiting
        self.watchdog: asyncio.TimerHandle | None = None

    def connection_made(self, transport):
        self.transport = transport

    def send(self, request: bytes) -> asyncio.Future:
        if self.closed:
            raise RedisConnectionError("Connection closed by server.")
        future = self.loop.create_future()
        if not self.waiting:
            self.heard = self.loop.time()
        self.waiting.append(future)
        self.transport.write(request)
        if self.watchdog is None:
            self.watchdog = self.loop.call_at(self.heard + self.timeout, self._watch)
        return future

    def data_received(self, data: bytes):
        buf = self.buffer + data if self.buffer else data
        pos = 0
        try:
            while pos < len(buf):
                reply, pos = parse(buf, pos)
                future = self.waiting.popleft()
                if future.done():                 # its caller was cancelled: the reply is nobody's
                    continue
                if type(reply) is not list and isinstance(reply, RedisError):
                    future.set_exception(reply)
                else:
                    future.set_result(reply)
        except Incomplete:
            pass
        except (ValueError, IndexError) as exc:       # not RESP, or an answer nobody asked for
            self.close(RedisConnectionError(f"Protocol error from Redis: {exc}"))
            return
        self.buffer = buf[pos:]
        self.heard = self.loop.time()

    def _watch(self):
        self.watchdog = None
        if not self.waiting:
            return
        due = self.heard + self.timeout
        if self.loop.time() < due:
            self.watchdog = self.loop.call_at(due, self._watch)
        else:
            self.close(RedisTimeoutError(f"Timeout reading from Redis: no answer in {self.timeout:g} s"))

    def connection_lost(self, exc):
        self.close(RedisConnectionError("Connection closed by server." if exc is None else f"Connection lost: {exc}"))

    def close(self, why: Exception | None = None):
        """Drop the connection; every request still waiting fails with `why` (a new copy each)."""
        self.closed = True
        if self.watchdog is not None:
            self.watchdog.cancel()
            self.watchdog = None
        if self.transport is not None:
            self.transport.abort()
        why = why or RedisConnectionError("Connection closed.")
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(type(why)(*why.args))


class LeanRedis:
    """Sends commands over one pipelined connection, opened on the first call."""

    def __init__(self, url: str, timeout: float = 10.0, connect_timeout: float = 5.0):
        assert self.serves(url), url
        parts = urlsplit(url)
        self.host, self.port = parts.hostname, parts.port or 6379
        self.username = unquote(parts.username) if parts.username else None
        self.password = unquote(parts.password) if parts.password else None
        self.db = int(parts.path.strip("/") or 0)
        self.timeout, self.connect_timeout = timeout, connect_timeout
        self._conn: Connection | None = None
        self._connecting: asyncio.Task | None = None

    @staticmethod
    def serves(url: str) -> bool:
        """redis://[user:password@]host[:port][/db], nothing more."""
        parts = urlsplit(url)
        db = parts.path.strip("/")
        return parts.scheme == "redis" and bool(parts.hostname) and not parts.query and (db.isdigit() or not db)

    async def execute(self, *args):
        """One command's reply (raises a top-level error reply)."""
        conn = self._conn
        if conn is None or conn.closed:
            conn = await self._connected()
        return await conn.send(command(*args))

    def register_script(self, source: str) -> Script:
        return Script(self, source)

    async def aclose(self) -> None:
        if self._connecting is not None:
            self._connecting.cancel()
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def _connected(self) -> Connection:
        """The connection, opened by the first caller that needs it; the others wait for it."""
        if self._connecting is None:
            self._connecting = task = asyncio.get_running_loop().create_task(self._connect())
            task.add_done_callback(self._connect_done)
        return await asyncio.shield(self._connecting)

    def _connect_done(self, task: asyncio.Task) -> None:
        self._connecting = None
        if not task.cancelled():
            task.exception()               # retrieved here even when every waiter was cancelled

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: Connection(self.timeout), self.host, self.port), self.connect_timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            raise RedisConnectionError(f"Error connecting to {self.host}:{self.port}: "
                                       f"{exc or 'timed out'}") from None
        hello = []
        if self.password is not None:
            hello.append(command("AUTH", *([self.username] if self.username else []), self.password))
        if self.db:
            hello.append(command("SELECT", self.db))
        try:
            for answer in [conn.send(request) for request in hello]:
                await answer
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn


class Script:
    """A Lua script run by its SHA1 (EVALSHA); when Redis does not know it (a restart, SCRIPT
    FLUSH) it is sent whole (EVAL), which also caches it for the next EVALSHA. Either way
    the script ran once, or not at all."""

    def __init__(self, client: LeanRedis, source: str):
        self.client, self.source = client, source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    async def __call__(self, keys=(), args=()):
        try:
            return await self.client.execute("EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return await self.client.execute("EVAL", self.source, len(keys), *keys, *args)
