"""Format C: OpenAI responses, `POST /api/v1/responses` (`client.responses.create`).

Stateless: nothing is stored, so `previous_response_id` and `conversation` are refused
and each turn sends the whole conversation in `input`. Reasoning and hosted-tool input
items are skipped; hosted tools (web search, ...) are ignored; the function tools of a
`namespace` group reach upstreams as NAMESPACE__NAME and their calls come back with the
client's name and `namespace`. Streams are real: each
upstream delta becomes its event as it arrives, with `sequence_number` from 0.
"""
from __future__ import annotations

from typing import Any

import orjson

from plugins import hookimpl
from plugins.context import CallContext
from plugins.errors import GatewayError, bad_request
from providers.openai_responses import usage_body
from providers.types import (
    CONTENT_FILTER, MAX_TOKENS, ChatRequest, ChatResponse, Message, ReasoningDelta, ReasoningPart,
    StreamEnd, StreamStart, TextDelta, TextPart, TextRun, Tool, ToolCall, ToolCallDelta, ToolCallStart,
    ToolChoice, ToolResult,
)

from .base import ClientFormat, Fields, StreamWriter, client_image, named_tool, openai_error_body, parallel_flag
from .namespaces import flat_name, in_namespace

MAX_OUTPUT_CAP = 32768
KNOWN = {"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens",
         "temperature", "top_p", "stream", "store", "reasoning", "previous_response_id", "conversation"}
SKIPPED_ITEMS = {"reasoning", "web_search_call", "file_search_call", "computer_call", "computer_call_output",
                 "code_interpreter_call", "image_generation_call", "local_shell_call", "local_shell_call_output",
                 "mcp_call", "mcp_list_tools", "mcp_approval_request", "mcp_approval_response", "item_reference"}


def _content(raw: Any, path: str, role: str) -> list:
    if isinstance(raw, str):
        return [TextPart(raw)]
    if not isinstance(raw, list):
        raise bad_request(f"{path}: must be a string or an array of content parts", param=path)
    parts = []
    for j, part in enumerate(raw):
        p = Fields(part, f"{path}[{j}]")
        kind = p.string("type", required=True)
        if kind in ("input_text", "output_text"):
            parts.append(TextPart(p.string("text", default="")))
        elif kind == "refusal":
            parts.append(TextPart(p.string("refusal", default="")))
        elif kind == "input_image" and role != "assistant":
            parts.append(client_image(p.get("image_url"), p.path("image_url"), p.get("detail")))
        else:
            raise p.fail("type", f"content part {kind!r} is not supported here")
    return parts


def parse_input(f: Fields) -> list[Message]:
    out: list[Message] = []
    instructions = f.string("instructions")
    if instructions:
        out.append(Message("system", [TextPart(instructions)]))
    raw = f.get("input")
    if isinstance(raw, str):
        return out + [Message("user", [TextPart(raw)])]
    if not isinstance(raw, list) or not raw:
        raise f.fail("input", "is required: a string or a non-empty array of items")
    for i, item in enumerate(raw):
        it = Fields(item, f"input[{i}]")
        kind = item.get("type", "message")
        if kind == "message":
            role = it.string("role", required=True)
            if role not in ("user", "assistant", "system", "developer"):
                raise it.fail("role", f"must be user, assistant, system or developer, got {role!r}")
            role = "system" if role == "developer" else role
            _append(out, role, _content(item.get("content"), f"input[{i}].content", role))
        elif kind in ("function_call", "custom_tool_call"):
            custom = kind == "custom_tool_call"
            value = it.get("input" if custom else "arguments", "")
            if not isinstance(value, str):
                raise it.fail("input" if custom else "arguments", "must be a string")
            call = ToolCall(it.string("call_id", required=True),
                            flat_name(it.string("namespace"), it.string("name", required=True)), value,
                            "custom" if custom else "function")
            _append(out, "assistant", [call])
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output", "")
            if isinstance(output, list):
                output = _content(output, f"input[{i}].output", "user")
            elif not isinstance(output, str):
                raise it.fail("output", "must be a string or an array of content parts")
            _append(out, "tool", [ToolResult(it.string("call_id", required=True), output)])
        elif kind not in SKIPPED_ITEMS:
            raise it.fail("type", f"input item type {kind!r} is not supported")
    return out


def _append(out: list[Message], role: str, parts: list) -> None:
    """Consecutive items of one role form one turn (function calls join their message)."""
    if out and out[-1].role == role and role in ("assistant", "tool"):
        out[-1].parts.extend(parts)
    else:
        out.append(Message(role, parts))


def parse_tools(f: Fields, namespace: str | None = None) -> list[Tool]:
    tools = []
    for i, raw in enumerate(f.array("tools")):
        t = Fields(raw, f.path(f"tools[{i}]"))
        kind = raw.get("type") if isinstance(raw, dict) else None
        if kind == "namespace" and namespace is None:      # a group of functions (the Codex CLI's sub-agents)
            tools += parse_tools(t, t.string("name", required=True))
        elif kind == "function":
            params = raw.get("parameters")
            if params is not None and not isinstance(params, dict):
                raise t.fail("parameters", "must be a JSON schema object")
            strict = raw.get("strict")
            tools.append(Tool(flat_name(namespace, t.string("name", required=True)), t.string("description"), params,
                              strict=strict if isinstance(strict, bool) else None, namespace=namespace))
        elif kind == "custom":
            tools.append(Tool(t.string("name", required=True), t.string("description"), kind="custom",
                              format=raw.get("format")))
        # hosted tools (web_search, file_search, ...) are ignored: no upstream-neutral meaning
    return tools


def parse_tool_choice(f: Fields, tools: list[Tool]) -> ToolChoice | None:
    raw, parallel = f.get("tool_choice"), parallel_flag(f)
    if raw is None or (isinstance(raw, dict) and raw.get("type") == "allowed_tools"):
        return ToolChoice(parallel=parallel) if parallel is not None else None
    if raw in ("auto", "none", "required"):
        return ToolChoice(raw, parallel=parallel)
    if isinstance(raw, dict) and raw.get("type") in ("function", "custom"):
        return named_tool(f, "tool_choice", raw.get("name"), tools, parallel)
    raise f.fail("tool_choice", "must be auto, none, required or {type: function, name}")


class ResponsesFormat(ClientFormat):
    name = "responses"
    path = "/api/v1/responses"
    endpoint = "responses"
    key_required = True
    max_input_chars = 800_000

    def parse(self, body: Any) -> ChatRequest:
        f = Fields(body)
        for name in ("previous_response_id", "conversation"):
            if body.get(name) is not None:
                raise f.fail(name, "this gateway stores no responses or conversations; send the whole "
                                   "conversation in input on every turn")
        tools = parse_tools(f)
        effort = (body.get("reasoning") or {}).get("effort") if isinstance(body.get("reasoning"), dict) else None
        return ChatRequest(
            model=f.string("model", required=True), messages=parse_input(f),
            max_tokens=f.integer("max_output_tokens", default=MAX_OUTPUT_CAP, minimum=1, clamp=MAX_OUTPUT_CAP),
            stream=f.boolean("stream"), tools=tools, tool_choice=parse_tool_choice(f, tools),
            temperature=f.number("temperature"), top_p=f.number("top_p"),
            reasoning={"effort": effort} if effort else None,
            extra={k: v for k, v in body.items() if k not in KNOWN}, extra_format=self.name, raw=body)

    def render(self, resp: ChatResponse, ctx: CallContext) -> dict[str, Any]:
        if resp.raw_format == self.name and resp.raw:
            return upstream_response(resp.raw, ctx)
        output = [in_namespace(item, ctx) for _, item in output_items(resp.content, ctx.call_id)]
        return response_object(ctx, output, resp.stop_reason, usage_body(resp.usage))

    def stream_writer(self, ctx: CallContext) -> "ResponseEventWriter":
        return ResponseEventWriter(ctx)

    def error_body(self, err: GatewayError) -> dict[str, Any]:
        return openai_error_body(err)


def output_items(parts: list, call_id: str):
    """Canonical parts -> (kind, item) in order; consecutive text joins one message item."""
    items: list[tuple[str, dict[str, Any]]] = []
    for n, p in enumerate(parts):
        if isinstance(p, TextPart):
            if items and items[-1][0] == "message":
                items[-1][1]["content"][0]["text"] += p.text
            elif p.text:
                items.append(("message", message_item(f"msg_{call_id}_{n}", p.text, "completed")))
        elif isinstance(p, ToolCall):
            items.append(("tool", tool_item(f"fc_{call_id}_{n}", p.id, p.name, p.kind, p.arguments, "completed")))
        elif isinstance(p, ReasoningPart) and (p.text or p.signature):
            items.append(("reasoning", reasoning_item(f"rs_{call_id}_{n}", p.text, p.signature)))
    return items


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def tool_item(item_id: str, call_id: str, name: str, kind: str, args: str, status: str) -> dict[str, Any]:
    if kind == "custom":
        return {"id": item_id, "type": "custom_tool_call", "call_id": call_id, "name": name, "input": args,
                "status": status}
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name, "arguments": args,
            "status": status}


def reasoning_item(item_id: str, text: str, signature: str | None) -> dict[str, Any]:
    item: dict[str, Any] = {"id": item_id, "type": "reasoning",
                            "summary": [{"type": "summary_text", "text": text}] if text else []}
    if signature:
        item["encrypted_content"] = signature
    return item


def upstream_response(raw: dict[str, Any], ctx: CallContext) -> dict[str, Any]:
    """An OpenAI responses upstream's answer with our model id; a null `user` (the schema
    says string) is left out, and usage gets the cache counts the schema requires."""
    body = {k: v for k, v in raw.items() if not (k == "user" and v is None)}
    body["model"] = ctx.route.model.id
    if isinstance(body.get("usage"), dict):
        details = {"cached_tokens": 0, "cache_write_tokens": 0, **(body["usage"].get("input_tokens_details") or {})}
        body["usage"] = {**body["usage"], "input_tokens_details": details}
    return body


def echoed_settings(body: dict[str, Any]) -> dict[str, Any]:
    """The request's settings as OpenAI echoes them in the response object, defaults filled."""
    tools = [{"description": None, "parameters": None, "strict": True, **t} if t.get("type") == "function" else t
             for t in body.get("tools") or [] if isinstance(t, dict) and t.get("type") in ("function", "custom")]
    return {"instructions": body.get("instructions"), "tools": tools,
            "tool_choice": body.get("tool_choice") or "auto",
            "temperature": body.get("temperature", 1.0), "top_p": body.get("top_p", 1.0),
            "max_output_tokens": body.get("max_output_tokens"),
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "text": body.get("text") or {"format": {"type": "text"}},
            "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
            "metadata": body.get("metadata") or {}}


# ResponseErrorCode values a failure can map to; anything else is a server_error.
ERROR_CODES = {"server_error", "rate_limit_exceeded", "invalid_prompt"}


def failure(err: GatewayError) -> dict[str, str]:
    """The `error` of a failed response, with a code from the schema's enum."""
    code = err.code if err.code in ERROR_CODES else "rate_limit_exceeded" if err.status == 429 else "server_error"
    return {"code": code, "message": err.message}


def response_object(ctx: CallContext, output: list, stop: str | None, usage: dict | None,
                    error: dict | None = None) -> dict[str, Any]:
    """The response object. While in progress and when failed, usage is null: OpenAI sends
    it so, though the schema says object."""
    status, incomplete = "completed", None
    if error is not None:
        status = "failed"
    elif stop is None:
        status = "in_progress"
    elif stop in (MAX_TOKENS, CONTENT_FILTER):
        status = "incomplete"
        incomplete = {"reason": "max_output_tokens" if stop == MAX_TOKENS else "content_filter"}
    return {"id": f"resp_{ctx.call_id}", "object": "response", "created_at": ctx.created_at, "status": status,
            "error": error, "incomplete_details": incomplete, "model": ctx.route.model.id, "output": output,
            "previous_response_id": None, "store": False, **echoed_settings(ctx.chat.raw or {}), "usage": usage}


TEXT_DELTA = b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","sequence_number":'
TEXT_DELTA_END = b',"logprobs":[]}\n\n'
TEXT_DELTA_BETWEEN = TEXT_DELTA_END + TEXT_DELTA


class ResponseEventWriter(StreamWriter):
    """Canonical events -> responses events. Text and reasoning items close when another
    item starts; tool-call items stay open until the end (their deltas may interleave)."""

    def __init__(self, ctx: CallContext):
        self.ctx = ctx
        self.seq = 0
        self.items: list[dict[str, Any]] = []    # every output item, by output_index
        self.open_text: int | None = None
        self.text: list[str] = []                # the open text item's deltas, joined when it closes
        self.text_fields = b""                   # its delta events' fields between sequence number and delta
        self.open_reasoning: int | None = None
        self.tools: dict[int, int] = {}          # tool ordinal -> output_index

    def _ev(self, kind: str, **fields) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    def _add(self, item: dict[str, Any]) -> tuple[int, bytes]:
        self.items.append(item)
        index = len(self.items) - 1
        return index, self._ev("response.output_item.added", output_index=index, item=item)

    def event(self, ev) -> bytes:
        if isinstance(ev, TextDelta):
            out = b""
            if self.open_text is None:
                out = self._close_reasoning()
                item = message_item(f"msg_{self.ctx.call_id}_{len(self.items)}", "", "in_progress")
                part = item["content"].pop()         # the item is announced empty; its part follows
                self.open_text, added = self._add(item)
                item["content"].append(part)
                out += added + self._ev("response.content_part.added", item_id=item["id"],
                                        output_index=self.open_text, content_index=0, part=part)
                self.text_fields = b',"item_id":%b,"output_index":%d,"content_index":0,"delta":' % (
                    orjson.dumps(item["id"]), self.open_text)
            self.text.append(ev.text)
            self.seq += 1     # the event below, rendered from prebuilt parts: the bytes _ev would make
            return b"".join((out, TEXT_DELTA, b"%d" % (self.seq - 1), self.text_fields, orjson.dumps(ev.text),
                             TEXT_DELTA_END))
        if isinstance(ev, ToolCallDelta):
            index = self.tools[ev.index]
            item = self.items[index]
            custom = item["type"] == "custom_tool_call"
            item["input" if custom else "arguments"] += ev.arguments
            kind = "response.custom_tool_call_input.delta" if custom else "response.function_call_arguments.delta"
            return self._ev(kind, item_id=item["id"], output_index=index, delta=ev.arguments)
        if isinstance(ev, ToolCallStart):
            out = self._close_text() + self._close_reasoning()
            item = in_namespace(tool_item(f"fc_{self.ctx.call_id}_{len(self.items)}", ev.id, ev.name, ev.kind, "",
                                          "in_progress"), self.ctx)
            self.tools[ev.index], added = self._add(item)
            return out + added
        if isinstance(ev, ReasoningDelta):
            return self._reasoning(ev)
        if isinstance(ev, StreamStart):
            response = response_object(self.ctx, [], None, None)
            return (self._ev("response.created", response=response)
                    + self._ev("response.in_progress", response=response))
        if isinstance(ev, StreamEnd):
            out = self._close_text() + self._close_reasoning()
            for index in sorted(self.tools.values()):
                out += self._close_tool(index)
            response = response_object(self.ctx, self.items, ev.stop_reason, usage_body(ev.usage))
            kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
            return out + self._ev(kind, response=response)
        return b""

    def texts(self, run: TextRun) -> bytes:
        out = self.event(TextDelta(run.texts[0]))       # opens the text item if none is open
        rest = run.encoded[1:]
        if not rest:
            return out
        self.text += run.texts[1:]
        seq, self.seq = self.seq, self.seq + len(rest)
        fields = self.text_fields
        return out + TEXT_DELTA + TEXT_DELTA_BETWEEN.join(
            [b"%d%b%b" % (n, fields, text) for n, text in zip(range(seq, self.seq), rest)]) + TEXT_DELTA_END

    def _reasoning(self, ev: ReasoningDelta) -> bytes:
        out = b""
        if self.open_reasoning is None:
            out = self._close_text()
            self.open_reasoning, added = self._add(reasoning_item(f"rs_{self.ctx.call_id}_{len(self.items)}", "",
                                                                  None))
            self.items[self.open_reasoning]["summary"] = [{"type": "summary_text", "text": ""}]
            out += added + self._ev("response.reasoning_summary_part.added",
                                    item_id=self.items[self.open_reasoning]["id"], output_index=self.open_reasoning,
                                    summary_index=0, part={"type": "summary_text", "text": ""})
        item = self.items[self.open_reasoning]
        if ev.signature:
            item["encrypted_content"] = ev.signature
        if ev.text:
            item["summary"][0]["text"] += ev.text
            out += self._ev("response.reasoning_summary_text.delta", item_id=item["id"],
                            output_index=self.open_reasoning, summary_index=0, delta=ev.text)
        return out

    def _join_text(self) -> None:
        """The open text item gets the text of its deltas so far."""
        if self.open_text is not None:
            self.items[self.open_text]["content"][0]["text"] = "".join(self.text)

    def _close_text(self) -> bytes:
        self._join_text()
        index, self.open_text = self.open_text, None
        if index is None:
            return b""
        self.text = []
        item = self.items[index]
        item["status"] = "completed"
        part = item["content"][0]
        return (self._ev("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                         text=part["text"], logprobs=[])
                + self._ev("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                           part=part)
                + self._ev("response.output_item.done", output_index=index, item=item))

    def _close_reasoning(self) -> bytes:
        index, self.open_reasoning = self.open_reasoning, None
        if index is None:
            return b""
        item = self.items[index]
        part = item["summary"][0]
        return (self._ev("response.reasoning_summary_text.done", item_id=item["id"], output_index=index,
                         summary_index=0, text=part["text"])
                + self._ev("response.reasoning_summary_part.done", item_id=item["id"], output_index=index,
                           summary_index=0, part=part)
                + self._ev("response.output_item.done", output_index=index, item=item))

    def _close_tool(self, index: int) -> bytes:
        item = self.items[index]
        item["status"] = "completed"
        if item["type"] == "custom_tool_call":
            done = self._ev("response.custom_tool_call_input.done", item_id=item["id"], output_index=index,
                            input=item["input"])
        else:
            done = self._ev("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                            name=item["name"], arguments=item["arguments"])
        return done + self._ev("response.output_item.done", output_index=index, item=item)

    def error(self, err: GatewayError) -> bytes:
        self._join_text()
        error = failure(err)
        return (self._ev("error", code=error["code"], message=err.message, param=None)
                + self._ev("response.failed", response=response_object(self.ctx, self.items, None, None, error)))


FORMAT = ResponsesFormat()


@hookimpl
def gateway_register_formats(register):
    register(FORMAT)
