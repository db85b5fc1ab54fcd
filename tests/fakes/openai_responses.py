"""Strict fake of the OpenAI Responses API (`POST /v1/responses`).

It answers in the real wire format (named, numbered stream events included)
and refuses what the real API refuses, with OpenAI's error shape. It keeps
the little state the real API keeps, so that replayed reasoning items,
encrypted reasoning and `previous_response_id` are checked like upstream.

What it renders follows the request, as upstream does: a reasoning summary
only when `reasoning.summary` is set, `encrypted_content` only when
`include` asks for "reasoning.encrypted_content".
"""

from __future__ import annotations

import base64
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from .openai_chat import (
    PARSE_ERROR,
    bad_value,
    check_auth,
    check_integer,
    check_number,
    empty_array,
    error_response,
    missing,
    request_id_header,
    scripted_error,
    wrong_type,
)
from .script import (
    RESPONSES_INCOMPLETE,
    FakeUpstream,
    Frame,
    Invalid,
    RecordedRequest,
    Reply,
    arguments_of,
    canonical_stop,
    failure_point,
    json_response,
    new_id,
    split_arguments,
    split_text,
    sse,
    tool_ids,
)

ALLOWED_PARAMS = frozenset(
    """model input instructions tools tool_choice parallel_tool_calls max_output_tokens temperature
    top_p stream stream_options store reasoning text include metadata user truncation service_tier
    previous_response_id prompt_cache_key prompt_cache_retention safety_identifier background
    max_tool_calls top_logprobs""".split()
)
# Chat Completions parameters the real API answers with a pointer to their new home.
MOVED_PARAMS = {"messages": "input", "response_format": "text.format"}
BOOLEAN_PARAMS = ("stream", "store", "parallel_tool_calls", "background")
NUMBER_RANGES = {"temperature": (0, 2), "top_p": (0, 1)}
INTEGER_MINIMUMS = {"max_output_tokens": 16, "max_tool_calls": 1, "top_logprobs": 0}
STRING_PARAMS = ("instructions", "user", "prompt_cache_key", "safety_identifier", "previous_response_id")
ENUM_PARAMS = {
    "truncation": ("auto", "disabled"),
    "service_tier": ("auto", "default", "flex", "scale", "priority"),
    "prompt_cache_retention": ("in_memory", "24h"),
}
INCLUDABLE = (
    "code_interpreter_call.outputs", "computer_call_output.output.image_url", "file_search_call.results",
    "message.input_image.image_url", "message.output_text.logprobs", "reasoning.encrypted_content",
    "web_search_call.action.sources", "web_search_call.results",
)  # fmt: skip
ROLES = ("user", "assistant", "system", "developer")
INPUT_PARTS = ("input_text", "input_image", "input_file")
OUTPUT_PARTS = ("output_text", "refusal")
PART_KEYS = {
    "input_text": {"type", "text"},
    "input_image": {"type", "image_url", "file_id", "detail"},
    "input_file": {"type", "file_id", "file_data", "file_url", "filename"},
    "output_text": {"type", "text", "annotations", "logprobs"},
    "refusal": {"type", "refusal"},
}
ITEM_KEYS = {
    "message": {"type", "role", "content", "id", "status", "phase"},
    "function_call": {"type", "id", "call_id", "name", "arguments", "status", "namespace"},
    "function_call_output": {"type", "id", "call_id", "output", "status"},
    "custom_tool_call": {"type", "id", "call_id", "name", "input", "namespace"},
    "custom_tool_call_output": {"type", "id", "call_id", "output"},
    "reasoning": {"type", "id", "summary", "encrypted_content", "content", "status"},
}
# Items a reasoning item may precede: the real API refuses reasoning left dangling.
AFTER_REASONING = ("message", "function_call", "custom_tool_call")
IMAGE_DETAILS = ("auto", "low", "high", "original")
HOSTED_TOOLS = (
    "web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11",
    "file_search", "code_interpreter", "image_generation", "mcp", "computer_use_preview", "local_shell",
    "shell", "apply_patch", "tool_search",
)  # fmt: skip
TOOL_KEYS = {
    "function": {"type", "name", "description", "parameters", "strict", "defer_loading"},
    "custom": {"type", "name", "description", "format", "defer_loading"},
}
TOOL_CHOICES = ("none", "auto", "required")
FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
DATA_IMAGE = re.compile(r"^data:image/[\w.+-]+;base64,[A-Za-z0-9+/=]+$")
REASONING_KEYS = {"effort": ("none", "minimal", "low", "medium", "high", "xhigh"),
                  "summary": ("auto", "concise", "detailed"),
                  "generate_summary": ("auto", "concise", "detailed")}  # fmt: skip
TEXT_FORMATS = ("text", "json_schema", "json_object")
VERBOSITY = ("low", "medium", "high")
NOT_PERSISTED = (
    "Item with id '{id}' not found. Items are not persisted when `store` is set to false. "
    "Try again with `store` set to true, or remove this item from your input."
)


@dataclass
class Stored:
    """What a created response leaves behind for later requests to refer to."""

    stored: bool  # `store` was not false
    open_calls: list[str] = field(default_factory=list)  # call_ids the response asked the client to run


class FakeOpenAIResponses(FakeUpstream):
    """Serves POST /v1/responses; any other path gets OpenAI's 404 body."""

    def __init__(self, api_key: str = "sk-test-upstream") -> None:
        super().__init__(api_key)
        self.responses: dict[str, Stored] = {}  # every response id created, stored or not
        self.reasoning_items: dict[str, bool] = {}  # reasoning item id -> persisted
        self.encrypted: dict[str, str] = {}  # encrypted_content -> reasoning item id it belongs to
        self.app.router.add_post("/v1/responses", self._create)
        self.app.router.add_route("*", "/{tail:.*}", self._unknown_route)

    async def _create(self, request: web.Request) -> web.StreamResponse:
        recorded = await self.record(request)
        try:
            check_auth(recorded.headers, self.api_key)
            body = checked_body(recorded, self)
        except Invalid as exc:
            recorded.rejected = exc.message
            return error_response(exc)
        reply = self.next_reply()
        if reply.error_status is not None:
            return scripted_error(reply)
        render = Rendering(body, reply)
        self.remember(render)
        if body.get("stream") is True:
            frames = stream_frames(render)
            error = b""
            if reply.fail_after_events is not None:
                error = failure_frames(render, failure_point(frames, reply.fail_after_events))
            return await self.write_stream(request, recorded, frames, reply, error, request_id_header())
        return json_response(render.response(render.status, render.items), headers=request_id_header())

    async def _unknown_route(self, request: web.Request) -> web.Response:
        recorded = await self.record(request)
        exc = Invalid(f"Invalid URL ({request.method} {request.path})", status=404)
        recorded.rejected = exc.message
        return error_response(exc)

    def remember(self, render: Rendering) -> None:
        """Record the new response, its open calls and its reasoning for later requests."""
        stored = render.body.get("store", True) is not False
        calls = [item["call_id"] for item in render.items if item["type"] == "function_call"]
        self.responses[render.id] = Stored(stored, calls)
        for item in render.items:
            if item["type"] == "reasoning":
                self.reasoning_items[item["id"]] = stored
                if item["encrypted_content"]:
                    self.encrypted[item["encrypted_content"]] = item["id"]


# ---------------------------------------------------------------- rendering


class Rendering:
    """One scripted reply as Responses output items, with ids fixed once so the streamed
    and final forms of every item agree."""

    def __init__(self, body: dict, reply: Reply) -> None:
        self.body = body
        self.reply = reply
        self.id = new_id("resp_", 48)
        self.created_at = int(time.time())
        stop = canonical_stop(reply)
        self.incomplete = RESPONSES_INCOMPLETE.get(stop)
        self.status = "incomplete" if self.incomplete else "completed"
        self.plan = planned_items(body, reply, self.status)
        self.items = [item for item, _, _ in self.plan]

    def usage(self) -> dict:
        """input_tokens INCLUDES cached tokens, as in Chat Completions."""
        reply = self.reply
        prompt = reply.input_tokens + reply.cache_read_tokens
        return {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": reply.cache_read_tokens, "cache_write_tokens": 0},
            "output_tokens": reply.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + reply.output_tokens,
        }

    def response(self, status: str, output: list[dict], error: dict | None = None) -> dict:
        """The full `response` object; in-progress snapshots carry no usage yet."""
        body = self.body
        finished = status not in ("in_progress", "queued")
        reasoning = body.get("reasoning") or {}
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": body.get("background", False),
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": error,
            "incomplete_details": {"reason": self.incomplete} if status == "incomplete" else None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "max_tool_calls": body.get("max_tool_calls"),
            "model": body["model"],
            "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": body.get("previous_response_id"),
            "prompt_cache_key": body.get("prompt_cache_key"),
            "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
            "safety_identifier": body.get("safety_identifier"),
            "service_tier": "default",
            "store": body.get("store", True),
            "temperature": body.get("temperature", 1.0),
            "text": body.get("text") or {"format": {"type": "text"}, "verbosity": "medium"},
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools", []),
            "top_logprobs": body.get("top_logprobs", 0),
            "top_p": body.get("top_p", 1.0),
            "truncation": body.get("truncation", "disabled"),
            "usage": self.usage() if finished else None,
            "user": body.get("user"),
            "metadata": body.get("metadata") or {},
        }


Event = tuple[str, str, dict]  # (frame kind, event type, payload without type/sequence_number)


def planned_items(body: dict, reply: Reply, status: str) -> list[tuple[dict, dict, list[Event]]]:
    """Each output item as (final item, item as first announced, events in between)."""
    plan = []
    if reply.reasoning:
        plan.append(reasoning_item(body, reply))
    if reply.text:
        plan.append(message_item(reply, "incomplete" if status == "incomplete" else "completed"))
    for call, call_id in zip(reply.tool_calls, tool_ids(reply, "call_")):
        plan.append(function_call_item(call_id, call.name, arguments_of(call), reply.text_chunks))
    return plan


def reasoning_item(body: dict, reply: Reply) -> tuple[dict, dict, list[Event]]:
    """Summary text only if the request asked for a summary; the encrypted blob only if
    it was included, as the real API does."""
    item_id = new_id("rs_", 48)
    wants_summary = bool((body.get("reasoning") or {}).get("summary"))
    wants_blob = "reasoning.encrypted_content" in (body.get("include") or [])
    summary = [{"type": "summary_text", "text": reply.reasoning}] if wants_summary else []
    blob = "gAAAAA" + base64.urlsafe_b64encode(secrets.token_bytes(96)).decode() if wants_blob else None
    item = {"id": item_id, "type": "reasoning", "summary": summary, "encrypted_content": blob, "status": "completed"}
    events: list[Event] = []
    if wants_summary:
        where = {"item_id": item_id, "summary_index": 0}
        part = {"type": "summary_text", "text": reply.reasoning}
        events.append(("body", "response.reasoning_summary_part.added", {**where, "part": {**part, "text": ""}}))
        for piece in split_text(reply.reasoning, reply.text_chunks):
            events.append(("delta", "response.reasoning_summary_text.delta", {**where, "delta": piece}))
        events.append(("body", "response.reasoning_summary_text.done", {**where, "text": reply.reasoning}))
        events.append(("body", "response.reasoning_summary_part.done", {**where, "part": part}))
    return item, {"id": item_id, "type": "reasoning", "summary": []}, events


def message_item(reply: Reply, status: str) -> tuple[dict, dict, list[Event]]:
    item_id = new_id("msg_", 48)
    part = {"type": "output_text", "annotations": [], "logprobs": [], "text": reply.text}
    item = {"id": item_id, "type": "message", "status": status, "content": [part], "role": "assistant"}
    where = {"item_id": item_id, "content_index": 0}
    events: list[Event] = [("body", "response.content_part.added", {**where, "part": {**part, "text": ""}})]
    for piece in split_text(reply.text, reply.text_chunks):
        events.append(("delta", "response.output_text.delta", {**where, "delta": piece, "logprobs": []}))
    events.append(("body", "response.output_text.done", {**where, "text": reply.text, "logprobs": []}))
    events.append(("body", "response.content_part.done", {**where, "part": part}))
    announced = {**item, "status": "in_progress", "content": []}
    return item, announced, events


def function_call_item(call_id: str, name: str, arguments: str, parts: int) -> tuple[dict, dict, list[Event]]:
    """`id` is the item id (fc_...); `call_id` is what the client's output must quote."""
    item_id = new_id("fc_", 48)
    item = {"id": item_id, "type": "function_call", "status": "completed", "arguments": arguments,
            "call_id": call_id, "name": name}  # fmt: skip
    events: list[Event] = [
        ("delta", "response.function_call_arguments.delta", {"item_id": item_id, "delta": fragment})
        for fragment in split_arguments(arguments, parts)
    ]
    events.append(("body", "response.function_call_arguments.done", {"item_id": item_id, "arguments": arguments}))
    return item, {**item, "status": "in_progress", "arguments": ""}, events


def event_frame(kind: str, type_: str, sequence: int, payload: dict) -> Frame:
    """`event:` line naming the type, data carrying type and the stream-wide sequence number."""
    return Frame(kind, sse({"type": type_, "sequence_number": sequence, **payload}, event=type_))


def stream_events(render: Rendering) -> list[Event]:
    """created, in_progress, each item (added, its events, done), then the terminal event."""
    events: list[Event] = [
        ("head", "response.created", {"response": render.response("in_progress", [])}),
        ("head", "response.in_progress", {"response": render.response("in_progress", [])}),
    ]
    for index, (item, announced, inner) in enumerate(render.plan):
        events.append(("body", "response.output_item.added", {"output_index": index, "item": announced}))
        events += [(kind, type_, {**payload, "output_index": index}) for kind, type_, payload in inner]
        events.append(("body", "response.output_item.done", {"output_index": index, "item": item}))
    terminal = f"response.{render.status}"
    events.append(("tail", terminal, {"response": render.response(render.status, render.items)}))
    return events


def stream_frames(render: Rendering) -> list[Frame]:
    return [event_frame(kind, type_, n, payload) for n, (kind, type_, payload) in enumerate(stream_events(render))]


def failure_frames(render: Rendering, cut: int) -> bytes:
    """What replaces the rest of a stream that fails mid-way: an `error` event, then
    `response.failed` with the full (failed) response, numbered on from the cut."""
    message = render.reply.error_message
    error = event_frame("tail", "error", cut, {"code": "server_error", "message": message, "param": None})
    failed = render.response("failed", [], error={"code": "server_error", "message": message})
    return error.data + event_frame("tail", "response.failed", cut + 1, {"response": failed}).data


# ---------------------------------------------------------------- validation


def checked_body(recorded: RecordedRequest, fake: FakeOpenAIResponses) -> dict:
    """The request body once every rule the real endpoint enforces has passed."""
    body = recorded.body
    if body is None:
        raise Invalid(PARSE_ERROR)
    check_top_level(body)
    check_options(body)
    open_calls = check_previous_response(body, fake)
    if "input" in body:
        check_input(body["input"], fake, open_calls)
    check_tools(body)
    return body


def unknown(param: str) -> Invalid:
    return Invalid(f"Unknown parameter: '{param}'.", param=param, code="unknown_parameter")


def check_keys(path: str, given: dict, allowed: set[str] | frozenset[str]) -> None:
    for key in given:
        if key not in allowed:
            raise unknown(f"{path}.{key}" if path else key)


def check_top_level(body: dict) -> None:
    """Unknown and moved parameters, the required ones, and scalar types and ranges."""
    for name in body:
        if name in MOVED_PARAMS:
            raise Invalid(
                f"Unsupported parameter: '{name}'. In the Responses API, this parameter has moved to "
                f"'{MOVED_PARAMS[name]}'. Try again with the new parameter. See the API documentation for "
                "more information: https://platform.openai.com/docs/api-reference/responses/create.",
                param=name,
                code="unsupported_parameter",
            )
    check_keys("", body, ALLOWED_PARAMS)
    if "model" not in body:
        raise missing("model")
    if not isinstance(body["model"], str):
        raise wrong_type("model", "a string", body["model"])
    if "input" not in body and "previous_response_id" not in body:
        raise missing("input")
    for name in BOOLEAN_PARAMS:
        if body.get(name) is not None and not isinstance(body[name], bool):
            raise wrong_type(name, "a boolean", body[name])
    for name, (low, high) in NUMBER_RANGES.items():
        if body.get(name) is not None:
            check_number(name, body[name], low, high)
    for name, minimum in INTEGER_MINIMUMS.items():
        if body.get(name) is not None:
            check_integer(name, body[name], minimum)
    for name in STRING_PARAMS:
        if body.get(name) is not None and not isinstance(body[name], str):
            raise wrong_type(name, "a string", body[name])
    for name, values in ENUM_PARAMS.items():
        if body.get(name) is not None and body[name] not in values:
            raise bad_value(name, body[name], values)


def check_options(body: dict) -> None:
    """The object-valued options: stream_options, reasoning, text, include, metadata."""
    options = body.get("stream_options")
    if options is not None:
        if body.get("stream") is not True:
            raise Invalid(
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.", param="stream_options"
            )
        if not isinstance(options, dict):
            raise wrong_type("stream_options", "an object", options)
        check_keys("stream_options", options, {"include_obfuscation"})
    check_enum_object("reasoning", body.get("reasoning"), REASONING_KEYS)
    check_text(body.get("text"))
    include = body.get("include")
    if include is not None:
        if not isinstance(include, list):
            raise wrong_type("include", "an array", include)
        for index, value in enumerate(include):
            if value not in INCLUDABLE:
                raise bad_value(f"include[{index}]", value, INCLUDABLE)
    metadata = body.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise wrong_type("metadata", "an object", metadata)
        for key, value in metadata.items():
            if not isinstance(value, str):
                raise wrong_type(f"metadata.{key}", "a string", value)


def check_enum_object(name: str, value: Any, fields: dict[str, tuple[str, ...]]) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise wrong_type(name, "an object", value)
    check_keys(name, value, set(fields))
    for key, allowed in fields.items():
        if value.get(key) is not None and value[key] not in allowed:
            raise bad_value(f"{name}.{key}", value[key], allowed)


def check_text(text: Any) -> None:
    """`text.format` replaces Chat's response_format; json_schema needs a name and a schema."""
    if text is None:
        return
    if not isinstance(text, dict):
        raise wrong_type("text", "an object", text)
    check_keys("text", text, {"format", "verbosity"})
    if text.get("verbosity") is not None and text["verbosity"] not in VERBOSITY:
        raise bad_value("text.verbosity", text["verbosity"], VERBOSITY)
    fmt = text.get("format")
    if fmt is None:
        return
    if not isinstance(fmt, dict):
        raise wrong_type("text.format", "an object", fmt)
    if fmt.get("type") not in TEXT_FORMATS:
        raise bad_value("text.format.type", fmt.get("type"), TEXT_FORMATS)
    if fmt["type"] == "json_schema":
        for key in ("name", "schema"):
            if key not in fmt:
                raise missing(f"text.format.{key}")


def check_previous_response(body: dict, fake: FakeOpenAIResponses) -> list[str]:
    """Only a response this server created and stored can be continued; its
    unanswered calls become calls the new input must answer."""
    previous = body.get("previous_response_id")
    if previous is None:
        return []
    stored = fake.responses.get(previous)
    if stored is None or not stored.stored:
        raise Invalid(
            f"Previous response with id '{previous}' not found.",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return list(stored.open_calls)


# ---- input items


def check_input(value: Any, fake: FakeOpenAIResponses, open_calls: list[str]) -> None:
    """A string, or a list of items whose tool calls and outputs pair up."""
    if isinstance(value, str):
        if open_calls:
            raise Invalid(f"No tool output found for function call {open_calls[0]}.", param="input")
        return
    if not isinstance(value, list):
        raise wrong_type("input", "one of a string or array of input items", value)
    if not value and not open_calls:
        raise empty_array("input")
    items = [check_item(f"input[{index}]", item, fake) for index, item in enumerate(value)]
    check_reasoning_followers(value, items)
    check_call_pairing(value, items, open_calls)


def item_type(path: str, item: Any) -> str:
    """The item's type; a typeless item with a role is an easy message."""
    if not isinstance(item, dict):
        raise wrong_type(path, "an object", item)
    kind = item.get("type")
    if kind is None and "role" in item:
        return "message"
    if kind not in ITEM_KEYS:
        raise bad_value(path, kind if kind is not None else "", tuple(ITEM_KEYS))
    return kind


def check_item(path: str, item: Any, fake: FakeOpenAIResponses) -> str:
    kind = item_type(path, item)
    check_keys(path, item, ITEM_KEYS[kind])
    if kind == "message":
        check_message(path, item)
    elif kind in ("function_call", "custom_tool_call"):
        payload = "arguments" if kind == "function_call" else "input"
        for key in ("call_id", "name", payload):
            require_string(f"{path}.{key}", item)
    elif kind in ("function_call_output", "custom_tool_call_output"):
        require_string(f"{path}.call_id", item)
        check_output(f"{path}.output", item)
    else:
        check_reasoning(path, item, fake)
    return kind


def require_string(path: str, item: dict) -> None:
    key = path.rsplit(".", 1)[1]
    if key not in item:
        raise missing(path)
    if not isinstance(item[key], str):
        raise wrong_type(path, "a string", item[key])


def check_message(path: str, item: dict) -> None:
    """Role and content; user-ish roles send input_* parts, the assistant output_text/refusal."""
    role = item.get("role")
    if role is None:
        raise missing(f"{path}.role")
    if role not in ROLES:
        raise bad_value(f"{path}.role", role, ROLES)
    if "content" not in item:
        raise missing(f"{path}.content")
    content = item["content"]
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise wrong_type(f"{path}.content", "one of a string or array of input content", content)
    allowed = OUTPUT_PARTS if role == "assistant" else INPUT_PARTS
    for index, part in enumerate(content):
        check_part(f"{path}.content[{index}]", part, allowed)


def check_part(path: str, part: Any, allowed: tuple[str, ...]) -> None:
    if not isinstance(part, dict):
        raise wrong_type(path, "an object", part)
    kind = part.get("type")
    if kind is None:
        raise missing(f"{path}.type")
    if kind not in allowed:
        raise bad_value(path, kind, allowed)
    check_keys(path, part, PART_KEYS[kind])
    if kind in ("input_text", "output_text", "refusal"):
        field_name = "refusal" if kind == "refusal" else "text"
        require_string(f"{path}.{field_name}", part)
    elif kind == "input_image":
        check_image(path, part)
    elif not any(key in part for key in ("file_id", "file_data", "file_url")):
        raise missing(f"{path}.file_id")


def check_image(path: str, part: dict) -> None:
    """`image_url` is a plain string here (Chat nests it in an object)."""
    if "image_url" not in part and "file_id" not in part:
        raise missing(f"{path}.image_url")
    url = part.get("image_url")
    if url is not None:
        if not isinstance(url, str):
            raise wrong_type(f"{path}.image_url", "a string", url)
        if not url.startswith(("https://", "http://")) and not DATA_IMAGE.match(url):
            raise Invalid(
                f"Invalid '{path}.image_url'. Expected a valid URL, but got a value with an invalid format.",
                param=f"{path}.image_url",
                code="invalid_value",
            )
    if part.get("detail") is not None and part["detail"] not in IMAGE_DETAILS:
        raise bad_value(f"{path}.detail", part["detail"], IMAGE_DETAILS)


def check_output(path: str, item: dict) -> None:
    """A tool output is a string or a list of input_* parts."""
    if "output" not in item:
        raise missing(path)
    output = item["output"]
    if isinstance(output, str):
        return
    if not isinstance(output, list):
        raise wrong_type(path, "one of a string or array of input content", output)
    for index, part in enumerate(output):
        check_part(f"{path}[{index}]", part, INPUT_PARTS)


def check_reasoning(path: str, item: dict, fake: FakeOpenAIResponses) -> None:
    """A replayed reasoning item must be resolvable: stored upstream, or carrying the
    exact encrypted_content this server issued for that item."""
    require_string(f"{path}.id", item)
    if "summary" not in item:
        raise missing(f"{path}.summary")
    if not isinstance(item["summary"], list):
        raise wrong_type(f"{path}.summary", "an array", item["summary"])
    item_id, blob = item["id"], item.get("encrypted_content")
    if blob is None:
        if not fake.reasoning_items.get(item_id):
            raise Invalid(NOT_PERSISTED.format(id=item_id), param="input")
    elif fake.encrypted.get(blob) != item_id:
        raise Invalid(
            f"The encrypted content for item {item_id} could not be verified. "
            "Reason: Encrypted content could not be decrypted or parsed.",
            code="invalid_encrypted_content",
        )


def check_reasoning_followers(items: list[dict], kinds: list[str]) -> None:
    """A reasoning item is only valid right before the output item it produced."""
    for index, kind in enumerate(kinds):
        if kind != "reasoning":
            continue
        following = kinds[index + 1] if index + 1 < len(kinds) else None
        is_output = following in AFTER_REASONING and (
            following != "message" or items[index + 1].get("role") == "assistant"
        )
        if not is_output:
            raise Invalid(
                f"Item '{items[index]['id']}' of type 'reasoning' was provided without its required following item.",
                param="input",
            )


def check_call_pairing(items: list[dict], kinds: list[str], open_calls: list[str]) -> None:
    """Every tool output answers an earlier call; every call gets an output."""
    calls = {call_id: "function_call" for call_id in open_calls}
    answered: set[str] = set()
    for item, kind in zip(items, kinds):
        if kind in ("function_call", "custom_tool_call"):
            calls[item["call_id"]] = kind
        elif kind in ("function_call_output", "custom_tool_call_output"):
            label = "function call" if kind == "function_call_output" else "custom tool call"
            if item["call_id"] not in calls:
                raise Invalid(
                    f"No tool call found for {label} output with call_id {item['call_id']}.", param="input"
                )
            answered.add(item["call_id"])
    for call_id, kind in calls.items():
        if call_id not in answered:
            label = "function call" if kind == "function_call" else "custom tool call"
            raise Invalid(f"No tool output found for {label} {call_id}.", param="input")


# ---- tools


def check_tools(body: dict) -> None:
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise wrong_type("tools", "an array", tools)
        for index, tool in enumerate(tools):
            check_tool(f"tools[{index}]", tool)
    if body.get("tool_choice") is not None:
        check_tool_choice(body["tool_choice"])


def check_tool(path: str, tool: Any) -> None:
    """Function tools are flat: a Chat-style `function` wrapper leaves `name` missing."""
    if not isinstance(tool, dict):
        raise wrong_type(path, "an object", tool)
    kind = tool.get("type")
    if kind is None:
        raise missing(f"{path}.type")
    if kind in HOSTED_TOOLS:
        return
    if kind not in TOOL_KEYS:
        raise bad_value(f"{path}.type", kind, ("function", "custom", *HOSTED_TOOLS))
    if "name" not in tool:
        raise missing(f"{path}.name")
    check_keys(path, tool, TOOL_KEYS[kind])
    if not isinstance(tool["name"], str) or not FUNCTION_NAME.match(tool["name"]):
        raise Invalid(
            f"Invalid '{path}.name': string does not match pattern. Expected a string that "
            "matches the pattern '^[a-zA-Z0-9_-]+$'.",
            param=f"{path}.name",
            code="invalid_value",
        )
    if kind == "function":
        if tool.get("parameters") is not None and not isinstance(tool["parameters"], dict):
            raise wrong_type(f"{path}.parameters", "an object", tool["parameters"])
        if tool.get("strict") is not None and not isinstance(tool["strict"], bool):
            raise wrong_type(f"{path}.strict", "a boolean", tool["strict"])
    elif tool.get("format") is not None:
        fmt = tool["format"]
        if not isinstance(fmt, dict):
            raise wrong_type(f"{path}.format", "an object", fmt)
        if fmt.get("type") not in ("text", "grammar"):
            raise bad_value(f"{path}.format.type", fmt.get("type"), ("text", "grammar"))


def check_tool_choice(choice: Any) -> None:
    """A mode string, or a flat object: {type: function, name} (no Chat `function` wrapper)."""
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            raise bad_value("tool_choice", choice, TOOL_CHOICES)
        return
    if not isinstance(choice, dict):
        raise wrong_type("tool_choice", "one of a string or object", choice)
    kind = choice.get("type")
    if kind in ("function", "custom"):
        if not isinstance(choice.get("name"), str):
            raise missing("tool_choice.name")
        check_keys("tool_choice", choice, {"type", "name"})
    elif kind == "allowed_tools":
        if choice.get("mode") not in ("auto", "required"):
            raise bad_value("tool_choice.mode", choice.get("mode"), ("auto", "required"))
        if not isinstance(choice.get("tools"), list):
            raise missing("tool_choice.tools")
    elif kind not in HOSTED_TOOLS:
        raise bad_value("tool_choice.type", kind, ("function", "custom", "allowed_tools", *HOSTED_TOOLS))
