"""Strict fake of the Anthropic Messages API (`POST /v1/messages`).

It answers in the real wire format (named SSE events included) and refuses
what the real API refuses, with the real error shape, for both accepted
`anthropic-version` values.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from aiohttp import web

from .script import (
    ANTHROPIC_STOP,
    FakeUpstream,
    Frame,
    Invalid,
    RecordedRequest,
    Reply,
    arguments_object,
    arguments_of,
    canonical_stop,
    json_response,
    mapped_stop,
    new_id,
    new_signature,
    split_arguments,
    split_text,
    sse,
    tool_ids,
)

VERSION_2023 = "2023-06-01"
VERSION_2026 = "2026-10-21"
VERSIONS = (VERSION_2023, VERSION_2026)
SAMPLING_PARAMS = ("temperature", "top_p", "top_k")  # removed in 2026-10-21, even at defaults
ALLOWED_PARAMS = frozenset(
    """model messages max_tokens system stop_sequences stream temperature top_p top_k tools
    tool_choice metadata thinking service_tier container mcp_servers context_management
    output_config cache_control inference_geo""".split()
)
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
# Every block tag the API knows, and which of them each role may send.
BLOCK_TAGS = (
    "bash_code_execution_tool_result", "code_execution_tool_result", "container_upload", "document",
    "image", "redacted_thinking", "search_result", "server_tool_use",
    "text_editor_code_execution_tool_result", "text", "thinking", "tool_result", "tool_search_tool_result",
    "tool_use", "web_fetch_tool_result", "web_search_tool_result",
)  # fmt: skip
USER_BLOCKS = {"text", "image", "document", "search_result", "tool_result", "container_upload"}
SYSTEM_BLOCKS = {"text"}
ASSISTANT_ONLY = {"thinking", "redacted_thinking", "tool_use", "server_tool_use"}
TOOL_RESULT_BLOCKS = {"text", "image", "document", "search_result"}
BLOCK_KEYS = {
    "text": {"type", "text", "cache_control", "citations"},
    "image": {"type", "source", "cache_control", "transformations"},
    "tool_use": {"type", "id", "name", "input", "cache_control", "caller", "toolset_name"},
    "tool_result": {"type", "tool_use_id", "content", "is_error", "cache_control", "toolset_name"},
    "thinking": {"type", "thinking", "signature"},
    "redacted_thinking": {"type", "data"},
}
IMAGE_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
TOOL_KEYS = {
    "name", "description", "input_schema", "type", "cache_control", "strict", "input_examples",
    "defer_loading", "allowed_callers", "eager_input_streaming",
}  # fmt: skip
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
TOOL_USE_ID = re.compile(r"^[a-zA-Z0-9_-]+$")
SERVER_TOOL_TYPE = re.compile(r"^[a-z_]+_\d{8}$|^mcp_toolset$")
TOOL_CHOICE_TYPES = ("auto", "any", "tool", "none")
THINKING_TYPES = ("adaptive", "disabled", "enabled")
EXTENDED_THINKING_DOCS = "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"


class FakeAnthropic(FakeUpstream):
    """Serves POST /v1/messages; any other path gets Anthropic's 404 body."""

    object_arguments = True

    def __init__(self, api_key: str = "sk-ant-test-upstream") -> None:
        super().__init__(api_key)
        self.app.router.add_post("/v1/messages", self._messages)
        self.app.router.add_route("*", "/{tail:.*}", self._unknown_route)

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        recorded = await self.record(request)
        try:
            check_auth(recorded.headers, self.api_key)
            body = checked_body(recorded, check_version(recorded.headers))
        except Invalid as exc:
            recorded.rejected = exc.message
            return error_response(exc.status, exc.message)
        reply = self.next_reply()
        if reply.error_status is not None:
            return error_response(reply.error_status, reply.error_message)
        if body.get("stream") is True:
            request_id = new_id("req_011C", 20)
            error = error_body("overloaded_error", reply.error_message, request_id, details=True)
            frames = stream_frames(body, reply)
            headers = request_id_header(request_id)
            return await self.write_stream(request, recorded, frames, reply, sse(error, "error"), headers)
        return json_response(message(body, reply), headers=request_id_header())

    async def _unknown_route(self, request: web.Request) -> web.Response:
        recorded = await self.record(request)
        recorded.rejected = "Not Found"
        return error_response(404, "Not Found")


# ---------------------------------------------------------------- errors


def request_id_header(request_id: str | None = None) -> dict[str, str]:
    return {"request-id": request_id or new_id("req_011C", 20)}


def error_body(type_: str, message: str, request_id: str | None = None, details: bool = False) -> dict:
    error = {"details": None} if details else {}
    error.update({"type": type_, "message": message})
    return {"type": "error", "error": error, "request_id": request_id or new_id("req_011C", 20)}


def error_response(status: int, message: str) -> web.Response:
    """Anthropic's error envelope; 429 and 529 carry retry-after like the real API."""
    request_id = new_id("req_011C", 20)
    headers = request_id_header(request_id)
    if status in (429, 529):
        headers["retry-after"] = "1"
    type_ = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return json_response(error_body(type_, message, request_id), status=status, headers=headers)


# ---------------------------------------------------------------- responses


def planned_blocks(reply: Reply) -> list[tuple[dict, list[dict]]]:
    """Each content block of the answer paired with the deltas that stream it, so the
    streamed and non-streamed answers carry the same ids and signature."""
    plan = []
    if reply.reasoning:
        signature = new_signature()
        deltas = [{"type": "thinking_delta", "thinking": p} for p in split_text(reply.reasoning, reply.text_chunks)]
        deltas.append({"type": "signature_delta", "signature": signature})
        plan.append(({"type": "thinking", "thinking": reply.reasoning, "signature": signature}, deltas))
    if reply.text:
        deltas = [{"type": "text_delta", "text": p} for p in split_text(reply.text, reply.text_chunks)]
        plan.append(({"type": "text", "text": reply.text}, deltas))
    for call, call_id in zip(reply.tool_calls, tool_ids(reply, "toolu_01", 22)):
        block = {"type": "tool_use", "id": call_id, "name": call.name, "input": arguments_object(call)}
        fragments = split_arguments(arguments_of(call), reply.text_chunks)
        plan.append((block, [{"type": "input_json_delta", "partial_json": f} for f in fragments]))
    return plan


def empty_block(block: dict) -> dict:
    """How content_block_start announces a block before its deltas arrive."""
    if block["type"] == "thinking":
        return {"type": "thinking", "thinking": "", "signature": ""}
    if block["type"] == "text":
        return {"type": "text", "text": ""}
    return {**block, "input": {}}


def stop_sequence(reply: Reply) -> str | None:
    return reply.stop_sequence if canonical_stop(reply) == "stop_sequence" else None


def usage(reply: Reply) -> dict:
    """input_tokens EXCLUDES cache reads (unlike OpenAI's prompt_tokens)."""
    return {
        "input_tokens": reply.input_tokens,
        "output_tokens": reply.output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": reply.cache_read_tokens,
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
        "service_tier": "standard",
    }


def message(body: dict, reply: Reply) -> dict:
    """Non-streamed `message` object."""
    return {
        "id": new_id("msg_01", 22),
        "type": "message",
        "role": "assistant",
        "model": body["model"],
        "content": [block for block, _ in planned_blocks(reply)],
        "stop_reason": mapped_stop(reply, ANTHROPIC_STOP),
        "stop_sequence": stop_sequence(reply),
        "usage": usage(reply),
    }


def event(kind: str, name: str, payload: dict) -> Frame:
    """Named SSE event: `event:` line plus `data:` whose type equals the event name."""
    return Frame(kind, sse({"type": name, **payload}, event=name))


def stream_frames(body: dict, reply: Reply) -> list[Frame]:
    """message_start, ping, one start/delta.../stop group per block, message_delta, message_stop."""
    start = {
        "id": new_id("msg_01", 22),
        "type": "message",
        "role": "assistant",
        "model": body["model"],
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {
            "input_tokens": reply.input_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": reply.cache_read_tokens,
            "output_tokens": 1,
            "service_tier": "standard",
        },
    }
    frames = [event("head", "message_start", {"message": start}), event("head", "ping", {})]
    for index, (block, deltas) in enumerate(planned_blocks(reply)):
        frames.append(event("body", "content_block_start", {"index": index, "content_block": empty_block(block)}))
        frames += [event("delta", "content_block_delta", {"index": index, "delta": d}) for d in deltas]
        frames.append(event("body", "content_block_stop", {"index": index}))
    closing = {"stop_reason": mapped_stop(reply, ANTHROPIC_STOP), "stop_sequence": stop_sequence(reply)}
    frames.append(event("tail", "message_delta", {"delta": closing, "usage": {"output_tokens": reply.output_tokens}}))
    frames.append(event("tail", "message_stop", {}))
    return frames


# ---------------------------------------------------------------- headers


def check_auth(headers: dict[str, str], api_key: str) -> None:
    """x-api-key wins when both are sent (as on the real API); else a Bearer token."""
    if "x-api-key" in headers:
        valid = headers["x-api-key"] == api_key
    elif "authorization" in headers:
        valid = headers["authorization"] == f"Bearer {api_key}"
    else:
        raise Invalid("x-api-key header is required", status=401)
    if not valid:
        raise Invalid("invalid x-api-key", status=401)


def check_version(headers: dict[str, str]) -> str:
    version = headers.get("anthropic-version")
    if version is None:
        raise Invalid("anthropic-version: header is required")
    if version not in VERSIONS:
        raise Invalid(f"anthropic-version: invalid version '{version}'; expected one of {', '.join(VERSIONS)}")
    return version


# ---------------------------------------------------------------- body


def checked_body(recorded: RecordedRequest, version: str) -> dict:
    """The request body once every rule the real endpoint enforces has passed."""
    body = recorded.body
    if body is None:
        raise Invalid("There was an issue with your request body: it is not a valid JSON object")
    check_top_level(body, version)
    check_system(body.get("system"))
    check_messages(body["messages"], version)
    check_tools(body)
    check_thinking(body, version)
    return body


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def extra_inputs(path: str, given: dict, allowed: set[str] | frozenset[str]) -> None:
    """Reject keys the schema does not define, as the real validator does."""
    for key in given:
        if key not in allowed:
            raise Invalid(f"{path}{key}: Extra inputs are not permitted")


def check_top_level(body: dict, version: str) -> None:
    allowed = ALLOWED_PARAMS - set(SAMPLING_PARAMS) if version == VERSION_2026 else ALLOWED_PARAMS
    extra_inputs("", body, allowed)
    for name in ("model", "max_tokens", "messages"):
        if name not in body:
            raise Invalid(f"{name}: Field required")
    if not isinstance(body["model"], str):
        raise Invalid("model: Input should be a valid string")
    if not is_int(body["max_tokens"]):
        raise Invalid("max_tokens: Input should be a valid integer")
    if body["max_tokens"] < 1:
        raise Invalid("max_tokens: Input should be greater than or equal to 1")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise Invalid("stream: Input should be a valid boolean")
    check_sampling(body)
    check_stop_sequences(body.get("stop_sequences"))
    check_metadata(body.get("metadata"))
    if body.get("service_tier", "auto") not in ("auto", "standard_only"):
        raise Invalid("service_tier: Input should be 'auto' or 'standard_only'")


def check_sampling(body: dict) -> None:
    for name in ("temperature", "top_p"):
        value = body.get(name)
        if value is None:
            continue
        if not is_number(value):
            raise Invalid(f"{name}: Input should be a valid number")
        if not 0 <= value <= 1:
            raise Invalid(f"{name}: Input should be between 0 and 1")
    top_k = body.get("top_k")
    if top_k is not None and (not is_int(top_k) or top_k < 0):
        raise Invalid("top_k: Input should be a non-negative integer")


def check_stop_sequences(stops: Any) -> None:
    if stops is None:
        return
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise Invalid("stop_sequences: Input should be a valid list of strings")
    if any(not s.strip() for s in stops):
        raise Invalid("stop_sequences: each stop sequence must contain non-whitespace")


def check_metadata(metadata: Any) -> None:
    if metadata is None:
        return
    if not isinstance(metadata, dict):
        raise Invalid("metadata: Input should be a valid dictionary")
    extra_inputs("metadata.", metadata, {"user_id"})
    if metadata.get("user_id") is not None and not isinstance(metadata["user_id"], str):
        raise Invalid("metadata.user_id: Input should be a valid string")


def check_system(system: Any) -> None:
    """Top-level system prompt: a string or a list of (non-empty) text blocks."""
    if system is None or isinstance(system, str):
        return
    if not isinstance(system, list):
        raise Invalid("system: Input should be a valid string or a list of text blocks")
    for index, block in enumerate(system):
        check_block(f"system.{index}", block, "system", VERSION_2023)


# ---- messages


def check_messages(messages: Any, version: str) -> None:
    if not isinstance(messages, list):
        raise Invalid("messages: Input should be a valid list")
    if not messages:
        raise Invalid("messages: at least one message is required")
    last = len(messages) - 1
    for index, msg in enumerate(messages):
        check_message(index, msg, version, is_last=index == last)
    if messages[0]["role"] != "user":
        raise Invalid('messages: first message must use the "user" role')
    for index, msg in enumerate(messages):
        if msg["role"] == "system" and messages[index - 1]["role"] != "user":
            raise Invalid(f"messages.{index}: `system` messages must immediately follow a `user` message")
    check_tool_pairing(messages)
    check_final_whitespace(messages[-1])


def check_message(index: int, msg: Any, version: str, is_last: bool) -> None:
    """Role, keys and content of one message; system messages exist only in 2026-10-21."""
    path = f"messages.{index}"
    if not isinstance(msg, dict):
        raise Invalid(f"{path}: Input should be a valid dictionary")
    for key in ("role", "content"):
        if key not in msg:
            raise Invalid(f"{path}.{key}: Field required")
    extra_inputs(f"{path}.", msg, {"role", "content"})
    roles = ("user", "assistant", "system") if version == VERSION_2026 else ("user", "assistant")
    if msg["role"] not in roles:
        expected = " or ".join(", ".join(f"'{r}'" for r in roles).rsplit(", ", 1))
        raise Invalid(f"{path}.role: Input should be {expected}")
    content = msg["content"]
    if not isinstance(content, (str, list)):
        raise Invalid(f"{path}.content: Input should be a valid string or a list of content blocks")
    if not content and not (is_last and msg["role"] == "assistant"):
        raise Invalid(
            f"{path}: all messages must have non-empty content except for the optional final assistant message"
        )
    if isinstance(content, list):
        for position, block in enumerate(content):
            check_block(f"{path}.content.{position}", block, msg["role"], version)


def check_block(path: str, block: Any, role: str, version: str) -> None:
    """One content block: a known tag, allowed for this role, with a valid shape."""
    if not isinstance(block, dict):
        raise Invalid(f"{path}: Input should be a valid dictionary")
    kind = block.get("type")
    if kind not in BLOCK_TAGS:
        tags = ", ".join(f"'{t}'" for t in sorted(BLOCK_TAGS))
        raise Invalid(f"{path}: Input tag '{kind}' found using 'type' does not match any of the expected tags: {tags}")
    allowed = {"user": USER_BLOCKS, "system": SYSTEM_BLOCKS, "tool_result": TOOL_RESULT_BLOCKS}.get(role)
    if (allowed is not None and kind not in allowed) or (role == "assistant" and kind == "tool_result"):
        raise Invalid(f"{path}: `{kind}` blocks are not permitted in `{role}` content")
    if role == "assistant" and kind == "document" and version == VERSION_2026:
        raise Invalid(f"{path}: `document` blocks are not permitted in `assistant` messages")
    if kind in BLOCK_KEYS:
        extra_inputs(f"{path}.{kind}.", block, BLOCK_KEYS[kind])
    checker = BLOCK_CHECKS.get(kind)
    if checker:
        checker(path, block, role, version)


def check_text_block(path: str, block: dict, role: str, version: str) -> None:
    text = block.get("text")
    if not isinstance(text, str):
        raise Invalid(f"{path}.text.text: Input should be a valid string")
    where = "system" if path.startswith("system") else "messages"
    if not text:
        raise Invalid(f"{where}: text content blocks must be non-empty")
    if not text.strip():
        raise Invalid(f"{where}: text content blocks must contain non-whitespace text")
    if version == VERSION_2026 and role == "user" and block.get("citations"):
        raise Invalid(f"{path}.text.citations: citations are not permitted on `user` text blocks")


def check_image_block(path: str, block: dict, role: str, version: str) -> None:
    """base64 sources carry raw base64 of one of 4 media types; url sources must be https."""
    source = block.get("source")
    if not isinstance(source, dict):
        raise Invalid(f"{path}.image.source: Field required")
    kind = source.get("type")
    if kind == "base64":
        extra_inputs(f"{path}.image.source.base64.", source, {"type", "media_type", "data"})
        if source.get("media_type") not in IMAGE_MEDIA_TYPES:
            raise Invalid(
                f"{path}.image.source.base64.media_type: Input should be "
                "'image/jpeg', 'image/png', 'image/gif' or 'image/webp'"
            )
        if not is_base64(source.get("data")):
            raise Invalid(f"{path}.image.source.base64.data: Input should be valid base64 (without a data: prefix)")
    elif kind == "url":
        extra_inputs(f"{path}.image.source.url.", source, {"type", "url"})
        if not str(source.get("url", "")).startswith("https://"):
            raise Invalid(f"{path}.image.source.url.url: Only HTTPS URLs are supported")
    elif kind != "file":
        raise Invalid(
            f"{path}.image.source: Input tag '{kind}' found using 'type' does not match any of the "
            "expected tags: 'base64', 'file', 'url'"
        )


def is_base64(data: Any) -> bool:
    if not isinstance(data, str) or not data or data.startswith("data:"):
        return False
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def check_tool_use_block(path: str, block: dict, role: str, version: str) -> None:
    """`input` must be an object: a JSON string (OpenAI's arguments) is refused."""
    for key in ("id", "name", "input"):
        if key not in block:
            raise Invalid(f"{path}.tool_use.{key}: Field required")
    if not isinstance(block["id"], str) or not TOOL_USE_ID.match(block["id"]):
        raise Invalid(f"{path}.tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'")
    if not isinstance(block["name"], str):
        raise Invalid(f"{path}.tool_use.name: Input should be a valid string")
    if not isinstance(block["input"], dict):
        raise Invalid(f"{path}.tool_use.input: Input should be a valid dictionary")


def check_tool_result_block(path: str, block: dict, role: str, version: str) -> None:
    if not isinstance(block.get("tool_use_id"), str):
        raise Invalid(f"{path}.tool_result.tool_use_id: Field required")
    if "is_error" in block and not isinstance(block["is_error"], bool):
        raise Invalid(f"{path}.tool_result.is_error: Input should be a valid boolean")
    content = block.get("content", "")
    if isinstance(content, list):
        for position, inner in enumerate(content):
            check_block(f"{path}.tool_result.content.{position}", inner, "tool_result", version)
    elif not isinstance(content, str):
        raise Invalid(f"{path}.tool_result.content: Input should be a valid string or a list of content blocks")


def check_thinking_block(path: str, block: dict, role: str, version: str) -> None:
    for key in ("thinking", "signature"):
        if not isinstance(block.get(key), str):
            raise Invalid(f"{path}.thinking.{key}: Field required")


def check_redacted_thinking_block(path: str, block: dict, role: str, version: str) -> None:
    if not isinstance(block.get("data"), str):
        raise Invalid(f"{path}.redacted_thinking.data: Field required")


BLOCK_CHECKS = {
    "text": check_text_block,
    "image": check_image_block,
    "tool_use": check_tool_use_block,
    "tool_result": check_tool_result_block,
    "thinking": check_thinking_block,
    "redacted_thinking": check_redacted_thinking_block,
}


def blocks_of(msg: dict) -> list[dict]:
    return msg["content"] if isinstance(msg["content"], list) else []


def tool_use_ids(msg: dict) -> list[str]:
    return [b["id"] for b in blocks_of(msg) if b["type"] == "tool_use"]


def check_tool_pairing(messages: list[dict]) -> None:
    """Each assistant tool_use is answered by tool_result blocks at the START of the very
    next user message, and each tool_result answers a tool_use of the previous message."""
    for index, msg in enumerate(messages):
        previous = messages[index - 1] if index else None
        if msg["role"] == "user":
            asked = tool_use_ids(previous) if previous and previous["role"] == "assistant" else []
            for position, block in enumerate(blocks_of(msg)):
                if block["type"] == "tool_result" and block["tool_use_id"] not in asked:
                    raise Invalid(
                        f"messages.{index}.content.{position}: unexpected `tool_use_id` found in `tool_result` "
                        f"blocks: {block['tool_use_id']}. Each `tool_result` block must have a corresponding "
                        "`tool_use` block in the previous message."
                    )
        ids = tool_use_ids(msg) if msg["role"] == "assistant" else []
        if ids:
            following = messages[index + 1] if index + 1 < len(messages) else None
            answered = leading_tool_results(following) if following and following["role"] == "user" else set()
            unanswered = [i for i in ids if i not in answered]
            if unanswered:
                raise Invalid(
                    f"messages.{index}: `tool_use` ids were found without `tool_result` blocks immediately "
                    f"after: {', '.join(unanswered)}. Each `tool_use` block must have a corresponding "
                    "`tool_result` block in the next message."
                )


def leading_tool_results(msg: dict) -> set[str]:
    """Ids answered by the run of tool_result blocks that opens a message."""
    answered = set()
    for block in blocks_of(msg):
        if block["type"] != "tool_result":
            break
        answered.add(block["tool_use_id"])
    return answered


def check_final_whitespace(msg: dict) -> None:
    """A prefilled final assistant turn cannot end in whitespace."""
    if msg["role"] != "assistant":
        return
    content = msg["content"]
    tail = content if isinstance(content, str) else ""
    if isinstance(content, list) and content and content[-1]["type"] == "text":
        tail = content[-1]["text"]
    if tail and tail != tail.rstrip():
        raise Invalid("messages: final assistant content cannot end with trailing whitespace")


# ---- tools and thinking


def check_tools(body: dict) -> None:
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise Invalid("tools: Input should be a valid list")
        for index, tool in enumerate(tools):
            check_tool(f"tools.{index}", tool)
    choice = body.get("tool_choice")
    if choice is not None:
        check_tool_choice(choice, has_tools=bool(tools))


def check_tool(path: str, tool: Any) -> None:
    """Client tools need a name and an object input_schema; server tools a versioned type."""
    if not isinstance(tool, dict):
        raise Invalid(f"{path}: Input should be a valid dictionary")
    kind = tool.get("type")
    if kind is not None and kind != "custom":
        if not isinstance(kind, str) or not SERVER_TOOL_TYPE.match(kind):
            raise Invalid(f"{path}: Input tag '{kind}' found using 'type' does not match any of the expected tags")
        return
    extra_inputs(f"{path}.custom.", tool, TOOL_KEYS)
    name = tool.get("name")
    if name is None:
        raise Invalid(f"{path}.custom.name: Field required")
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        raise Invalid(f"{path}.custom.name: String should match pattern '^[a-zA-Z0-9_-]{{1,128}}$'")
    schema = tool.get("input_schema")
    if schema is None:
        raise Invalid(f"{path}.custom.input_schema: Field required")
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise Invalid(f"{path}.custom.input_schema.type: Input should be 'object'")
    if "description" in tool and not isinstance(tool["description"], str):
        raise Invalid(f"{path}.custom.description: Input should be a valid string")


def check_tool_choice(choice: Any, has_tools: bool) -> None:
    if not isinstance(choice, dict):
        raise Invalid("tool_choice: Input should be a valid dictionary or object to extract fields from")
    kind = choice.get("type")
    if kind not in TOOL_CHOICE_TYPES:
        raise Invalid(
            f"tool_choice: Input tag '{kind}' found using 'type' does not match any of the expected tags: "
            "'auto', 'any', 'tool', 'none'"
        )
    allowed = {"type"} if kind == "none" else {"type", "disable_parallel_tool_use"}
    extra_inputs(f"tool_choice.{kind}.", choice, allowed | ({"name"} if kind == "tool" else set()))
    if kind == "tool" and not isinstance(choice.get("name"), str):
        raise Invalid("tool_choice.tool.name: Field required")
    if kind != "none" and not has_tools:
        raise Invalid("tool_choice: tool_choice may only be specified while providing tools")


def check_thinking(body: dict, version: str) -> None:
    """Extended thinking config, and the rule that the turn being continued keeps its thinking."""
    thinking = body.get("thinking")
    if thinking is None:
        return
    if not isinstance(thinking, dict) or thinking.get("type") not in THINKING_TYPES:
        kind = thinking.get("type") if isinstance(thinking, dict) else thinking
        raise Invalid(
            f"thinking: Input tag '{kind}' found using 'type' does not match any of the expected tags: "
            "'adaptive', 'disabled', 'enabled'"
        )
    if thinking["type"] != "enabled":
        return
    budget = thinking.get("budget_tokens")
    if not is_int(budget):
        raise Invalid("thinking.enabled.budget_tokens: Field required")
    if budget < 1024:
        raise Invalid("thinking.enabled.budget_tokens: Input should be greater than or equal to 1024")
    if body["max_tokens"] <= budget:
        raise Invalid(
            "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our documentation at "
            f"{EXTENDED_THINKING_DOCS}#max-tokens-and-context-window-size"
        )
    if version == VERSION_2023 and body.get("temperature", 1) != 1:
        raise Invalid("`temperature` may only be set to 1 when thinking is enabled.")
    check_thinking_continuation(body["messages"])


def check_thinking_continuation(messages: list[dict]) -> None:
    """With thinking on, an assistant tool_use turn answered by the final user message
    must open with its (signed) thinking block."""
    if len(messages) < 2:
        return
    assistant, last = messages[-2], messages[-1]
    if assistant["role"] != "assistant" or not tool_use_ids(assistant) or not leading_tool_results(last):
        return
    first = blocks_of(assistant)[0]["type"]
    if first not in ("thinking", "redacted_thinking"):
        raise Invalid(
            f"messages.{len(messages) - 2}.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
            f"`{first}`. When `thinking` is enabled, a final `assistant` message must start with a thinking "
            "block (preceeding the lastmost set of `tool_use` and `tool_result` blocks). We recommend you "
            "include thinking blocks from previous turns. To avoid this requirement, disable `thinking`. "
            f"Please consult our documentation at {EXTENDED_THINKING_DOCS}"
        )
