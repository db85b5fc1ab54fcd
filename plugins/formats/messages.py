"""Format B: Anthropic messages, `POST /api/v1/messages` (clients use base `{base_url}/api`).

A key is required (x-api-key or Bearer). When the model's upstream is Anthropic, the
client's body goes through as sent (model swapped, refused sampling dropped) and the
answer comes back unchanged, streams frame by frame. Other upstreams get a translation
through the canonical types and answer with a faithful messages-format reply: content
blocks, mapped stop_reason, usage, the real event sequence with one block per index.
"""
from __future__ import annotations

import re
from typing import Any

import orjson
from aiohttp import web

from plugins import hookimpl
from plugins.appstate import REQUEST_ID
from plugins.context import CallContext
from plugins.errors import GatewayError, bad_request
from providers.anthropic import STOP_TO_ANTHROPIC
from providers.types import (
    ChatRequest, ChatResponse, ImagePart, Message, OtherPart, RawFrame, ReasoningDelta, ReasoningPart,
    StreamEnd, StreamStart, TextDelta, TextPart, Tool, ToolCall, ToolCallDelta, ToolCallStart, ToolChoice,
    ToolResult, Usage,
)

from .base import ClientFormat, Fields, StreamWriter, client_image, json_response, named_tool

MAX_TOKENS_CAP = 32768
KNOWN = {"model", "messages", "max_tokens", "system", "stop_sequences", "stream", "temperature", "top_p",
         "tools", "tool_choice", "thinking"}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               422: "invalid_request_error", 429: "rate_limit_error", 503: "overloaded_error",
               529: "overloaded_error"}
_DATED = re.compile(r"^(?P<base>.+?)(?:-\d{8}|-latest|@\d{8})$")


def parse_block(raw: Any, path: str, role: str):
    f = Fields(raw, path)
    kind = f.string("type", required=True)
    if kind == "text":
        text = raw.get("text")
        if not isinstance(text, str):
            raise f.fail("text", "must be a string")
        return TextPart(text)
    if kind == "image":
        src = Fields(raw.get("source"), f"{path}.source")
        if src.get("type") == "base64":
            return ImagePart(f"data:{src.string('media_type', required=True)};base64,{src.string('data', required=True)}")
        if src.get("type") == "url":
            return client_image(src.string("url", required=True), src.path("url"))
        raise src.fail("type", "must be base64 or url")
    if kind == "tool_use" and role == "assistant":
        args = raw.get("input", {})
        if not isinstance(args, dict):
            raise f.fail("input", "must be an object")
        return ToolCall(f.string("id", required=True), f.string("name", required=True), orjson.dumps(args).decode())
    if kind == "tool_result" and role == "user":
        content = raw.get("content", "")
        if isinstance(content, list):
            content = [parse_block(b, f"{path}.content[{i}]", "user") for i, b in enumerate(content)]
            if not all(isinstance(b, (TextPart, ImagePart)) for b in content):
                raise f.fail("content", "tool results hold text and image blocks")
        elif not isinstance(content, str):
            raise f.fail("content", "must be a string or an array of blocks")
        return ToolResult(f.string("tool_use_id", required=True), content, is_error=bool(raw.get("is_error")))
    if kind == "thinking" and role == "assistant":
        return ReasoningPart(text=str(raw.get("thinking", "")), signature=raw.get("signature"))
    if kind == "redacted_thinking" and role == "assistant":
        return ReasoningPart(redacted=f.string("data", required=True))
    if kind in ("document", "search_result", "server_tool_use", "web_search_tool_result", "container_upload"):
        return OtherPart("messages", raw)
    raise f.fail("type", f"block type {kind!r} is not allowed in a {role} message")


def parse_messages(f: Fields) -> list[Message]:
    out: list[Message] = []
    system = f.get("system")
    if isinstance(system, str):
        if system:
            out.append(Message("system", [TextPart(system)]))
    elif isinstance(system, list):
        for i, block in enumerate(system):
            b = Fields(block, f"system[{i}]")
            if b.get("type") != "text":
                raise b.fail("type", "system blocks must be text")
            out.append(Message("system", [TextPart(b.string("text", required=True))]))
    elif system is not None:
        raise f.fail("system", "must be a string or an array of text blocks")
    for i, raw in enumerate(f.array("messages", required=True, nonempty=True)):
        m = Fields(raw, f"messages[{i}]")
        role = m.string("role", required=True)
        if role not in ("user", "assistant", "system"):
            raise m.fail("role", f"must be user or assistant, got {role!r}")
        content = raw.get("content")
        if isinstance(content, str):
            parts = [TextPart(content)]
        elif isinstance(content, list):
            parts = [parse_block(b, f"messages[{i}].content[{j}]", role) for j, b in enumerate(content)]
        else:
            raise m.fail("content", "must be a string or an array of content blocks")
        out.append(Message(role, parts))
    return out


def parse_tools(f: Fields) -> list[Tool]:
    tools = []
    for i, raw in enumerate(f.array("tools")):
        t = Fields(raw, f"tools[{i}]")
        if raw.get("type") not in (None, "custom"):
            continue        # server tools (web search, ...) have no equivalent elsewhere
        schema = raw.get("input_schema")
        if not isinstance(schema, dict):
            raise t.fail("input_schema", "is required and must be a JSON schema object")
        tools.append(Tool(t.string("name", required=True), t.string("description"), schema))
    return tools


def parse_tool_choice(f: Fields, tools: list[Tool]) -> ToolChoice | None:
    raw = f.get("tool_choice")
    if raw is None:
        return None
    t = Fields(raw, "tool_choice")
    kind = t.string("type", required=True)
    disable = raw.get("disable_parallel_tool_use")
    parallel = None if disable is None else not disable
    modes = {"auto": "auto", "any": "required", "none": "none"}
    if kind in modes:
        return ToolChoice(modes[kind], parallel=parallel)
    if kind == "tool":
        return named_tool(t, "name", t.string("name", required=True), tools, parallel)
    raise t.fail("type", "must be auto, any, tool or none")


class MessagesFormat(ClientFormat):
    name = "messages"
    path = "/api/v1/messages"
    endpoint = "messages"
    key_required = True
    max_input_chars = 800_000
    pass_headers = ("anthropic-beta",)
    allows_smart = False

    def parse(self, body: Any) -> ChatRequest:
        f = Fields(body)
        model = f.string("model", required=True)
        max_tokens = f.integer("max_tokens", required=True, minimum=1, maximum=MAX_TOKENS_CAP)
        tools = parse_tools(f)
        thinking = f.get("thinking")
        reasoning = None
        if isinstance(thinking, dict) and thinking.get("type") == "enabled":
            reasoning = {"budget_tokens": thinking.get("budget_tokens")}
        return ChatRequest(
            model=model, messages=parse_messages(f), max_tokens=max_tokens, stream=f.boolean("stream"),
            tools=tools, tool_choice=parse_tool_choice(f, tools), stop=f.stop_list("stop_sequences"),
            temperature=f.number("temperature"), top_p=f.number("top_p"), reasoning=reasoning,
            extra={k: v for k, v in body.items() if k not in KNOWN}, extra_format=self.name, raw=body)

    def resolve_model(self, model_id: str, cfg) -> str:
        """Menu ids as they are; Anthropic's own ids (dated or not) to the menu model that
        serves them; any haiku-tier id to the cheapest Anthropic model on the menu."""
        if model_id == "svc/smart":
            raise bad_request("svc/smart is not available on /messages; name a model", param="model")
        if model_id in cfg.chat_models:
            return model_id
        anthropic = [m for m in cfg.chat_models.values() if cfg.providers[m.provider].type == "anthropic"]
        match = _DATED.match(model_id)
        for candidate in (model_id, match.group("base") if match else None):
            for m in anthropic:
                if candidate and candidate == m.upstream:
                    return m.id
        if "haiku" in model_id and anthropic:
            return min(anthropic, key=lambda m: (m.input_micro + m.output_micro, m.id)).id
        raise bad_request(f"model {model_id!r} is not served here; GET /api/v1/models lists the ids",
                          param="model")

    def render(self, resp: ChatResponse, ctx: CallContext) -> dict[str, Any]:
        if resp.raw_format == self.name and resp.raw:
            return with_required_keys(resp.raw)          # the provider's message, completed
        return message_body(ctx, [_block(p) for p in resp.content if _renderable(p)],
                            STOP_TO_ANTHROPIC.get(resp.stop_reason, "end_turn"), resp.stop_sequence,
                            usage_body(resp.usage or Usage()))

    def stream_writer(self, ctx: CallContext) -> "EventWriter":
        return EventWriter(ctx)

    def error_body(self, err: GatewayError) -> dict[str, Any]:
        kind = ERROR_TYPES.get(err.status, "api_error" if err.status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": err.message}, "request_id": None}

    def error_response(self, err: GatewayError, request_id: str | None = None) -> web.Response:
        """Anthropic's errors name the request; ours carry the gateway's request id."""
        body = err.body if err.body is not None else {**self.error_body(err), "request_id": request_id}
        return json_response(body, status=err.status, headers=err.headers)


def message_body(ctx: CallContext, content: list, stop_reason: str | None, stop_sequence: str | None,
                 usage: dict[str, Any]) -> dict[str, Any]:
    """A Message with every key the schema requires: nothing to say about containers or
    stop details is null, as Anthropic sends it."""
    return {"id": f"msg_{ctx.call_id}", "type": "message", "role": "assistant", "model": ctx.route.model.id,
            "content": content, "stop_reason": stop_reason, "stop_sequence": stop_sequence,
            "stop_details": None, "container": None, "usage": usage}


def _renderable(p) -> bool:
    return (isinstance(p, TextPart) and p.text) or isinstance(p, (ToolCall, ReasoningPart))


def _block(p) -> dict[str, Any]:
    if isinstance(p, TextPart):
        return {"type": "text", "text": p.text, "citations": None}
    if isinstance(p, ToolCall):
        try:
            args = orjson.loads(p.arguments or "{}")
        except orjson.JSONDecodeError:
            args = {"input": p.arguments}
        return tool_use_block(p.id, p.name, args if isinstance(args, dict) else {})
    if p.redacted:
        return {"type": "redacted_thinking", "data": p.redacted}
    return {"type": "thinking", "thinking": p.text, "signature": p.signature or ""}


# Keys the published schema requires that an Anthropic upstream may leave out (older API
# versions do): filled with the schema's default, never overriding what the upstream sent.
MESSAGE_DEFAULTS = {"stop_details": None, "container": None}
USAGE_DEFAULTS = {"cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "cache_creation": None,
                  "service_tier": None, "server_tool_use": None, "inference_geo": None}
DELTA_USAGE_DEFAULTS = {"input_tokens": None, "cache_creation_input_tokens": None,
                        "cache_read_input_tokens": None, "server_tool_use": None}
BLOCK_DEFAULTS = {"text": {"citations": None}, "tool_use": {"caller": {"type": "direct"}}}
_COMPLETED_FRAMES = (b"event: message_start", b"event: content_block_start", b"event: message_delta")


def with_required_keys(message: dict[str, Any]) -> dict[str, Any]:
    """An upstream Message with the schema's required keys present."""
    return {**MESSAGE_DEFAULTS, **message, "usage": {**USAGE_DEFAULTS, **(message.get("usage") or {})},
            "content": [_with_block_keys(b) for b in message.get("content") or []]}


def _with_block_keys(block: dict[str, Any]) -> dict[str, Any]:
    return {**BLOCK_DEFAULTS.get(block.get("type"), {}), **block}


def completed_frame(frame: bytes) -> bytes:
    """A relayed upstream frame; the three kinds that carry required keys are completed."""
    if not frame.startswith(_COMPLETED_FRAMES):
        return frame
    head, _, data = frame.partition(b"\ndata: ")
    ev = orjson.loads(data)
    if ev.get("type") == "message_start":
        ev["message"] = with_required_keys(ev.get("message") or {})
    elif ev.get("type") == "content_block_start":
        ev["content_block"] = _with_block_keys(ev.get("content_block") or {})
    elif ev.get("type") == "message_delta":
        ev["delta"] = {**MESSAGE_DEFAULTS, **(ev.get("delta") or {})}
        ev["usage"] = {**DELTA_USAGE_DEFAULTS, **(ev.get("usage") or {})}
    return head + b"\ndata: " + orjson.dumps(ev) + b"\n\n"


def tool_use_block(call_id: str, name: str, args: dict) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": args, "caller": {"type": "direct"}}


def usage_body(u: Usage) -> dict[str, Any]:
    """Anthropic counts cached input apart from input_tokens. Cache writes count as the
    default 5-minute kind; what another upstream cannot know (tier, region) is null."""
    return {**delta_usage(u), "cache_creation": {"ephemeral_5m_input_tokens": u.cache_write_tokens,
                                                 "ephemeral_1h_input_tokens": 0},
            "service_tier": None, "inference_geo": None}


def delta_usage(u: Usage) -> dict[str, Any]:
    """The cumulative counts `message_delta` carries."""
    return {"input_tokens": max(0, u.input_tokens - u.cache_read_tokens - u.cache_write_tokens),
            "output_tokens": u.output_tokens, "cache_creation_input_tokens": u.cache_write_tokens,
            "cache_read_input_tokens": u.cache_read_tokens, "server_tool_use": None}


def sse(event: str, data: dict[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class EventWriter(StreamWriter):
    """Canonical events -> the messages event sequence; one content block per index.
    Raw upstream frames (same-format upstream) are written as they came."""

    def __init__(self, ctx: CallContext):
        self.ctx = ctx
        self.next_index = 0
        self.open: tuple[str, int] | None = None      # (block type, index) of the open block
        self.tool_blocks: dict[int, int] = {}         # tool ordinal -> block index
        self.passthrough = ctx.route.provider.same_format(ctx.chat)

    def _start(self, block: dict[str, Any]) -> bytes:
        out = self._close()
        index = self.next_index
        self.next_index += 1
        self.open = (block["type"], index)
        return out + sse("content_block_start", {"type": "content_block_start", "index": index,
                                                 "content_block": block})

    def _close(self) -> bytes:
        if self.open is None:
            return b""
        index = self.open[1]
        self.open = None
        return sse("content_block_stop", {"type": "content_block_stop", "index": index})

    def _delta(self, index: int, delta: dict[str, Any]) -> bytes:
        return sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})

    def event(self, ev) -> bytes:
        if self.passthrough:
            return completed_frame(ev.data) if isinstance(ev, RawFrame) else b""
        if isinstance(ev, TextDelta):
            out = b"" if self.open and self.open[0] == "text" else self._start({"type": "text", "text": "",
                                                                                  "citations": None})
            return out + self._delta(self.open[1], {"type": "text_delta", "text": ev.text})
        if isinstance(ev, ToolCallDelta):
            return self._delta(self.tool_blocks[ev.index], {"type": "input_json_delta", "partial_json": ev.arguments})
        if isinstance(ev, ToolCallStart):
            out = self._start(tool_use_block(ev.id, ev.name, {}))
            self.tool_blocks[ev.index] = self.open[1]
            return out
        if isinstance(ev, ReasoningDelta):
            return self._reasoning(ev)
        if isinstance(ev, StreamStart):
            usage = usage_body(Usage(input_tokens=ev.input_tokens or self.ctx.hold.input_tokens))
            message = message_body(self.ctx, [], None, None, usage)
            return sse("message_start", {"type": "message_start", "message": message}) + sse("ping", {"type": "ping"})
        if isinstance(ev, StreamEnd):
            usage = delta_usage(ev.usage or Usage())
            delta = {"stop_reason": STOP_TO_ANTHROPIC.get(ev.stop_reason, "end_turn"), "stop_sequence": ev.stop_sequence,
                     "stop_details": None, "container": None}
            return (self._close() + sse("message_delta", {"type": "message_delta", "delta": delta, "usage": usage})
                    + sse("message_stop", {"type": "message_stop"}))
        return b""

    def _reasoning(self, ev: ReasoningDelta) -> bytes:
        if ev.redacted:
            return self._start({"type": "redacted_thinking", "data": ev.redacted}) + self._close()
        out = b""
        if not (self.open and self.open[0] == "thinking"):
            out = self._start({"type": "thinking", "thinking": "", "signature": ""})
        if ev.text:
            out += self._delta(self.open[1], {"type": "thinking_delta", "thinking": ev.text})
        if ev.signature:
            out += self._delta(self.open[1], {"type": "signature_delta", "signature": ev.signature})
        return out

    def error(self, err: GatewayError) -> bytes:
        kind = "overloaded_error" if "overloaded" in err.message.lower() else "api_error"
        return sse("error", {"type": "error", "error": {"type": kind, "message": err.message},
                             "request_id": self.ctx.request.get(REQUEST_ID)})


FORMAT = MessagesFormat()


@hookimpl
def gateway_register_formats(register):
    register(FORMAT)
