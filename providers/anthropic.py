"""Anthropic Messages API.

Settings: base_url, api_key, timeout_seconds, version (the `anthropic-version` sent;
default 2026-10-21). Under 2026-10-21 the API refuses `temperature`, `top_p` and `top_k`
even at their defaults, so they are dropped for that version.

Translation rules the API enforces (each one a 400 if broken): system text goes in the
top-level `system`; consecutive same-role turns merge; tool results answer the previous
assistant's tool_use blocks and come first in their user turn; text blocks are never
empty; images are raw base64 (no `data:` prefix) of four media types, or https URLs.
"""
from __future__ import annotations

from typing import Any, AsyncIterator

import orjson

from plugins.errors import bad_request

from .base import HTTPProvider, HTTPSettings, UpstreamError, loads_event
from .types import (
    CONTENT_FILTER, END, MAX_TOKENS, STOP_SEQUENCE, TOOL_USE, ChatRequest, ChatResponse, ImagePart,
    Message, RawFrame, ReasoningDelta, ReasoningPart, StreamEnd, StreamEvent, StreamStart, TextDelta, TextPart,
    ToolCall, ToolCallDelta, ToolCallStart, ToolResult, Usage,
)

DEFAULT_VERSION = "2026-10-21"
SAMPLING_REFUSED = {"2026-10-21": ("temperature", "top_p", "top_k")}
IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
STOP_FROM_ANTHROPIC = {"end_turn": END, "max_tokens": MAX_TOKENS, "tool_use": TOOL_USE,
                       "stop_sequence": STOP_SEQUENCE, "refusal": CONTENT_FILTER, "pause_turn": END,
                       "model_context_window_exceeded": MAX_TOKENS}
STOP_TO_ANTHROPIC = {END: "end_turn", MAX_TOKENS: "max_tokens", TOOL_USE: "tool_use",
                     STOP_SEQUENCE: "stop_sequence", CONTENT_FILTER: "refusal"}
CUSTOM_SCHEMA = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}


# ---- canonical -> Anthropic (also used by the messages format's renderer) ----------

def image_block(p: ImagePart) -> dict[str, Any]:
    if p.is_data:
        media_type, data = p.split_data_url()
        if media_type not in IMAGE_TYPES:
            raise bad_request(f"image type {media_type} is not supported here; use one of "
                              f"{', '.join(IMAGE_TYPES)}", param="messages")
        return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
    return {"type": "image", "source": {"type": "url", "url": p.url}}


def _tool_input(call: ToolCall) -> dict[str, Any]:
    if call.kind == "custom":
        return {"input": call.arguments}
    try:
        value = orjson.loads(call.arguments or "{}")
    except orjson.JSONDecodeError:
        raise bad_request(f"tool call {call.id} has arguments that are not JSON", param="messages") from None
    return value if isinstance(value, dict) else {"value": value}


def _result_block(r: ToolResult) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": r.call_id}
    if isinstance(r.content, str):
        if r.content:
            block["content"] = r.content
    else:
        parts = [{"type": "text", "text": p.text} if isinstance(p, TextPart) else image_block(p)
                 for p in r.content if not (isinstance(p, TextPart) and not p.text)]
        if parts:
            block["content"] = parts
    if r.is_error:
        block["is_error"] = True
    return block


def _blocks(m: Message) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for p in m.parts:
        if isinstance(p, TextPart):
            if p.text:
                blocks.append({"type": "text", "text": p.text})
        elif isinstance(p, ImagePart):
            blocks.append(image_block(p))
        elif isinstance(p, ToolCall):
            blocks.append({"type": "tool_use", "id": p.id, "name": p.name, "input": _tool_input(p)})
        elif isinstance(p, ToolResult):
            blocks.append(_result_block(p))
        elif isinstance(p, ReasoningPart):
            if p.redacted:
                blocks.append({"type": "redacted_thinking", "data": p.redacted})
            elif p.signature:   # unsigned reasoning (from another provider) cannot go back
                blocks.append({"type": "thinking", "thinking": p.text, "signature": p.signature})
    return blocks


def to_anthropic_messages(messages: list[Message]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """-> (system blocks, messages). Merges same-role turns; tool results lead their turn."""
    system: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "system":
            text = m.text()
            if text:
                system.append({"type": "text", "text": text})
            continue
        role = "assistant" if m.role == "assistant" else "user"
        blocks = _blocks(m)
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    for msg in out:
        if msg["role"] == "user":   # tool_result blocks must come first in a user turn
            msg["content"].sort(key=lambda b: b["type"] != "tool_result")
    return system, out


def usage_from_anthropic(u: dict[str, Any]) -> Usage:
    cache_read = int(u.get("cache_read_input_tokens") or 0)
    cache_write = int(u.get("cache_creation_input_tokens") or 0)
    details = u.get("output_tokens_details") or {}
    return Usage(input_tokens=int(u.get("input_tokens") or 0) + cache_read + cache_write,
                 output_tokens=int(u.get("output_tokens") or 0),
                 cache_read_tokens=cache_read, cache_write_tokens=cache_write,
                 reasoning_tokens=int(details.get("thinking_tokens") or 0))


class AnthropicSettings(HTTPSettings):
    version: str | None = None           # the anthropic-version header


class AnthropicProvider(HTTPProvider):
    type_name = "anthropic"
    Settings = AnthropicSettings
    wire_format = "messages"
    default_base_url = "https://api.anthropic.com"
    path = "/v1/messages"

    def __init__(self, config, http):
        super().__init__(config, http)
        self.version = self.settings.version or DEFAULT_VERSION

    def headers(self) -> dict[str, str]:
        return {"x-api-key": self.api_key, "anthropic-version": self.version}

    def build_request(self, req: ChatRequest, upstream: str) -> dict[str, Any]:
        if self.same_format(req):
            body = {**req.raw, "model": upstream, "max_tokens": req.max_tokens}   # the clamped cap the hold covers
            for name in SAMPLING_REFUSED.get(self.version, ()):
                body.pop(name, None)
            return body
        system, messages = to_anthropic_messages(req.messages)
        body: dict[str, Any] = {"model": upstream, "max_tokens": req.max_tokens, "messages": messages}
        if system:
            body["system"] = system
        if req.tools:
            body["tools"] = [self._tool(t) for t in req.tools]
            if req.tool_choice is not None:
                body["tool_choice"] = self._tool_choice(req)
        if req.stop:
            body["stop_sequences"] = req.stop
        if req.reasoning and req.reasoning.get("budget_tokens"):
            body["thinking"] = {"type": "enabled", "budget_tokens": int(req.reasoning["budget_tokens"])}
        if req.extra_format == self.wire_format:
            body.update(req.extra)
        body["temperature"], body["top_p"] = req.temperature, req.top_p
        for name in ("temperature", "top_p", "top_k"):
            if body.get(name) is None or name in SAMPLING_REFUSED.get(self.version, ()):
                body.pop(name, None)
        if req.stream:
            body["stream"] = True
        return body

    @staticmethod
    def _tool(t) -> dict[str, Any]:
        schema = t.parameters if t.kind == "function" else CUSTOM_SCHEMA
        schema = schema or {"type": "object", "properties": {}}
        if schema.get("type") != "object":
            schema = {**schema, "type": "object"}
        tool: dict[str, Any] = {"name": t.name, "input_schema": schema}
        if t.description:
            tool["description"] = t.description
        return tool

    @staticmethod
    def _tool_choice(req: ChatRequest) -> dict[str, Any]:
        tc = req.tool_choice
        choice: dict[str, Any] = {"auto": {"type": "auto"}, "none": {"type": "none"},
                                  "required": {"type": "any"}}.get(tc.mode) or {"type": "tool", "name": tc.name}
        if tc.parallel is False and choice["type"] != "none":
            choice["disable_parallel_tool_use"] = True
        return choice

    def parse_response(self, body: dict[str, Any], req: ChatRequest) -> ChatResponse:
        custom = {t.name for t in req.tools if t.kind == "custom"}
        content: list = []
        for block in body.get("content") or []:
            kind = block.get("type")
            if kind == "text":
                content.append(TextPart(block.get("text", "")))
            elif kind == "tool_use":
                args = block.get("input") or {}
                if block.get("name") in custom:
                    content.append(ToolCall(block["id"], block["name"], str(args.get("input", "")), "custom"))
                else:
                    content.append(ToolCall(block.get("id", ""), block.get("name", ""), orjson.dumps(args).decode()))
            elif kind == "thinking":
                content.append(ReasoningPart(text=block.get("thinking", ""), signature=block.get("signature")))
            elif kind == "redacted_thinking":
                content.append(ReasoningPart(redacted=block.get("data")))
        return ChatResponse(id=body.get("id", ""), model=body.get("model", ""), content=content,
                            stop_reason=STOP_FROM_ANTHROPIC.get(body.get("stop_reason") or "end_turn", END),
                            stop_sequence=body.get("stop_sequence"),
                            usage=usage_from_anthropic(body.get("usage") or {}),
                            raw=body, raw_format=self.wire_format)

    async def parse_stream(self, events, req: ChatRequest) -> AsyncIterator[StreamEvent]:
        custom = {t.name for t in req.tools if t.kind == "custom"}
        relay = self.same_format(req)          # also hand the client each frame verbatim
        tool_of_block: dict[int, int] = {}     # content block index -> tool-call ordinal
        wrapped: dict[int, list[str]] = {}     # custom-tool blocks: JSON buffered, unwrapped at stop
        raw_usage: dict[str, Any] = {}
        stop, stop_sequence = END, None
        async for name, data in events:
            ev = loads_event(self.name, data)
            kind = ev.get("type") or name
            if relay and kind not in ("error", "message_stop"):
                pending = RawFrame(b"event: " + (name or kind).encode() + b"\ndata: " + data + b"\n\n")
            else:
                pending = None
            if kind == "content_block_delta":
                delta = ev.get("delta") or {}
                dtype = delta.get("type")
                if dtype == "text_delta":
                    yield TextDelta(delta.get("text", ""))
                elif dtype == "input_json_delta":
                    index = ev.get("index", 0)
                    if index in wrapped:
                        wrapped[index].append(delta.get("partial_json", ""))
                    elif index in tool_of_block and delta.get("partial_json"):
                        yield ToolCallDelta(tool_of_block[index], delta["partial_json"])
                elif dtype == "thinking_delta":
                    yield ReasoningDelta(text=delta.get("thinking", ""))
                elif dtype == "signature_delta":
                    yield ReasoningDelta(signature=delta.get("signature"))
            elif kind == "content_block_start":
                block = ev.get("content_block") or {}
                if block.get("type") == "tool_use":
                    ordinal = tool_of_block[ev.get("index", 0)] = len(tool_of_block)
                    is_custom = block.get("name") in custom
                    if is_custom:
                        wrapped[ev.get("index", 0)] = []
                    yield ToolCallStart(ordinal, block.get("id", ""), block.get("name", ""),
                                        "custom" if is_custom else "function")
                elif block.get("type") == "text" and block.get("text"):
                    yield TextDelta(block["text"])
                elif block.get("type") == "redacted_thinking":
                    yield ReasoningDelta(redacted=block.get("data"))
            elif kind == "content_block_stop" and ev.get("index", 0) in wrapped:
                index = ev.get("index", 0)
                text = "".join(wrapped.pop(index)) or "{}"
                try:
                    value = str(orjson.loads(text).get("input", ""))
                except (orjson.JSONDecodeError, AttributeError):
                    value = text
                yield ToolCallDelta(tool_of_block[index], value)
            elif kind == "message_start":
                msg = ev.get("message") or {}
                raw_usage.update(msg.get("usage") or {})
                yield StreamStart(id=msg.get("id", ""), model=msg.get("model", ""),
                                  input_tokens=usage_from_anthropic(raw_usage).input_tokens)
            elif kind == "message_delta":
                delta = ev.get("delta") or {}
                stop = STOP_FROM_ANTHROPIC.get(delta.get("stop_reason") or "end_turn", END)
                stop_sequence = delta.get("stop_sequence")
                raw_usage.update({k: v for k, v in (ev.get("usage") or {}).items() if v is not None})
            elif kind == "message_stop":
                yield StreamEnd(stop_reason=stop, usage=usage_from_anthropic(raw_usage),
                                stop_sequence=stop_sequence)
                if relay:
                    yield RawFrame(b"event: message_stop\ndata: " + data + b"\n\n")
                return
            elif kind == "error":
                err = ev.get("error") or {}
                raise UpstreamError(502, f"{self.name} failed mid-stream: "
                                         f"{err.get('type', 'error')}: {err.get('message', '')}".rstrip(": "))
            # ping and unknown events carry nothing canonical (the API may add more)
            if pending is not None:
                yield pending
        raise UpstreamError(502, f"{self.name} ended the stream before message_stop")
