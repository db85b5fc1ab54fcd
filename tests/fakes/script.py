"""Scripted replies and the plumbing every fake upstream shares.

A test describes *what the model says* once, as a provider-neutral `Reply`;
each fake renders it in its own wire format. Everything that must behave the
same across fakes (ids, chunking, stop mapping, request log, SSE writing)
lives here so the fakes cannot drift apart.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import secrets
import string
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, NamedTuple

from aiohttp import web

CANONICAL_STOPS = ("end", "max_tokens", "tool_use", "stop_sequence", "content_filter")


@dataclass
class ToolCallSpec:
    name: str
    arguments: str  # JSON text, e.g. '{"city":"Paris"}'
    id: str | None = None  # generated if None (call_... for OpenAI, toolu_... for Anthropic)


@dataclass
class Reply:
    text: str = "Hello from the fake upstream."
    tool_calls: list[ToolCallSpec] = field(default_factory=list)
    reasoning: str = ""  # Anthropic: thinking block (with signature) before the text; OpenAI: ignored
    stop: str = "end"  # end | max_tokens | tool_use | stop_sequence | content_filter
    stop_sequence: str | None = None
    input_tokens: int = 12  # uncached input
    output_tokens: int = 7
    cache_read_tokens: int = 0
    error_status: int | None = None  # answer with the provider's error body at this status
    error_message: str = "fake upstream error"
    fail_after_events: int | None = None  # stream only: mid-stream error after this many deltas
    chunk_delay: float = 0.0  # seconds between stream events
    text_chunks: int = 3  # split text into about this many deltas


@dataclass
class RecordedRequest:
    headers: dict[str, str]  # lower-cased names
    body: dict | None  # parsed JSON; None if the body was not a JSON object
    path: str
    rejected: str | None = None  # error message the fake answered with, if it refused the request
    disconnected: bool = False  # the client went away before the stream finished
    query: dict[str, str] = field(default_factory=dict)  # URL query (Gemini: ?alt=sse, ?key=)


class Invalid(Exception):
    """A request the real API would refuse; each fake renders it in its own error shape."""

    def __init__(
        self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code


# ---------------------------------------------------------------- ids and text

_ALNUM = string.ascii_letters + string.digits


def new_id(prefix: str, length: int = 24) -> str:
    """Random id in the provider's style, e.g. new_id("call_") -> call_Xy3...; unique per call."""
    return prefix + "".join(secrets.choice(_ALNUM) for _ in range(length))


def new_signature() -> str:
    """Opaque thinking signature; real ones are base64 blobs the client must echo back verbatim."""
    return "Eu" + base64.b64encode(secrets.token_bytes(48)).decode()


def split_text(text: str, parts: int) -> list[str]:
    """Cut text into about `parts` consecutive pieces (none for empty text) to mimic token deltas."""
    if not text:
        return []
    parts = max(1, min(parts, len(text)))
    size = math.ceil(len(text) / parts)
    return [text[i : i + size] for i in range(0, len(text), size)]


def split_arguments(arguments: str, parts: int) -> list[str]:
    """Tool arguments always arrive in >= 2 fragments so clients must concatenate, not replace."""
    return split_text(arguments, max(2, parts))


def arguments_of(call: ToolCallSpec) -> str:
    """The arguments JSON text; an empty script value means a call without arguments."""
    return call.arguments or "{}"


def arguments_object(call: ToolCallSpec) -> dict:
    """Arguments as an object (Anthropic's `input`); a non-object is a scripting mistake."""
    value = json.loads(arguments_of(call))
    if not isinstance(value, dict):
        raise ValueError(f"tool call {call.name!r}: arguments must be a JSON object")
    return value


def tool_ids(reply: Reply, prefix: str, length: int = 24) -> list[str]:
    """One id per scripted call, keeping scripted ids so tests can refer to them later."""
    return [call.id or new_id(prefix, length) for call in reply.tool_calls]


# ---------------------------------------------------------------- stop reasons

OPENAI_FINISH = {
    "end": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "stop_sequence": "stop",
    "content_filter": "content_filter",
}
ANTHROPIC_STOP = {
    "end": "end_turn",
    "max_tokens": "max_tokens",
    "tool_use": "tool_use",
    "stop_sequence": "stop_sequence",
    "content_filter": "refusal",
}
GEMINI_FINISH = {  # a tool call is a STOP with functionCall parts: Gemini has no tool stop
    "end": "STOP",
    "max_tokens": "MAX_TOKENS",
    "tool_use": "STOP",
    "stop_sequence": "STOP",
    "content_filter": "SAFETY",
}
# The Responses API has no finish reason: these stops make the response `incomplete`
# with this `incomplete_details.reason`; every other stop is `completed`.
RESPONSES_INCOMPLETE = {"max_tokens": "max_output_tokens", "content_filter": "content_filter"}


def canonical_stop(reply: Reply) -> str:
    """The stop to report: a reply with tool calls and the default stop ends with the tool stop."""
    if reply.stop not in CANONICAL_STOPS:
        raise ValueError(f"unknown stop {reply.stop!r}; expected one of {CANONICAL_STOPS}")
    if reply.tool_calls and reply.stop == "end":
        return "tool_use"
    return reply.stop


def mapped_stop(reply: Reply, table: dict[str, str]) -> str:
    """Provider spelling of the reply's stop reason."""
    return table[canonical_stop(reply)]


# ---------------------------------------------------------------- SSE frames


class Frame(NamedTuple):
    """One SSE event. `kind` lets the writer place a scripted mid-stream failure:
    "delta" carries content, "tail" finishes the response, "head"/"body" are framing."""

    kind: Literal["head", "body", "delta", "tail"]
    data: bytes


def sse(payload: Any, event: str | None = None) -> bytes:
    """Encode one SSE event; every event ends with a blank line on the wire."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data}\n\n".encode()


def failure_point(frames: list[Frame], after_deltas: int) -> int:
    """Index of the first frame NOT sent when the stream must fail after `after_deltas` deltas.

    The cut lands just before the next delta, or before the tail when the
    reply has fewer deltas, so the finishing events are never sent."""
    seen = 0
    for index, frame in enumerate(frames):
        if frame.kind == "tail" or (frame.kind == "delta" and seen >= after_deltas):
            return index
        seen += frame.kind == "delta"
    return len(frames)


# ---------------------------------------------------------------- base fake


class FakeUpstream:
    """Reply queue, request log and stream writer shared by the provider fakes."""

    def __init__(self, api_key: str) -> None:
        self.api_key = api_key
        self.requests: list[RecordedRequest] = []
        self._replies: deque[Reply] = deque()
        self.app = web.Application()

    def enqueue(self, *replies: Reply) -> None:
        """Script the next answers, first in first out; an empty queue answers Reply().
        Scripting mistakes fail here, in the test, not as a 500 inside the fake."""
        for reply in replies:
            self.check_reply(reply)
        self._replies.extend(replies)

    # Upstreams that send tool arguments as an object (Anthropic's input, Gemini's args)
    # need scripted arguments that are one: anything else is a scripting mistake.
    object_arguments = False

    def check_reply(self, reply: Reply) -> None:
        canonical_stop(reply)
        if self.object_arguments:
            for call in reply.tool_calls:
                arguments_object(call)

    def next_reply(self) -> Reply:
        return self._replies.popleft() if self._replies else Reply()

    async def record(self, request: web.Request) -> RecordedRequest:
        """Log the request before any check, so tests can inspect rejected ones too."""
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except (ValueError, UnicodeDecodeError):
            body = None
        recorded = RecordedRequest(
            headers=_lower_headers(request.headers.items()),
            body=body if isinstance(body, dict) else None,
            path=request.path,
            query=dict(request.query),
        )
        self.requests.append(recorded)
        return recorded

    async def write_stream(
        self,
        request: web.Request,
        recorded: RecordedRequest,
        frames: list[Frame],
        reply: Reply,
        error_frame: bytes,
        headers: dict[str, str],
    ) -> web.StreamResponse:
        """Send frames with the scripted pacing; on a scripted failure send `error_frame`
        in place of the rest and end the body, as the real APIs do after HTTP 200."""
        cut = len(frames)
        if reply.fail_after_events is not None:
            cut = failure_point(frames, reply.fail_after_events)
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers}
        )
        await response.prepare(request)
        try:
            for index, frame in enumerate(frames[:cut]):
                if index and reply.chunk_delay:
                    await asyncio.sleep(reply.chunk_delay)
                await response.write(frame.data)
            if cut < len(frames):
                await response.write(error_frame)
            await response.write_eof()
        except ConnectionError:
            recorded.disconnected = True
        except asyncio.CancelledError:
            recorded.disconnected = True
            raise
        return response


def _lower_headers(items: Iterable[tuple[str, str]]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, value in items:
        key = name.lower()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return headers


def json_response(payload: dict, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(payload, status=status, headers=headers or {})
