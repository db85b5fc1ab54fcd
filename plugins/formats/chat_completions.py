"""Format A: OpenAI chat completions, `POST /api/v1/chat/completions` (SPEC section 4).

Parses the wire body into a canonical ChatRequest, and renders canonical responses and
stream events back: `chat.completion` JSON with a `billing` block, or `data:` chunks
with tool-call deltas indexed per call, a final usage chunk (always, whether or not the
client asked for `stream_options`; every chunk before it says `"usage": null`, as OpenAI's
do with `include_usage`), then `data: [DONE]`. A failure after the stream
started is sent as `data: {"error": ...}` with no [DONE], which the SDK raises.
"""
from __future__ import annotations

import time
from typing import Any

import orjson

from plugins import hookimpl
from plugins.context import CallContext
from plugins.errors import GatewayError
from providers.types import (
    CONTENT_FILTER, END, MAX_TOKENS, STOP_SEQUENCE, TOOL_USE, ChatRequest, ChatResponse,
    Message, ReasoningDelta, ReasoningPart, StreamEnd, StreamStart, TextDelta, TextPart, TextRun, Tool,
    ToolCall, ToolCallDelta, ToolCallStart, ToolChoice, ToolResult, Usage,
)

from .base import ClientFormat, Fields, StreamWriter, client_image, named_tool, openai_error_body, parallel_flag

DEFAULT_MAX_TOKENS = 1024
MAX_TOKENS_CAP = 8192
FINISH = {END: "stop", MAX_TOKENS: "length", TOOL_USE: "tool_calls", STOP_SEQUENCE: "stop",
          CONTENT_FILTER: "content_filter"}
# Fields with a canonical home; everything else passes through to OpenAI-format upstreams.
KNOWN = {"model", "messages", "max_tokens", "max_completion_tokens", "stream", "stream_options", "tools",
         "tool_choice", "parallel_tool_calls", "n", "stop", "temperature", "top_p", "reasoning_effort",
         "functions", "function_call"}


def parse_message(raw: Any, i: int) -> Message:
    f = Fields(raw, f"messages[{i}]")
    role = f.string("role", required=True)
    if role == "developer":
        role = "system"
    if role not in ("system", "user", "assistant", "tool"):
        raise f.fail("role", f"must be system, developer, user, assistant or tool, got {role!r}")
    content = raw.get("content")
    parts: list = []
    if role == "tool":
        call_id = f.string("tool_call_id", required=True)
        return Message("tool", [ToolResult(call_id, _text_of(content, f))])
    if isinstance(content, str):
        parts.append(TextPart(content))
    elif isinstance(content, list):
        parts.extend(_content_part(p, f"messages[{i}].content[{j}]", role) for j, p in enumerate(content))
    elif content is not None:
        raise f.fail("content", "must be a string, an array of content parts, or null")
    if role == "assistant":
        if raw.get("reasoning_content"):
            parts.insert(0, ReasoningPart(text=str(raw["reasoning_content"])))
        for j, call in enumerate(f.array("tool_calls")):
            parts.append(_tool_call(call, f"messages[{i}].tool_calls[{j}]"))
        if content is None and not any(isinstance(p, ToolCall) for p in parts):
            raise f.fail("content", "is required unless the message has tool_calls")
    elif content is None:
        raise f.fail("content", "is required")
    return Message(role, parts)


def _text_of(content: Any, f: Fields) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, p in enumerate(content):
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise f.fail(f"content[{j}]", "tool message parts must be {type: text, text}")
            texts.append(p["text"])
        return "".join(texts)
    raise f.fail("content", "must be a string or an array of text parts")


def _content_part(raw: Any, path: str, role: str):
    f = Fields(raw, path)
    kind = f.string("type", required=True)
    if kind == "text":
        text = raw.get("text")
        if not isinstance(text, str):
            raise f.fail("text", "must be a string")
        return TextPart(text)
    if kind == "refusal" and role == "assistant":
        return TextPart(str(raw.get("refusal") or ""))
    if kind == "image_url" and role == "user":
        image = raw.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        field = f.path("image_url.url" if isinstance(image, dict) else "image_url")
        return client_image(url, field, image.get("detail") if isinstance(image, dict) else None)
    raise f.fail("type", f"content part type {kind!r} is not supported here "
                         f"(supported: text{', image_url' if role == 'user' else ''})")


def _tool_call(raw: Any, path: str) -> ToolCall:
    f = Fields(raw, path)
    call_id = f.string("id", required=True)
    if raw.get("type") == "custom":
        c = Fields(raw.get("custom"), f"{path}.custom")
        return ToolCall(call_id, c.string("name", required=True), str(c.get("input") or ""), "custom")
    fn = Fields(raw.get("function"), f"{path}.function")
    args = fn.get("arguments", "{}")
    if not isinstance(args, str):
        raise fn.fail("arguments", "must be a JSON string")
    return ToolCall(call_id, fn.string("name", required=True), args)


def parse_tools(f: Fields) -> list[Tool]:
    tools = []
    for i, raw in enumerate(f.array("tools")):
        t = Fields(raw, f"tools[{i}]")
        kind = t.string("type", default="function")
        if kind == "custom":
            c = Fields(raw.get("custom"), f"tools[{i}].custom")
            tools.append(Tool(c.string("name", required=True), c.string("description"), kind="custom",
                              format=c.get("format")))
        elif kind == "function":
            fn = Fields(raw.get("function"), f"tools[{i}].function")
            params = fn.get("parameters")
            if params is not None and not isinstance(params, dict):
                raise fn.fail("parameters", "must be a JSON schema object")
            strict = fn.get("strict")
            tools.append(Tool(fn.string("name", required=True), fn.string("description"), params,
                              strict=strict if isinstance(strict, bool) else None))
        else:
            raise t.fail("type", f"must be function or custom, got {kind!r}")
    return tools


def parse_tool_choice(f: Fields, tools: list[Tool]) -> ToolChoice | None:
    raw, parallel = f.get("tool_choice"), parallel_flag(f)
    if raw is None:
        return ToolChoice(parallel=parallel) if parallel is not None else None
    if raw in ("auto", "none", "required"):
        return ToolChoice(raw, parallel=parallel)
    if isinstance(raw, dict) and raw.get("type") in ("function", "custom"):
        return named_tool(f, "tool_choice", (raw.get(raw["type"]) or {}).get("name"), tools, parallel)
    raise f.fail("tool_choice", "must be auto, none, required, or {type: function, function: {name}}")


class ChatCompletionsFormat(ClientFormat):
    name = "chat_completions"
    path = "/api/v1/chat/completions"
    endpoint = "chat.completions"
    key_required = False
    max_input_chars = 200_000
    accepts_x402 = True

    def parse(self, body: Any) -> ChatRequest:
        f = Fields(body)
        model = f.string("model", required=True)
        messages = [parse_message(m, i) for i, m in enumerate(f.array("messages", required=True, nonempty=True))]
        n = f.integer("n")
        if n is not None and n != 1:
            raise f.fail("n", f"must be 1 (one choice per call), got {n}")
        if "functions" in body or "function_call" in body:
            raise f.fail("functions", "the deprecated functions API is not supported; use tools")
        max_tokens = f.integer("max_completion_tokens", minimum=1, clamp=MAX_TOKENS_CAP)
        if max_tokens is None:
            max_tokens = f.integer("max_tokens", default=DEFAULT_MAX_TOKENS, minimum=1, clamp=MAX_TOKENS_CAP)
        tools = parse_tools(f)
        effort = f.string("reasoning_effort")
        # Positional, in ChatRequest's field order (model, messages, max_tokens, stream, tools, tool_choice,
        # stop, temperature, top_p, extra, extra_format, reasoning): keywords would build a dict per call.
        return ChatRequest(
            model, messages, max_tokens, f.boolean("stream"), tools, parse_tool_choice(f, tools), f.stop_list("stop"),
            f.number("temperature"), f.number("top_p"), {k: v for k, v in body.items() if k not in KNOWN}, self.name,
            {"effort": effort} if effort else None)

    def render(self, resp: ChatResponse, ctx: CallContext) -> dict[str, Any]:
        if resp.raw_format == self.name and resp.raw:
            body = dict(resp.raw)       # same wire format: keep every upstream field
        else:
            body = {"id": resp.id or f"chatcmpl-{ctx.call_id}", "object": "chat.completion",
                    "created": int(time.time()),
                    "choices": [{"index": 0, "message": _message(resp), "logprobs": None,
                                 "finish_reason": FINISH.get(resp.stop_reason, "stop")}],
                    "usage": usage_body(resp.usage)}
        body["model"] = ctx.route.model.id
        body["billing"] = ctx.billing
        return body

    def stream_writer(self, ctx: CallContext) -> "ChunkWriter":
        return ChunkWriter(ctx)

    def error_body(self, err: GatewayError) -> dict[str, Any]:
        return openai_error_body(err)


def _message(resp: ChatResponse) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": resp.text() or None, "refusal": None}
    calls = resp.tool_calls()
    if calls:
        msg["tool_calls"] = [_call_body(c) for c in calls]
    reasoning = "".join(p.text for p in resp.content if isinstance(p, ReasoningPart))
    if reasoning:
        msg["reasoning_content"] = reasoning
    return msg


def _call_body(c: ToolCall) -> dict[str, Any]:
    if c.kind == "custom":
        return {"id": c.id, "type": "custom", "custom": {"name": c.name, "input": c.arguments}}
    return {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}


def usage_body(u: Usage | None) -> dict[str, Any]:
    u = u or Usage()
    return {"prompt_tokens": u.input_tokens, "completion_tokens": u.output_tokens,
            "total_tokens": u.total_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cache_read_tokens},
            "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens}}


DELTA_END = b'},"logprobs":null,"finish_reason":null}],"usage":null}\n\n'    # a text chunk after its text


class ChunkWriter(StreamWriter):
    """Every chunk shares its head (id, created, model) and the tail after its delta: both
    are rendered once, so a chunk costs one dumps of its delta."""

    def __init__(self, ctx: CallContext):
        self.ctx = ctx
        self.head = {"id": f"chatcmpl-{ctx.call_id}", "object": "chat.completion.chunk",
                     "created": int(time.time()), "model": ctx.route.model.id}
        self.prefix = b"data: " + orjson.dumps(self.head)[:-1] + b',"choices":[{"index":0,"delta":'
        self.text_between = DELTA_END + self.prefix + b'{"content":'     # from one text to the next

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        return b"".join((self.prefix, orjson.dumps(delta), b',"logprobs":null,"finish_reason":',
                         orjson.dumps(finish), b'}],"usage":null}\n\n'))

    def texts(self, run: TextRun) -> bytes:
        return b"".join((self.prefix, b'{"content":', self.text_between.join(run.encoded), DELTA_END))

    def event(self, ev) -> bytes:
        if isinstance(ev, TextDelta):
            return b"".join((self.prefix, b'{"content":', orjson.dumps(ev.text), DELTA_END))
        if isinstance(ev, ToolCallDelta):
            return self._chunk({"tool_calls": [{"index": ev.index, "function": {"arguments": ev.arguments}}]})
        if isinstance(ev, ToolCallStart):
            return self._chunk({"tool_calls": [{"index": ev.index, "id": ev.id, "type": "function",
                                                "function": {"name": ev.name, "arguments": ""}}]})
        if isinstance(ev, ReasoningDelta):
            return self._chunk({"reasoning_content": ev.text}) if ev.text else b""
        if isinstance(ev, StreamStart):
            return self._chunk({"role": "assistant", "content": ""})
        if isinstance(ev, StreamEnd):
            last = {**self.head, "choices": [], "usage": usage_body(ev.usage), "billing": self.ctx.billing}
            return (self._chunk({}, FINISH.get(ev.stop_reason, "stop"))
                    + b"data: " + orjson.dumps(last) + b"\n\ndata: [DONE]\n\n")
        return b""

    def error(self, err: GatewayError) -> bytes:
        return b"data: " + orjson.dumps(openai_error_body(err)) + b"\n\n"


FORMAT = ChatCompletionsFormat()


@hookimpl
def gateway_register_formats(register):
    register(FORMAT)
