"""Provider base classes and the shared transport.

A provider is a pure translator plus a little declarative API data:
- `build_request(req, upstream)`  canonical -> upstream JSON body
- `parse_response(body, req)`     upstream JSON -> ChatResponse
- `parse_stream(events, req)`     upstream SSE events -> canonical stream events
- `error_message(body)`           the human text inside the upstream's error body

`HTTPProvider` owns everything else once: URL, headers, the app's pool of upstream
connections (providers/http1.py), timeouts, status mapping and SSE framing. A new
upstream overrides only what differs.
What every remote provider shares to survive a hostile upstream (deadlines, a cap on
what is read, malformed answers, secrets in error text) lives in `RemoteProvider` and
providers/guard.py.
"""
from __future__ import annotations

import asyncio
import math
from collections import deque
from typing import TYPE_CHECKING, Any, AsyncIterator, ClassVar

import aiohttp
import orjson

from config.schema import Seconds, Section
from plugins.errors import GatewayError, bad_request

from .guard import (  # noqa: F401  (UpstreamError is imported from here by the providers)
    UpstreamError, UpstreamLimits, answer_shape, check_response, check_usage, read_capped, scrubber,
)
from .http1 import HTTPError, MalformedResponse, Pool, Response

from .types import FLUSH, ChatRequest, ChatResponse, OtherPart, StreamEnd, StreamEvent

if TYPE_CHECKING:
    from config import ChatModel, ProviderConfig


def map_upstream_status(provider: str, status: int, detail: str, retry_after: str | None) -> UpstreamError:
    """What the client sees for an upstream HTTP error.

    The client's request may be at fault (400/413/422: say so, with the upstream's words);
    the operator's setup may be at fault (401/403/404: the provider refused *our*
    credentials or model id, which is not the client's 401); or the upstream is down (502).
    """
    if status in (400, 413, 422):
        return UpstreamError(400 if status == 422 else status,
                             f"{provider} rejected the request: {detail}", code="upstream_rejected")
    if status == 429:
        return UpstreamError(429, f"{provider} is rate limiting the gateway; retry shortly ({detail})",
                             code="upstream_rate_limited", retry_after=retry_after or "1")
    if status in (401, 403):
        return UpstreamError(502, f"{provider} refused the gateway's credentials ({detail}); "
                                  f"the operator must fix the provider's api_key", code="upstream_auth")
    return UpstreamError(502, f"{provider} failed with HTTP {status}: {detail}")


class Provider:
    """What the pipeline needs from any provider, HTTP or not."""

    type_name: ClassVar[str] = ""
    Settings: ClassVar[type[Section]] = Section   # the YAML block's schema (besides `type`)
    emits_flush: ClassVar[bool] = False   # True if its streams mark where to write (see Flush)
    wire_format: ClassVar[str] = ""   # client format spoken natively, for pass-through

    def __init__(self, config: "ProviderConfig", http: aiohttp.ClientSession | None):
        self.name = config.name
        self.config = config
        self.settings = config.typed if config.typed is not None else self.Settings.model_validate(config.settings)
        self.http = http

    def unavailable_reason(self) -> str | None:
        """Why this provider cannot serve now (e.g. no API key), or None."""
        return None

    def scrub(self, text: str, status: int | None = None) -> str:
        """Upstream text made safe to relay (remote providers remove their secrets)."""
        return text

    def same_format(self, req: ChatRequest) -> bool:
        """True when the client spoke this upstream's own wire format: pass it through."""
        return req.raw is not None and req.extra_format == self.wire_format != ""

    def refuse_foreign_parts(self, req: ChatRequest) -> None:
        """A block only another wire format understands is a 400, never silently dropped."""
        if self.same_format(req):
            return
        for i, m in enumerate(req.messages):
            for p in m.parts:
                if isinstance(p, OtherPart) and p.format != self.wire_format:
                    kind = p.data.get("type", "this kind of")
                    raise bad_request(f"messages[{i}]: {kind} blocks are not supported by this model's "
                                      f"provider ({self.type_name}); send them to an Anthropic model",
                                      param=f"messages[{i}].content")

    async def complete(self, req: ChatRequest, model: "ChatModel") -> ChatResponse:
        raise NotImplementedError

    def stream(self, req: ChatRequest, model: "ChatModel") -> AsyncIterator[StreamEvent | list[StreamEvent]]:
        """The answer's events as they arrive; a list of events is what one network read
        brought, written together (as if followed by a Flush)."""
        raise NotImplementedError


class RemoteSettings(Section):
    base_url: str | None = None
    api_key: str = ""
    # deadlines and size caps (providers/guard.py LIMIT_SETTINGS has the defaults)
    total_timeout_seconds: Seconds | None = None
    first_byte_timeout_seconds: Seconds | None = None
    idle_timeout_seconds: Seconds | None = None
    connect_timeout_seconds: Seconds | None = None
    timeout_seconds: Seconds | None = None      # older name of idle_timeout_seconds
    max_response_mb: Seconds | None = None
    max_event_mb: Seconds | None = None


class HTTPSettings(RemoteSettings):
    pass


class RemoteProvider(Provider):
    """A provider reached over the network with a base URL and an API key; until the key
    is set it cannot serve, and says which variable to set."""
    default_base_url: ClassVar[str] = ""
    Settings = RemoteSettings

    def __init__(self, config, http):
        super().__init__(config, http)
        self.base_url = (self.settings.base_url or self.default_base_url).rstrip("/")
        self.api_key = self.settings.api_key
        self.limits = UpstreamLimits.from_settings(config.settings)   # the checked block, as written
        self.scrub = scrubber(self.name, config.settings)

    def error_status(self, status: int, body: Any) -> int:
        """What an upstream's error status means; an upstream that answers a bad key with a
        400 (Google does) says 401 here, so the operator is blamed, not the client."""
        return status

    def upstream_error(self, status: int, detail: str, retry_after: str | None) -> "UpstreamError":
        """An upstream HTTP error as the client sees it, the upstream's words scrubbed of
        secrets (the full text goes to the operator's log)."""
        return map_upstream_status(self.name, status, self.scrub(detail, status=status), retry_after)

    def unavailable_reason(self) -> str | None:
        if self.api_key:
            return None
        var = self.config.unset_env.get("api_key")
        how = f"set the environment variable {var}" if var else f"set providers.{self.name}.api_key"
        return f"provider {self.name!r} has no API key: the operator must {how} and restart"


class HTTPProvider(RemoteProvider):
    path: ClassVar[str] = "/chat/completions"
    emits_flush: ClassVar[bool] = True    # the relay may gather events until a Flush
    Settings = HTTPSettings
    # The app's upstream connections for chat calls (set where the app makes its shared
    # ClientSession, which the provider's other calls use as `http`).
    pool: Pool | None = None

    # -- declarative bits a subclass overrides --------------------------------------
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def url(self, req: ChatRequest, upstream: str) -> str:
        return self.base_url + self.path

    def build_request(self, req: ChatRequest, upstream: str) -> dict[str, Any]:
        raise NotImplementedError

    def parse_response(self, body: dict[str, Any], req: ChatRequest) -> ChatResponse:
        raise NotImplementedError

    def parse_stream(self, events: AsyncIterator[tuple[str, bytes]], req: ChatRequest) -> AsyncIterator[StreamEvent]:
        raise NotImplementedError

    def stream_parser(self, req: ChatRequest) -> "StreamParser | None":
        """A synchronous parser of whole network reads, where the provider has one (cheaper
        than `parse_stream`'s await per event); None: `parse_stream` it is."""
        return None

    def error_message(self, body: Any) -> str | None:
        if isinstance(body, dict):
            err = body.get("error")
            if isinstance(err, dict) and err.get("message"):
                return str(err["message"])
            if isinstance(err, str):
                return err
        return None

    # -- shared transport ------------------------------------------------------------
    async def complete(self, req: ChatRequest, model: "ChatModel") -> ChatResponse:
        with answer_shape(self):
            async with self._post(req, model) as resp:
                raw = await read_capped(self, resp)
                if resp.status != 200:
                    raise self._error(resp, raw)
                try:
                    body = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    raise UpstreamError(502, f"{self.name} answered with a body that is not JSON") from None
                return check_response(self.parse_response(body, req))

    async def stream(self, req: ChatRequest, model: "ChatModel") -> AsyncIterator[StreamEvent | list[StreamEvent]]:
        with answer_shape(self):
            request = self._post(req, model, first_byte=True)
            async with request as resp:
                if resp.status != 200:
                    async with asyncio.timeout_at(request.end):
                        raw = await read_capped(self, resp)
                    raise self._error(resp, raw)
                reader = SSEReader(resp.content, self.name, self.limits, request.end)
                try:
                    parser = self.stream_parser(req)
                    if parser is None:
                        async for event in self.parse_stream(reader, req):
                            if isinstance(event, StreamEnd):
                                check_usage(event.usage)
                            yield event
                            if reader.drained:        # all this read brought is out: the relay may write it
                                yield FLUSH
                        return
                    # The events of each network read parsed in one go (no await per event) and
                    # yielded as one list, which the relay writes together; an error is raised after
                    # the events parsed before it, as parse_stream would.
                    while True:
                        batch = await reader.batch()
                        events, error = parser.feed(batch) if batch else parser.end()
                        if events:
                            if events[-1].__class__ is StreamEnd:
                                check_usage(events[-1].usage)
                            yield events
                        if error is not None:
                            raise error
                        if not batch or parser.ended:
                            return
                finally:
                    reader.close()            # its read-deadline timer

    def _post(self, req: ChatRequest, model: "ChatModel", *, first_byte: bool = False):
        self.refuse_foreign_parts(req)
        body = orjson.dumps(self.build_request(req, model.upstream))
        headers = {"Content-Type": "application/json", **self.headers()}
        if self.same_format(req):
            headers.update(req.headers)
        wait = self.limits.first_byte if first_byte else None
        return _Request(self, self.url(req, model.upstream), body, headers, wait)

    def _error(self, resp: Response, raw: bytes) -> UpstreamError:
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        detail = self.error_message(body) or raw[:200].decode("utf-8", "replace").strip() or resp.reason or "no detail"
        return self.upstream_error(self.error_status(resp.status, body), detail, resp.headers.get("Retry-After"))


class _Request:
    """`async with` a POST through the provider's pool, turning transport failures
    (connecting or reading) into UpstreamError (502). The provider's total deadline (`end`,
    loop time, reckoned as aiohttp did) bounds everything; `wait` bounds the time to the
    response headers (a stream's first-byte deadline). For a stream the total deadline is
    then kept by its SSEReader; for a JSON answer one timer keeps it to the end of the
    block. Leaving before the answer's end, or with an error, closes the connection rather
    than returning it to the pool."""

    def __init__(self, provider: HTTPProvider, url: str, body: bytes, headers: dict[str, str],
                 wait: float | None = None):
        self.p, self.url, self.body, self.headers, self.wait = provider, url, body, headers, wait
        self._resp: Response | None = None
        self._total: Deadline | None = None
        self.end: float | None = None

    async def __aenter__(self) -> Response:
        p = self.p
        loop = asyncio.get_running_loop()
        now = loop.time()
        self.end = end = total_deadline(now, p.limits.total)
        when = end if self.wait is None else now + self.wait if end is None else min(now + self.wait, end)
        deadline = None if when is None else Deadline(loop, when)
        try:
            self._resp = await p.pool.post(self.url, self.body, self.headers, p.limits.connect)
        except BaseException as exc:
            if deadline is not None and deadline.left(exc.__class__):
                raise UpstreamError(502, f"{p.name} did not answer in time", code="upstream_timeout") from None
            error = _failed(p.name, exc, mid_response=False)
            if error is None:
                raise
            raise error from None
        if self.wait is None:
            self._total = deadline          # goes on bounding the body
        elif deadline is not None:
            deadline.left(None)
        return self._resp

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if self._resp is not None:
            self._resp.close()
        # The body can fail after the headers arrived: that too is the upstream failing.
        total, self._total = self._total, None
        if total is not None and total.left(exc_type):
            exc_type = asyncio.TimeoutError
        if exc_type is not None and issubclass(exc_type, asyncio.TimeoutError):
            raise UpstreamError(502, f"{self.p.name} stopped answering mid-response", code="upstream_timeout") from None
        if exc_type is not None and issubclass(exc_type, HTTPError):
            raise _failed(self.p.name, exc, mid_response=True) from None


def _failed(provider: str, exc: BaseException, mid_response: bool) -> UpstreamError | None:
    """A transport failure as the client sees it; None for anything else."""
    if isinstance(exc, MalformedResponse):
        return UpstreamError(502, f"{provider} sent an answer the gateway cannot read: {exc}")
    if isinstance(exc, asyncio.TimeoutError):       # connecting took longer than its deadline
        return UpstreamError(502, f"{provider} did not answer in time", code="upstream_timeout")
    if isinstance(exc, (HTTPError, OSError)):        # (ssl errors are OSErrors)
        if mid_response:
            return UpstreamError(502, f"{provider} connection broke mid-response: {exc.__class__.__name__}")
        return UpstreamError(502, f"could not reach {provider}: {exc.__class__.__name__}")
    return None


class Deadline:
    """`with Deadline(loop, when):` around an await does what `async with
    asyncio.timeout_at(when):` does (the task is cancelled at `when`, and that cancellation
    leaves the block as TimeoutError), with one timer handle and no coroutine of its own: a
    third of the instructions."""
    __slots__ = ("task", "cancelling", "expired", "timer")

    def __init__(self, loop: asyncio.AbstractEventLoop, when: float):
        self.task = asyncio.current_task()
        self.cancelling = self.task.cancelling()
        self.expired = False
        self.timer = loop.call_at(when, self._expire)

    def _expire(self) -> None:
        self.task.cancel()
        self.expired = True

    def __enter__(self) -> "Deadline":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.left(exc_type):
            raise asyncio.TimeoutError from exc

    def left(self, exc_type) -> bool:
        """The block is left (with `exc_type` or None); -> True if that is the deadline passing."""
        self.timer.cancel()
        return self.expired and self.task.uncancel() <= self.cancelling and exc_type is asyncio.CancelledError


def total_deadline(now: float, total: float) -> float | None:
    """When a call started at loop time `now` reaches its total deadline, as aiohttp reckons
    it (a deadline of 5 s or more rounded up to a whole second; none if not positive)."""
    if not total > 0:
        return None
    return math.ceil(now + total) if total >= 5 else now + total


class StreamParser:
    """Upstream SSE events -> canonical events, one network read at a time. `feed` and
    `end` return (the events, a StreamEnd only as the last; the exception that stopped
    parsing or None); once `ended` (the upstream said it is done) nothing more is read."""
    ended = False

    def feed(self, events: list[tuple[str, bytes]]) -> tuple[list[StreamEvent], BaseException | None]:
        raise NotImplementedError

    def end(self) -> tuple[list[StreamEvent], BaseException | None]:
        """The upstream closed the stream."""
        raise NotImplementedError


class SSEReader:
    """Server-sent events as (event name or "", data bytes), as soon as each arrives.

    Reads whatever the socket delivers and splits complete events out of it (one await
    per network read, not per line), with LF or CRLF framing and multi-line data.
    `drained` says that every event of the last read has been handed out, which is when
    the relay should write what it has gathered. A dropped connection or a read timeout
    becomes an UpstreamError, never a silently shortened stream.

    The read deadline (first byte, then idle) is one timer per stream that each read only
    moves forward, not a timer armed and cancelled per read: when it fires early it waits
    again for the latest deadline, and when a read has really waited that long it fails the
    read. Time spent between reads (writing to a slow client) never counts. The same timer
    keeps the call's total deadline `end` (loop time), rather than a timer context entered
    on every read: a read waiting when it passes fails, and so does any read after it.
    `close()` drops the timer.
    """

    def __init__(self, content: Response, provider: str, limits: UpstreamLimits | None = None,
                 end: float | None = None):
        self.content = content
        self.provider = provider
        self.buffer = b""
        self.events: deque[tuple[str, bytes]] = deque()
        limits = limits or UpstreamLimits()
        self.wait, self.idle, self.max_event = limits.first_byte, limits.idle, limits.max_event_bytes
        self.loop: asyncio.AbstractEventLoop | None = None
        self.deadline = 0.0
        self.end = math.inf if end is None else end
        self.reading = False            # a read is waiting (only then can the deadline pass)
        self.timer: asyncio.TimerHandle | None = None

    @property
    def drained(self) -> bool:
        return not self.events

    def __aiter__(self) -> "SSEReader":
        return self

    async def __anext__(self) -> tuple[str, bytes]:
        events = self.events
        if not events:
            events.extend(await self.batch())
            if not events:
                raise StopAsyncIteration
        return events.popleft()

    async def batch(self) -> list[tuple[str, bytes]]:
        """Every event the next network read brought (at least one), or [] at the end.
        Reads until at least one event is complete (the stream's reads awaited here
        directly: no layer between this and the socket's buffer)."""
        events = self.events
        while not events:
            try:
                now = (self.loop or self._started()).time()
                if now >= self.end:
                    raise self._overdue()
                content = self.content
                data = content.ready()          # what has arrived, if any: no read can stall
                if data is None:
                    self.deadline = now + self.wait
                    if self.timer is None or self.deadline < self.timer.when():     # (idle after a longer first byte)
                        self._arm()
                    self.reading = True
                    try:
                        data = content.got(await content.wait())
                    finally:
                        self.reading = False
                self.wait = self.idle           # after the first read: the idle deadline
            except HTTPError as exc:
                raise UpstreamError(502, f"{self.provider} connection broke mid-stream: "
                                         f"{exc.__class__.__name__}") from None
            if not data:                        # the end of the stream
                self.close()
                self._split(self.buffer.strip(b"\r\n") + b"\n\n" if self.buffer.strip() else b"")
                self.buffer = b""
                break
            self.buffer = self._split(self.buffer + data if self.buffer else data)
            if len(self.buffer) > self.max_event:
                raise UpstreamError(502, f"{self.provider} sent a stream event larger than "
                                         f"{self.max_event / 1e6:g} MB", code="upstream_too_large")
        batch = list(events)
        events.clear()
        return batch

    def _started(self) -> asyncio.AbstractEventLoop:
        self.loop = asyncio.get_running_loop()
        return self.loop

    def _arm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.loop.call_at(min(self.deadline, self.end), self._expire)

    def _expire(self) -> None:
        """The timer: fail the waiting read if its deadline passed; else wait for the deadline."""
        self.timer = None
        if not self.reading:            # between reads: the next read sets its own deadline
            return
        now = self.loop.time()
        if now >= self.end:
            error = self._overdue()
        elif now < self.deadline:
            self._arm()
            return
        else:
            error = UpstreamError(502, f"{self.provider} stopped sending mid-stream", code="upstream_timeout")
        self.content.set_exception(error)

    def _overdue(self) -> UpstreamError:
        return UpstreamError(502, f"{self.provider} stopped answering mid-response", code="upstream_timeout")

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _split(self, buffer: bytes) -> bytes:
        """Queue the complete events in `buffer`; -> what is left of an incomplete one."""
        if _CR in buffer:
            buffer = buffer.replace(b"\r\n", b"\n")
        elif buffer[:6] == b"data: ":      # most reads: events of one data line each, split in one go
            end = buffer.rfind(b"\n\n")
            datas = buffer[6:end].split(b"\n\ndata: ")
            if end > 0 and _LF not in b"".join(datas):      # no other line in them (a copy and a
                # memchr: a third of counting the buffer's line feeds, which goes byte by byte)
                self.events.extend([("", data) for data in datas])
                return buffer[end + 2:]
        blocks = buffer.split(b"\n\n")
        rest = blocks.pop()
        append = self.events.append
        for block in blocks:
            if block[:6] == b"data: " and _LF not in block:     # most events: one data line
                append(("", block[6:]))
            elif (event := _parse_block(block)) is not None:
                append(event)
        return rest


_CR, _LF = ord("\r"), ord("\n")     # `in` with a byte's value is a plain memchr, cheaper than with b"\n"


def _parse_block(block: bytes) -> tuple[str, bytes] | None:
    event, data = "", []
    for line in block.split(b"\n"):
        if line.startswith(b"data:"):
            data.append(line[6:] if line[5:6] == b" " else line[5:])
        elif line.startswith(b"event:"):
            event = line[6:].strip().decode()
        # comments (":") and other fields are ignored, as SSE requires
    return (event, b"\n".join(data)) if data else None


def loads_event(provider: str, data: bytes) -> dict[str, Any]:
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise UpstreamError(502, f"{provider} sent a stream event that is not JSON") from None
    if not isinstance(obj, dict):
        raise UpstreamError(502, f"{provider} sent a stream event that is not an object")
    return obj
