"""OpenAI chat completions, and any host that speaks it (set `base_url`).

Settings: base_url, api_key, timeout_seconds, and max_tokens_field (`max_tokens`, the
default most compatible hosts want, or `max_completion_tokens`, which OpenAI's own
reasoning models require).
"""
from __future__ import annotations

from typing import Any, AsyncIterator, Literal

from orjson import JSONDecodeError, dumps, loads

from .base import HTTPProvider, HTTPSettings, StreamParser, UpstreamError, loads_event
from .types import (
    CONTENT_FILTER, END, MAX_TOKENS, TOOL_USE, ChatRequest, ChatResponse, ImagePart, Message,
    ReasoningDelta, ReasoningPart, StreamEnd, StreamEvent, StreamStart, TextDelta, TextPart, TextRun, ToolCall,
    ToolCallDelta, ToolCallStart, ToolResult, Usage,
)

FINISH_TO_STOP = {"stop": END, "length": MAX_TOKENS, "tool_calls": TOOL_USE, "function_call": TOOL_USE,
                  "content_filter": CONTENT_FILTER}


# ---- canonical -> chat-completions messages (also used by the format-A renderer) ----

def image_part(p: ImagePart) -> dict:
    image: dict[str, Any] = {"url": p.url}
    if p.detail:
        image["detail"] = p.detail
    return {"type": "image_url", "image_url": image}


def to_openai_messages(messages: list[Message]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        results = [p for p in m.parts if isinstance(p, ToolResult)]
        for r in results:   # tool results travel as role "tool" messages, first
            out.append({"role": "tool", "tool_call_id": r.call_id, "content": r.text()})
        if m.role == "assistant":
            calls = [p for p in m.parts if isinstance(p, ToolCall)]
            msg: dict[str, Any] = {"role": "assistant", "content": m.text() or None}
            if calls:
                msg["tool_calls"] = [_tool_call(c) for c in calls]
            if msg["content"] is not None or calls:
                out.append(msg)
            continue
        parts = [p for p in m.parts if isinstance(p, (TextPart, ImagePart))]
        if not parts and results:
            continue
        if all(isinstance(p, TextPart) for p in parts):
            out.append({"role": m.role if m.role != "tool" else "user", "content": m.text()})
        else:
            out.append({"role": "user", "content": [
                {"type": "text", "text": p.text} if isinstance(p, TextPart) else image_part(p) for p in parts]})
    return out


def _tool_call(c: ToolCall) -> dict[str, Any]:
    if c.kind == "custom":
        return {"id": c.id, "type": "custom", "custom": {"name": c.name, "input": c.arguments}}
    return {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}


def to_openai_tools(req: ChatRequest) -> dict[str, Any]:
    if not req.tools:
        return {}
    tools = []
    for t in req.tools:
        if t.kind == "custom":
            custom: dict[str, Any] = {"name": t.name}
            if t.description:
                custom["description"] = t.description
            if t.format:
                custom["format"] = t.format
            tools.append({"type": "custom", "custom": custom})
            continue
        fn: dict[str, Any] = {"name": t.name, "parameters": t.parameters or {"type": "object", "properties": {}}}
        if t.description:
            fn["description"] = t.description
        if t.strict is not None:
            fn["strict"] = t.strict
        tools.append({"type": "function", "function": fn})
    out: dict[str, Any] = {"tools": tools}
    tc = req.tool_choice
    if tc is not None:
        if tc.mode == "tool":
            kind = next((t.kind for t in req.tools if t.name == tc.name), "function")
            out["tool_choice"] = {"type": kind, kind: {"name": tc.name}}
        else:
            out["tool_choice"] = tc.mode
        if tc.parallel is not None:
            out["parallel_tool_calls"] = tc.parallel
    return out


def usage_from_openai(u: dict[str, Any] | None) -> Usage | None:
    if not u:
        return None
    details = u.get("prompt_tokens_details") or {}
    out_details = u.get("completion_tokens_details") or {}
    # input, output, cache read, cache write, reasoning (positional: no keyword dict per call)
    return Usage(int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0),
                 int(details.get("cached_tokens") or 0), int(details.get("cache_write_tokens") or 0),
                 int(out_details.get("reasoning_tokens") or 0))


class OpenAISettings(HTTPSettings):
    max_tokens_field: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"


class OpenAIProvider(HTTPProvider):
    type_name = "openai"
    Settings = OpenAISettings
    wire_format = "chat_completions"
    default_base_url = "https://api.openai.com/v1"
    path = "/chat/completions"
    wants_reference_files = True      # image edits upload the references

    async def generate_images(self, job, model):
        from .openai_images import generate_images
        return await generate_images(self, job, model)

    def build_request(self, req: ChatRequest, upstream: str) -> dict[str, Any]:
        field = self.settings.max_tokens_field
        if self.same_format(req):
            body = {k: v for k, v in req.raw.items() if k not in ("max_tokens", "max_completion_tokens")}
            body.update({"model": upstream, field: req.max_tokens})   # the cap the hold covers
            if req.stream:
                body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
            return body
        body: dict[str, Any] = {"model": upstream, "messages": to_openai_messages(req.messages)}
        body[field] = req.max_tokens
        body.update(to_openai_tools(req))
        if req.stop:
            body["stop"] = req.stop
        if req.temperature is not None:
            body["temperature"] = req.temperature
        if req.top_p is not None:
            body["top_p"] = req.top_p
        if req.reasoning and req.reasoning.get("effort"):
            body["reasoning_effort"] = req.reasoning["effort"]
        if req.extra_format == self.wire_format:
            body.update(req.extra)
        if req.stream:
            # Always ask for usage: the last chunk is how a stream gets billed.
            body["stream"] = True
            body["stream_options"] = {**body.get("stream_options", {}), "include_usage": True}
        return body

    def parse_response(self, body: dict[str, Any], req: ChatRequest) -> ChatResponse:
        choices = body.get("choices") or []
        if not choices:
            raise UpstreamError(502, f"{self.name} answered without choices")
        choice = choices[0]
        msg = choice.get("message") or {}
        content: list = []
        if msg.get("reasoning_content"):
            content.append(ReasoningPart(text=msg["reasoning_content"]))
        if msg.get("content"):
            content.append(TextPart(msg["content"]))
        for call in msg.get("tool_calls") or []:
            if call.get("type") == "custom":
                c = call.get("custom") or {}
                content.append(ToolCall(call.get("id", ""), c.get("name", ""), c.get("input", ""), "custom"))
            else:
                fn = call.get("function") or {}
                content.append(ToolCall(call.get("id", ""), fn.get("name", ""), fn.get("arguments") or "{}"))
        stop = FINISH_TO_STOP.get(choice.get("finish_reason") or "stop", END)
        if msg.get("refusal") and not msg.get("content"):
            content.append(TextPart(msg["refusal"]))
            stop = CONTENT_FILTER
        # id, model, content, stop_reason, stop_sequence, usage, raw, raw_format (positional: no keyword dict)
        return ChatResponse(body.get("id", ""), body.get("model", ""), content, stop, None,
                            usage_from_openai(body.get("usage")), body, self.wire_format)

    async def parse_stream(self, events, req: ChatRequest) -> AsyncIterator[StreamEvent]:
        parser = ChunkParser(self.name)
        async for event in events:
            out, error = parser.feed((event,))
            for ev in out:
                if ev.__class__ is TextRun:     # one event each, as this interface promises
                    for text in ev.texts:
                        yield TextDelta(text)
                else:
                    yield ev
            if error is not None:
                raise error
            if parser.ended:
                return
        out, error = parser.end()
        for ev in out:
            yield ev
        if error is not None:
            raise error

    def stream_parser(self, req: ChatRequest) -> "ChunkParser | None":
        # a subclass that parses its stream its own way keeps its parse_stream
        return ChunkParser(self.name) if type(self).parse_stream is OpenAIProvider.parse_stream else None

    @staticmethod
    def _tool_delta(tc: dict, ordinal: dict[int, int], ids: dict[int, str]):
        index = int(tc.get("index", 0))
        call_id = tc.get("id")
        # Some hosts put every call on index 0; a new id there is a new call.
        if index not in ordinal or (call_id and ids.get(index) and call_id != ids[index]):
            ordinal[index] = len(ordinal) if index not in ordinal else max(ordinal.values()) + 1
            ids[index] = call_id or f"call_{index}"
            kind = "custom" if tc.get("type") == "custom" else "function"
            name = (tc.get("custom") if kind == "custom" else tc.get("function") or {}) or {}
            yield ToolCallStart(ordinal[index], ids[index], name.get("name", ""), kind)
        fn = tc.get("custom") if tc.get("type") == "custom" else tc.get("function")
        fragment = (fn or {}).get("input" if tc.get("type") == "custom" else "arguments")
        if fragment:
            yield ToolCallDelta(ordinal[index], fragment)


def text_of(string: bytes) -> str | None:
    """A chunk's content string (JSON, quotes included) as text; None if it is not one string."""
    try:
        text = loads(string)
    except JSONDecodeError:
        return None
    return text if text.__class__ is str else None


class ChunkParser(StreamParser):
    """Chat-completions stream chunks -> canonical events, a network read's worth at a time."""

    def __init__(self, name: str):
        self.name = name
        self.started = self.ended = False
        self.finish: str | None = None
        self.usage: Usage | None = None
        self.ordinal: dict[int, int] = {}      # upstream tool index -> our ordinal
        self.ids: dict[int, str] = {}          # upstream tool index -> id of the call open there
        # A text chunk's bytes around its content string, once a chunk showed them (see _learn):
        # a chunk with the same bytes around its string means only that text, so only the string
        # is parsed, those of a read's chunks in a row together (see _run). The template is tried
        # on a few text chunks at most.
        self.head: bytes | None = None
        self.tail = b""
        # OpenAI ends each chunk with an `obfuscation` string of letters and digits that changes
        # every time: then the tail is the bytes up to that string's opening quote, and `closing`
        # what follows it (a value of other characters sends its chunk to the full parse).
        self.closing: bytes | None = None
        self.tries = self.misses = 3

    def feed(self, events) -> tuple[list[StreamEvent], BaseException | None]:
        head = self.head
        if head is not None and len(events) == 1:     # a read of one chunk (a stream as it is generated):
            data = events[0][1]                       # a template chunk's string parsed alone, no lists
            string = self._content_string(data) if data.startswith(head) else None
            text = None if string is None else text_of(string)
            if text is not None:
                return ([TextDelta(text)] if text else []), None
            # anything else: the loop reads it as ever
        out: list[StreamEvent] = []
        append = out.append
        run: list[bytes] = []       # the template's chunks in a row
        strings: list[bytes] = []   # the content string of each, as sent
        try:
            for _, data in events:
                if head is not None and data.startswith(head):
                    string = self._content_string(data)
                    if string is not None:
                        run.append(data)
                        strings.append(string)
                        continue
                    self.misses -= 1        # text chunks whose tails differ (a field that changes
                    if not self.misses:     # every chunk other than OpenAI's `obfuscation`): no template
                        self.head = head = None
                        self.tries = 0
                if run:
                    self._run(run, strings, out)
                    run, strings = [], []
                if data[:1] != b"{" and data.strip() == b"[DONE]":
                    self.ended = True
                    append(self._end())
                    break
                chunk = loads_event(self.name, data)
                if "error" in chunk:
                    err = chunk["error"]
                    raise UpstreamError(502, f"{self.name} failed mid-stream: "
                                             f"{err.get('message') if isinstance(err, dict) else err}")
                if not self.started:
                    self.started = True
                    append(StreamStart(id=chunk.get("id", ""), model=chunk.get("model", "")))
                if chunk.get("usage"):
                    self.usage = usage_from_openai(chunk["usage"])
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta") or {}
                    if delta.get("reasoning_content"):
                        append(ReasoningDelta(text=delta["reasoning_content"]))
                    if delta.get("content"):
                        append(TextDelta(delta["content"]))
                    for tc in delta.get("tool_calls") or ():
                        out.extend(OpenAIProvider._tool_delta(tc, self.ordinal, self.ids))
                    if choice.get("finish_reason"):
                        self.finish = choice["finish_reason"]
                if head is None and self.tries and TextDelta is (out[-1].__class__ if out else None):
                    self._learn(data, chunk)
                    head = self.head
            if run:
                self._run(run, strings, out)
        except Exception as exc:       # the events before it still go out, then the error
            return out, exc
        return out, None

    def _content_string(self, data: bytes) -> bytes | None:
        """The content string of a chunk that starts with the template's head, when the rest
        is the template's tail (with OpenAI's letters-and-digits `obfuscation` value before the
        closing bytes, when the template has them); else None."""
        head, tail, closing = self.head, self.tail, self.closing
        if closing is None:
            return data[len(head):len(data) - len(tail)] if data.endswith(tail) else None
        if not data.endswith(closing):
            return None
        value = data.rfind(b'"', len(head), len(data) - len(closing)) + 1       # after its opening quote
        end = value - len(tail)
        if end >= len(head) and data[value:len(data) - len(closing)].isalnum() and data.startswith(tail, end):
            return data[len(head):end]
        return None

    def _run(self, run: list[bytes], strings: list[bytes], out: list[StreamEvent]) -> None:
        """Template chunks in a row: their `strings` (what lies between the template's bytes)
        parsed in one go as the items of one array. When each chunk holds one string (the array
        has one string per chunk), they are a TextRun; else the chunks are parsed whole, one by
        one, as any other."""
        if len(run) == 1:           # a read of one chunk (a stream as it is generated): its string alone
            text = text_of(strings[0])
            if text is not None:
                if text:
                    out.append(TextDelta(text))
                return
            texts = None
        else:
            array = b"[" + b",".join(strings) + b"]"
            try:
                texts = loads(array)
            except JSONDecodeError:
                texts = None
        if texts is None or len(texts) != len(run) or not all(t.__class__ is str for t in texts):
            template, self.head, tries, self.tries = self.head, None, self.tries, 0
            try:
                events, error = self.feed([("", data) for data in run])
            finally:
                self.head, self.tries = template, tries
            out.extend(events)
            if error is not None:
                raise error
            return
        if dumps(texts) == array:       # each string as orjson writes it: the upstream's bytes
            encoded = strings
        else:
            encoded = [dumps(t) for t in texts]
        if "" in texts:                 # an empty delta is no event
            encoded = [e for t, e in zip(texts, encoded) if t]
            texts = [t for t in texts if t]
            if not texts:
                return
        out.append(TextRun(texts, encoded))

    def _learn(self, data: bytes, chunk: dict) -> None:
        """Keep the bytes around this chunk's content string as the text template when the
        chunk means nothing but that text: one choice, whose delta is only the content, no
        finish reason, no usage (so a chunk with other text there changes nothing else). The
        place is checked by parsing the template around another string."""
        self.tries -= 1
        choices = chunk.get("choices")
        if (chunk.get("usage") or "error" in chunk or choices.__class__ is not list or len(choices) != 1
                or choices[0].__class__ is not dict or choices[0].get("finish_reason")):
            return
        delta = choices[0].get("delta")
        if delta.__class__ is not dict or len(delta) != 1:
            return
        start = data.find(b'"content":')
        if start < 0:
            return
        start += 10
        while data[start:start + 1] in (b" ", b"\t", b"\n", b"\r"):
            start += 1
        if data[start:start + 1] != b'"':
            return
        end = start + 1
        while True:                 # the closing quote: one not escaped by a backslash
            end = data.find(b'"', end)
            if end < 0:
                return
            slashes = 0
            while data[end - 1 - slashes] == 92:
                slashes += 1
            if slashes % 2 == 0:
                break
            end += 1
        head, tail = data[:start], data[end + 1:]
        try:
            probe = loads(head + b'"\\u0001"' + tail)
        except JSONDecodeError:
            return
        delta["content"] = "\x01"
        if probe != chunk:
            return
        self.head, self.tail = head, tail
        varying = chunk.get("obfuscation")
        if next(reversed(chunk)) == "obfuscation" and varying.__class__ is str:
            closing = b'"}'
            value = b'"' + varying.encode() + closing
            if tail.endswith(value) and varying.encode().isalnum():
                fixed = tail[:len(tail) - len(value) + 1]          # up to the value's opening quote
                try:
                    probe = loads(head + b'"\\u0001"' + fixed + b"Q" + closing)
                except JSONDecodeError:
                    return
                chunk["obfuscation"] = "Q"
                if probe == chunk:
                    self.tail, self.closing = fixed, closing

    def end(self) -> tuple[list[StreamEvent], BaseException | None]:
        if self.finish is None:
            return [], UpstreamError(502, f"{self.name} ended the stream before finishing")
        return [self._end()], None

    def _end(self) -> StreamEnd:
        return StreamEnd(stop_reason=FINISH_TO_STOP.get(self.finish or "stop", END), usage=self.usage)
