"""Strict fake of OpenAI Chat Completions (`POST /v1/chat/completions`).

It answers in the real wire format (streams included) and refuses what the
real API refuses, with the real error shape, so a gateway test that passes
against it would pass against the real upstream.
"""

from __future__ import annotations

import re
import time
from typing import Any

from aiohttp import web

from .script import (
    OPENAI_FINISH,
    FakeUpstream,
    Frame,
    Invalid,
    RecordedRequest,
    Reply,
    arguments_of,
    json_response,
    mapped_stop,
    new_id,
    split_arguments,
    split_text,
    sse,
    tool_ids,
)

FINGERPRINT = "fp_fake0000001"

ALLOWED_PARAMS = frozenset(
    """model messages max_tokens max_completion_tokens temperature top_p n stream stream_options
    stop presence_penalty frequency_penalty logit_bias logprobs top_logprobs user seed tools
    tool_choice parallel_tool_calls response_format reasoning_effort service_tier store metadata
    modalities prediction audio web_search_options verbosity safety_identifier prompt_cache_key
    prompt_cache_retention""".split()
)
ROLES = ("system", "developer", "user", "assistant", "tool")
MESSAGE_KEYS = {
    "system": {"role", "content", "name"},
    "developer": {"role", "content", "name"},
    "user": {"role", "content", "name"},
    "assistant": {"role", "content", "name", "tool_calls", "refusal", "audio", "function_call"},
    "tool": {"role", "content", "tool_call_id"},
}
PART_TYPES = {
    "system": ("text",),
    "developer": ("text",),
    "user": ("text", "image_url"),
    "assistant": ("text", "refusal"),
    "tool": ("text",),
}
PART_KEYS = {
    "text": {"type", "text", "prompt_cache_breakpoint"},
    "image_url": {"type", "image_url", "prompt_cache_breakpoint"},
    "refusal": {"type", "refusal"},
}
IMAGE_DETAILS = ("auto", "low", "high", "original")
NUMBER_RANGES = {
    "temperature": (0, 2),
    "top_p": (0, 1),
    "presence_penalty": (-2, 2),
    "frequency_penalty": (-2, 2),
}
INTEGER_MINIMUMS = {"max_tokens": 1, "max_completion_tokens": 1, "n": 1, "top_logprobs": 0, "seed": None}
BOOLEAN_PARAMS = ("stream", "logprobs", "parallel_tool_calls", "store")
REASONING_MODEL_PREFIXES = ("o1", "o3", "o4", "gpt-5")
FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")

PARSE_ERROR = (
    "We could not parse the JSON body of your request. (HINT: This likely means you aren't using "
    "your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not "
    "valid JSON. If you have trouble figuring out how to fix this, please contact us through our "
    "help center at help.openai.com.)"
)


class FakeOpenAIChat(FakeUpstream):
    """Serves POST /v1/chat/completions; any other path gets OpenAI's 404 body."""

    def __init__(self, api_key: str = "sk-test-upstream") -> None:
        super().__init__(api_key)
        self.app.router.add_post("/v1/chat/completions", self._chat)
        self.app.router.add_route("*", "/{tail:.*}", self._unknown_route)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        recorded = await self.record(request)
        try:
            check_auth(recorded.headers, self.api_key)
            body = checked_body(recorded)
        except Invalid as exc:
            recorded.rejected = exc.message
            return error_response(exc)
        reply = self.next_reply()
        if reply.error_status is not None:
            return scripted_error(reply)
        if body.get("stream"):
            frames = stream_frames(body, reply)
            error = sse({"error": error_object(reply.error_message, "server_error")})
            return await self.write_stream(request, recorded, frames, reply, error, request_id_header())
        return json_response(completion(body, reply), headers=request_id_header())

    async def _unknown_route(self, request: web.Request) -> web.Response:
        recorded = await self.record(request)
        exc = Invalid(f"Invalid URL ({request.method} {request.path})", status=404)
        recorded.rejected = exc.message
        return error_response(exc)


# ---------------------------------------------------------------- errors


def error_object(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict:
    return {"message": message, "type": type_, "param": param, "code": code}


def request_id_header() -> dict[str, str]:
    return {"x-request-id": new_id("req_", 32)}


def error_response(exc: Invalid) -> web.Response:
    """A refusal in OpenAI's shape: type is invalid_request_error for every client mistake."""
    body = {"error": error_object(exc.message, "invalid_request_error", exc.param, exc.code)}
    return json_response(body, status=exc.status, headers=request_id_header())


def scripted_error(reply: Reply) -> web.Response:
    """The error a test asked for, with the type/code OpenAI uses at that status."""
    status = reply.error_status or 500
    type_, code = {
        401: ("invalid_request_error", "invalid_api_key"),
        404: ("invalid_request_error", "model_not_found"),
        429: ("requests", "rate_limit_exceeded"),
    }.get(status, ("server_error" if status >= 500 else "invalid_request_error", None))
    headers = request_id_header()
    if status in (429, 503):
        headers["retry-after"] = "1"
    body = {"error": error_object(reply.error_message, type_, None, code)}
    return json_response(body, status=status, headers=headers)


# ---------------------------------------------------------------- responses


def usage(reply: Reply) -> dict:
    """prompt_tokens INCLUDES cached tokens (unlike Anthropic's input_tokens)."""
    prompt = reply.input_tokens + reply.cache_read_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": reply.output_tokens,
        "total_tokens": prompt + reply.output_tokens,
        "prompt_tokens_details": {"cached_tokens": reply.cache_read_tokens, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def completion(body: dict, reply: Reply) -> dict:
    """Non-streamed `chat.completion`; content is null when the model only calls tools."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": reply.text or None,
        "refusal": None,
        "annotations": [],
    }
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": call_id, "type": "function", "function": {"name": call.name, "arguments": arguments_of(call)}}
            for call, call_id in zip(reply.tool_calls, tool_ids(reply, "call_"))
        ]
    return {
        "id": new_id("chatcmpl-", 29),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body["model"],
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": mapped_stop(reply, OPENAI_FINISH)}
        ],
        "usage": usage(reply),
        "service_tier": "default",
        "system_fingerprint": FINGERPRINT,
    }


def stream_frames(body: dict, reply: Reply) -> list[Frame]:
    """`data:`-only chunks ending in [DONE]; usage only when the client asked for it."""
    include_usage = (body.get("stream_options") or {}).get("include_usage") is True
    base = {
        "id": new_id("chatcmpl-", 29),
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": body["model"],
        "service_tier": "default",
        "system_fingerprint": FINGERPRINT,
    }

    def chunk(delta: dict, kind: str = "delta", finish: str | None = None) -> Frame:
        data = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        if include_usage:
            data["usage"] = None
        return Frame(kind, sse(data))

    # Real streams open with content "" for text and content null for tool-only turns.
    frames = [chunk({"role": "assistant", "content": "" if reply.text else None, "refusal": None}, "head")]
    frames += [chunk({"content": piece}) for piece in split_text(reply.text, reply.text_chunks)]
    for index, (call, call_id) in enumerate(zip(reply.tool_calls, tool_ids(reply, "call_"))):
        frames += tool_call_chunks(chunk, index, call_id, call.name, arguments_of(call), reply.text_chunks)
    frames.append(chunk({}, "tail", mapped_stop(reply, OPENAI_FINISH)))
    if include_usage:
        frames.append(Frame("tail", sse({**base, "choices": [], "usage": usage(reply)})))
    frames.append(Frame("tail", sse("[DONE]")))
    return frames


def tool_call_chunks(chunk, index: int, call_id: str, name: str, arguments: str, parts: int) -> list[Frame]:
    """First delta names the call (arguments ""); the rest carry only index + fragments."""
    opening = {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
    frames = [chunk({"tool_calls": [opening]})]
    for fragment in split_arguments(arguments, parts):
        frames.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]}))
    return frames


# ---------------------------------------------------------------- validation


def check_auth(headers: dict[str, str], api_key: str) -> None:
    """401 unless the exact key comes as a Bearer token."""
    value = headers.get("authorization", "")
    if value == f"Bearer {api_key}":
        return
    given = value.removeprefix("Bearer ").strip()
    if not given:
        message = (
            "You didn't provide an API key. You need to provide your API key in an Authorization "
            "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
        )
    else:
        message = (
            f"Incorrect API key provided: {given[:6]}***. You can find your API key at "
            "https://platform.openai.com/account/api-keys."
        )
    raise Invalid(message, status=401, code="invalid_api_key")


def checked_body(recorded: RecordedRequest) -> dict:
    """The request body once every rule the real endpoint enforces has passed."""
    body = recorded.body
    if body is None:
        raise Invalid(PARSE_ERROR)
    check_top_level(body)
    check_messages(body["messages"])
    check_tools(body)
    check_streaming(body)
    check_model_rules(body)
    return body


def type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return "null"


def wrong_type(param: str, expected: str, value: Any) -> Invalid:
    return Invalid(
        f"Invalid type for '{param}': expected {expected}, but got {type_name(value)} instead.",
        param=param,
        code="invalid_type",
    )


def missing(param: str) -> Invalid:
    return Invalid(f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")


def bad_value(param: str, value: Any, supported: tuple[str, ...]) -> Invalid:
    quoted = [f"'{s}'" for s in supported]
    options = " and ".join(quoted) if len(quoted) <= 2 else ", ".join(quoted[:-1]) + ", and " + quoted[-1]
    return Invalid(
        f"Invalid value: '{value}'. Supported values are: {options}.", param=param, code="invalid_value"
    )


def empty_array(param: str) -> Invalid:
    return Invalid(
        f"Invalid '{param}': empty array. Expected an array with minimum length 1, "
        "but got an empty array instead.",
        param=param,
        code="empty_array",
    )


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_top_level(body: dict) -> None:
    """Unknown parameters, required ones, and the scalar ones' types and ranges."""
    for name in body:
        if name not in ALLOWED_PARAMS:
            raise Invalid(f"Unrecognized request argument supplied: {name}")
    if "model" not in body:
        raise Invalid("you must provide a model parameter")
    if not isinstance(body["model"], str):
        raise wrong_type("model", "a string", body["model"])
    if "messages" not in body:
        raise missing("messages")
    for name in BOOLEAN_PARAMS:
        if name in body and not isinstance(body[name], bool):
            raise wrong_type(name, "a boolean", body[name])
    for name, (low, high) in NUMBER_RANGES.items():
        if name in body and body[name] is not None:
            check_number(name, body[name], low, high)
    for name, minimum in INTEGER_MINIMUMS.items():
        if name in body and body[name] is not None:
            check_integer(name, body[name], minimum)
    if "stop" in body:
        check_stop(body["stop"])


def check_number(name: str, value: Any, low: float, high: float) -> None:
    if not is_number(value):
        raise wrong_type(name, "a decimal", value)
    if value < low:
        raise Invalid(
            f"Invalid '{name}': decimal below minimum value. Expected a value >= {low}, but got {value} instead.",
            param=name,
            code="decimal_below_min_value",
        )
    if value > high:
        raise Invalid(
            f"Invalid '{name}': decimal above maximum value. Expected a value <= {high}, but got {value} instead.",
            param=name,
            code="decimal_above_max_value",
        )


def check_integer(name: str, value: Any, minimum: int | None) -> None:
    if not is_int(value):
        raise wrong_type(name, "an integer", value)
    if minimum is not None and value < minimum:
        raise Invalid(
            f"Invalid '{name}': integer below minimum value. Expected a value >= {minimum}, "
            f"but got {value} instead.",
            param=name,
            code="integer_below_min_value",
        )


def check_stop(stop: Any) -> None:
    if stop is None or isinstance(stop, str):
        return
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise wrong_type("stop", "one of a string or array of strings", stop)
    if len(stop) > 4:
        raise Invalid(
            f"Invalid 'stop': array too long. Expected an array with maximum length 4, "
            f"but got an array with length {len(stop)} instead.",
            param="stop",
            code="array_above_max_length",
        )


# ---- messages


def check_messages(messages: Any) -> None:
    if not isinstance(messages, list):
        raise wrong_type("messages", "an array", messages)
    if not messages:
        raise empty_array("messages")
    for index, message in enumerate(messages):
        check_message(f"messages[{index}]", message)
    check_tool_pairing(messages)


def check_message(path: str, message: Any) -> None:
    """One message: a known role, only that role's keys, and content of the right shape."""
    if not isinstance(message, dict):
        raise wrong_type(path, "an object", message)
    role = message.get("role")
    if role is None:
        raise missing(f"{path}.role")
    if role not in ROLES:
        raise bad_value(f"{path}.role", role, ROLES)
    extra = sorted(set(message) - MESSAGE_KEYS[role])
    if extra:
        raise Invalid(
            f"Additional properties are not allowed ('{extra[0]}' was unexpected) - '{path}'", param=path
        )
    if role == "assistant":
        check_assistant(path, message)
    else:
        if "content" not in message:
            raise missing(f"{path}.content")
        check_content(path, role, message["content"])
    if role == "tool" and not isinstance(message.get("tool_call_id"), str):
        raise Invalid(
            "Missing parameter 'tool_call_id': messages with role 'tool' must have a 'tool_call_id'.",
            param=f"{path}.tool_call_id",
            code="missing_required_parameter",
        )


def check_assistant(path: str, message: dict) -> None:
    """Content may be null/absent only when the assistant turn carries tool calls."""
    tool_calls = message.get("tool_calls")
    if tool_calls is not None:
        if not isinstance(tool_calls, list):
            raise wrong_type(f"{path}.tool_calls", "an array", tool_calls)
        if not tool_calls:
            raise empty_array(f"{path}.tool_calls")
        for index, call in enumerate(tool_calls):
            check_tool_call(f"{path}.tool_calls[{index}]", call)
    content = message.get("content")
    if content is None:
        if not tool_calls and message.get("function_call") is None:
            raise Invalid(
                f"Invalid value for '{path}.content': expected a string, got null.",
                param=f"{path}.content",
                code="invalid_value",
            )
        return
    check_content(path, "assistant", content)


def check_tool_call(path: str, call: Any) -> None:
    if not isinstance(call, dict):
        raise wrong_type(path, "an object", call)
    for key in ("id", "type", "function"):
        if key not in call:
            raise missing(f"{path}.{key}")
    if not isinstance(call["id"], str):
        raise wrong_type(f"{path}.id", "a string", call["id"])
    if call["type"] != "function":
        raise bad_value(f"{path}.type", call["type"], ("function",))
    function = call["function"]
    if not isinstance(function, dict):
        raise wrong_type(f"{path}.function", "an object", function)
    for key in ("name", "arguments"):
        if key not in function:
            raise missing(f"{path}.function.{key}")
        if not isinstance(function[key], str):
            raise wrong_type(f"{path}.function.{key}", "a string", function[key])


def check_content(path: str, role: str, content: Any) -> None:
    """A string, or a non-empty list of the part types this role may send."""
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise wrong_type(f"{path}.content", "one of a string or array of objects", content)
    if not content:
        raise empty_array(f"{path}.content")
    for index, part in enumerate(content):
        check_part(f"{path}.content[{index}]", role, part)


def check_part(path: str, role: str, part: Any) -> None:
    if not isinstance(part, dict):
        raise wrong_type(path, "an object", part)
    kind = part.get("type")
    if kind is None:
        raise missing(f"{path}.type")
    if kind not in PART_TYPES[role]:
        raise bad_value(f"{path}.type", kind, PART_TYPES[role])
    extra = sorted(set(part) - PART_KEYS[kind])
    if extra:
        raise Invalid(
            f"Additional properties are not allowed ('{extra[0]}' was unexpected) - '{path}'", param=path
        )
    if kind in ("text", "refusal"):
        if kind not in part:
            raise missing(f"{path}.{kind}")
        if not isinstance(part[kind], str):
            raise wrong_type(f"{path}.{kind}", "a string", part[kind])
    if kind == "image_url":
        check_image_url(f"{path}.image_url", part.get("image_url"))


def check_image_url(path: str, image: Any) -> None:
    """Only https URLs and base64 data URIs of images are fetchable by the real API."""
    if not isinstance(image, dict):
        raise wrong_type(path, "an object", image)
    url = image.get("url")
    if not isinstance(url, str):
        raise missing(f"{path}.url") if url is None else wrong_type(f"{path}.url", "a string", url)
    if url.startswith("data:"):
        if not re.match(r"^data:image/[\w.+-]+;base64,[A-Za-z0-9+/=\s]+$", url):
            raise Invalid(
                f"Invalid '{path}.url': Expected a base64-encoded data URL with an image MIME type "
                "(e.g. 'data:image/png;base64,aW1nIGJ5dGVzIGhlcmU='), but got an invalid value.",
                param=f"{path}.url",
                code="invalid_value",
            )
    elif not url.startswith("https://"):
        raise Invalid(
            f"Invalid '{path}.url': Expected a valid URL, but got a value with an invalid format.",
            param=f"{path}.url",
            code="invalid_value",
        )
    extra = sorted(set(image) - {"url", "detail"})
    if extra:
        raise Invalid(f"Additional properties are not allowed ('{extra[0]}' was unexpected) - '{path}'", param=path)
    if "detail" in image and image["detail"] not in IMAGE_DETAILS:
        raise bad_value(f"{path}.detail", image["detail"], IMAGE_DETAILS)


def check_tool_pairing(messages: list[dict]) -> None:
    """Every tool call must be answered by tool messages before the next non-tool message,
    and every tool message must answer a still-open call."""
    pending: list[str] = []
    asked_at = 0
    for index, message in enumerate(messages):
        if message["role"] == "tool":
            if message["tool_call_id"] not in pending:
                raise Invalid(
                    "Invalid parameter: messages with role 'tool' must be a response to a preceeding "
                    "message with 'tool_calls'.",
                    param=f"messages.[{index}].role",
                )
            pending.remove(message["tool_call_id"])
            continue
        if pending:
            raise unanswered(asked_at, pending)
        if message["role"] == "assistant" and message.get("tool_calls"):
            pending = [call["id"] for call in message["tool_calls"]]
            asked_at = index
    if pending:
        raise unanswered(asked_at, pending)


def unanswered(index: int, ids: list[str]) -> Invalid:
    return Invalid(
        "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
        f"'tool_call_id'. The following tool_call_ids did not have response messages: {', '.join(ids)}",
        param=f"messages.[{index}].role",
    )


# ---- tools, streaming, model rules


def check_tools(body: dict) -> None:
    """Function tools only; tool_choice / parallel_tool_calls need tools to be present."""
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise wrong_type("tools", "an array", tools)
        if not tools:
            raise empty_array("tools")
        for index, tool in enumerate(tools):
            check_tool(f"tools[{index}]", tool)
    for name in ("tool_choice", "parallel_tool_calls"):
        if name in body and body[name] is not None and not tools:
            raise Invalid(
                f"Invalid value for '{name}': '{name}' is only allowed when 'tools' are specified.",
                param=name,
            )
    if body.get("tool_choice") is not None:
        check_tool_choice(body["tool_choice"])


def check_tool(path: str, tool: Any) -> None:
    if not isinstance(tool, dict):
        raise wrong_type(path, "an object", tool)
    if "type" not in tool:
        raise missing(f"{path}.type")
    if tool["type"] != "function":
        raise bad_value(f"{path}.type", tool["type"], ("function",))
    extra = sorted(set(tool) - {"type", "function"})
    if extra:
        raise Invalid(f"Additional properties are not allowed ('{extra[0]}' was unexpected) - '{path}'", param=path)
    function = tool.get("function")
    if function is None:
        raise missing(f"{path}.function")
    if not isinstance(function, dict):
        raise wrong_type(f"{path}.function", "an object", function)
    name = function.get("name")
    if name is None:
        raise missing(f"{path}.function.name")
    if not isinstance(name, str) or not FUNCTION_NAME.match(name):
        raise Invalid(
            f"Invalid '{path}.function.name': string does not match pattern. Expected a string that "
            "matches the pattern '^[a-zA-Z0-9_-]+$'.",
            param=f"{path}.function.name",
            code="invalid_value",
        )
    if "parameters" in function and not isinstance(function["parameters"], dict):
        raise wrong_type(f"{path}.function.parameters", "an object", function["parameters"])
    extra = sorted(set(function) - {"name", "description", "parameters", "strict"})
    if extra:
        raise Invalid(
            f"Additional properties are not allowed ('{extra[0]}' was unexpected) - '{path}.function'",
            param=f"{path}.function",
        )


def check_tool_choice(choice: Any) -> None:
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise bad_value("tool_choice", choice, ("none", "auto", "required"))
        return
    valid = isinstance(choice, dict) and (
        (choice.get("type") == "function" and isinstance((choice.get("function") or {}).get("name"), str))
        or choice.get("type") == "allowed_tools"
    )
    if not valid:
        raise Invalid(
            "Invalid value for 'tool_choice': expected 'none', 'auto', 'required' or "
            "{'type': 'function', 'function': {'name': ...}}.",
            param="tool_choice",
            code="invalid_value",
        )


def check_streaming(body: dict) -> None:
    options = body.get("stream_options")
    if options is None:
        return
    if body.get("stream") is not True:
        raise Invalid(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.", param="stream_options"
        )
    if not isinstance(options, dict):
        raise wrong_type("stream_options", "an object", options)
    for key, value in options.items():
        if key not in ("include_usage", "include_obfuscation"):
            raise Invalid(f"Unrecognized request argument supplied: stream_options.{key}")
        if not isinstance(value, bool):
            raise wrong_type(f"stream_options.{key}", "a boolean", value)


def check_model_rules(body: dict) -> None:
    """Per-model restrictions and this fake's own limit (a single choice)."""
    if body["model"].startswith(REASONING_MODEL_PREFIXES) and body.get("max_tokens") is not None:
        raise Invalid(
            "Unsupported parameter: 'max_tokens' is not supported with this model. "
            "Use 'max_completion_tokens' instead.",
            param="max_tokens",
            code="unsupported_parameter",
        )
    if body.get("n", 1) not in (1, None):
        raise Invalid("Invalid value for 'n': the fake upstream supports only n=1.", param="n")
