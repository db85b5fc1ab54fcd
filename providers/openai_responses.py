"""OpenAI Responses API (`POST /v1/responses`), for models an upstream serves only there.

Nothing is stored upstream (`store: false`): the whole conversation goes in `input` each
turn, as the gateway's own responses endpoint requires of its clients. The item
converters here serve both directions: this provider (canonical -> items -> canonical)
and the responses client format (items -> canonical -> response object).
"""
from __future__ import annotations

from typing import Any, AsyncIterator

from .base import HTTPProvider, UpstreamError, loads_event
from .types import (
    CONTENT_FILTER, END, MAX_TOKENS, TOOL_USE, ChatRequest, ChatResponse, ImagePart, Message, ReasoningDelta,
    ReasoningPart, StreamEnd, StreamEvent, StreamStart, TextDelta, TextPart, ToolCall, ToolCallDelta,
    ToolCallStart, ToolResult, Usage,
)

MIN_OUTPUT_TOKENS = 16      # the API refuses smaller max_output_tokens


# ---- canonical -> items ----------------------------------------------------------

def to_items(messages: list[Message]) -> list[dict[str, Any]]:
    custom_calls = {p.id for m in messages for p in m.parts if isinstance(p, ToolCall) and p.kind == "custom"}
    items: list[dict[str, Any]] = []
    for m in messages:
        for r in (p for p in m.parts if isinstance(p, ToolResult)):
            kind = "custom_tool_call_output" if r.call_id in custom_calls else "function_call_output"
            items.append({"type": kind, "call_id": r.call_id, "output": r.text()})
        if m.role == "assistant":
            items.extend(_assistant_items(m))
            continue
        parts = [{"type": "input_text", "text": p.text} if isinstance(p, TextPart)
                 else {"type": "input_image", "image_url": p.url, "detail": p.detail or "auto"}
                 for p in m.parts if isinstance(p, (TextPart, ImagePart))]
        if parts:
            items.append({"type": "message", "role": "system" if m.role == "system" else "user", "content": parts})
    return items


def _assistant_items(m: Message) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for p in m.parts:
        if isinstance(p, TextPart) and p.text:
            items.append({"type": "message", "role": "assistant",
                          "content": [{"type": "output_text", "text": p.text}]})
        elif isinstance(p, ToolCall) and p.kind == "custom":
            items.append({"type": "custom_tool_call", "call_id": p.id, "name": p.name, "input": p.arguments})
        elif isinstance(p, ToolCall):
            items.append({"type": "function_call", "call_id": p.id, "name": p.name, "arguments": p.arguments})
    return items


def to_tools(req: ChatRequest) -> dict[str, Any]:
    if not req.tools:
        return {}
    tools = []
    for t in req.tools:
        tool: dict[str, Any] = {"type": t.kind, "name": t.name}
        if t.description:
            tool["description"] = t.description
        if t.kind == "function":
            tool["parameters"] = t.parameters or {"type": "object", "properties": {}}
            tool["strict"] = bool(t.strict)
        elif t.format:
            tool["format"] = t.format
        tools.append(tool)
    out: dict[str, Any] = {"tools": tools}
    tc = req.tool_choice
    if tc is not None:
        if tc.mode == "tool":
            kind = next((t.kind for t in req.tools if t.name == tc.name), "function")
            out["tool_choice"] = {"type": kind, "name": tc.name}
        else:
            out["tool_choice"] = tc.mode
        if tc.parallel is not None:
            out["parallel_tool_calls"] = tc.parallel
    return out


# ---- items -> canonical ----------------------------------------------------------

def parts_from_output(output: list[dict[str, Any]]) -> list:
    parts: list = []
    for item in output:
        kind = item.get("type")
        if kind == "message":
            for c in item.get("content") or []:
                if c.get("type") in ("output_text", "refusal"):
                    parts.append(TextPart(c.get("text") or c.get("refusal") or ""))
        elif kind == "function_call":
            parts.append(ToolCall(item.get("call_id", ""), item.get("name", ""), item.get("arguments") or "{}"))
        elif kind == "custom_tool_call":
            parts.append(ToolCall(item.get("call_id", ""), item.get("name", ""), item.get("input") or "", "custom"))
        elif kind == "reasoning":
            text = "".join(s.get("text", "") for s in item.get("summary") or [])
            parts.append(ReasoningPart(text=text, signature=item.get("encrypted_content")))
    return parts


def stop_of(response: dict[str, Any], parts: list) -> str:
    if response.get("status") == "incomplete":
        reason = (response.get("incomplete_details") or {}).get("reason")
        return CONTENT_FILTER if reason == "content_filter" else MAX_TOKENS
    return TOOL_USE if any(isinstance(p, ToolCall) for p in parts) else END


def usage_from_responses(u: dict[str, Any] | None) -> Usage | None:
    if not u:
        return None
    return Usage(input_tokens=int(u.get("input_tokens") or 0), output_tokens=int(u.get("output_tokens") or 0),
                 cache_read_tokens=int((u.get("input_tokens_details") or {}).get("cached_tokens") or 0),
                 reasoning_tokens=int((u.get("output_tokens_details") or {}).get("reasoning_tokens") or 0))


def usage_body(u: Usage | None) -> dict[str, Any]:
    u = u or Usage()
    return {"input_tokens": u.input_tokens,
            "input_tokens_details": {"cached_tokens": u.cache_read_tokens, "cache_write_tokens": u.cache_write_tokens},
            "output_tokens": u.output_tokens, "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
            "total_tokens": u.total_tokens}


class OpenAIResponsesProvider(HTTPProvider):
    type_name = "openai_responses"
    wire_format = "responses"
    default_base_url = "https://api.openai.com/v1"
    path = "/responses"

    def build_request(self, req: ChatRequest, upstream: str) -> dict[str, Any]:
        cap = max(MIN_OUTPUT_TOKENS, req.max_tokens)
        if self.same_format(req):
            return {**req.raw, "model": upstream, "max_output_tokens": cap, "store": False}
        body: dict[str, Any] = {"model": upstream, "input": to_items(req.messages), "max_output_tokens": cap,
                                "store": False}
        body.update(to_tools(req))
        if req.temperature is not None:
            body["temperature"] = req.temperature
        if req.top_p is not None:
            body["top_p"] = req.top_p
        if req.reasoning and req.reasoning.get("effort"):
            body["reasoning"] = {"effort": req.reasoning["effort"]}
        if req.stream:
            body["stream"] = True
        return body

    def parse_response(self, body: dict[str, Any], req: ChatRequest) -> ChatResponse:
        if body.get("status") == "failed":
            raise UpstreamError(502, f"{self.name} failed: {(body.get('error') or {}).get('message', 'no detail')}")
        parts = parts_from_output(body.get("output") or [])
        return ChatResponse(id=body.get("id", ""), model=body.get("model", ""), content=parts,
                            stop_reason=stop_of(body, parts), usage=usage_from_responses(body.get("usage")),
                            raw=body, raw_format=self.wire_format)

    async def parse_stream(self, events, req: ChatRequest) -> AsyncIterator[StreamEvent]:
        tools: dict[str, int] = {}          # item id -> tool ordinal
        saw_tool = False
        async for name, data in events:
            ev = loads_event(self.name, data)
            kind = ev.get("type") or name
            if kind == "response.output_text.delta":
                yield TextDelta(ev.get("delta", ""))
            elif kind in ("response.function_call_arguments.delta", "response.custom_tool_call_input.delta"):
                if ev.get("item_id") in tools and ev.get("delta"):
                    yield ToolCallDelta(tools[ev["item_id"]], ev["delta"])
            elif kind == "response.reasoning_summary_text.delta":
                yield ReasoningDelta(text=ev.get("delta", ""))
            elif kind == "response.output_item.added":
                item = ev.get("item") or {}
                if item.get("type") in ("function_call", "custom_tool_call"):
                    tools[item.get("id", "")] = len(tools)
                    saw_tool = True
                    yield ToolCallStart(tools[item.get("id", "")], item.get("call_id", ""), item.get("name", ""),
                                        "custom" if item["type"] == "custom_tool_call" else "function")
            elif kind == "response.output_item.done":
                item = ev.get("item") or {}
                if item.get("type") == "reasoning" and item.get("encrypted_content"):
                    yield ReasoningDelta(signature=item["encrypted_content"])
            elif kind == "response.created":
                response = ev.get("response") or {}
                yield StreamStart(id=response.get("id", ""), model=response.get("model", ""))
            elif kind in ("response.completed", "response.incomplete"):
                response = ev.get("response") or {}
                stop = stop_of(response, [ToolCall("", "", "")] if saw_tool else [])
                yield StreamEnd(stop_reason=stop, usage=usage_from_responses(response.get("usage")))
                return
            elif kind in ("error", "response.failed"):
                err = ev.get("error") or (ev.get("response") or {}).get("error") or ev
                raise UpstreamError(502, f"{self.name} failed mid-stream: {err.get('message', 'no detail')}")
        raise UpstreamError(502, f"{self.name} ended the stream before response.completed")
