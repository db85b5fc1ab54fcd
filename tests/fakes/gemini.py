"""Strict fake of the Google Gemini API (`generateContent` / `streamGenerateContent`).

It answers in the real wire format (SSE with CRLF line endings, no event names,
no terminator) and refuses what the real API refuses, with Google's RPC error
shape, so a gateway test that passes against it would pass against upstream.
What it renders follows the request, as upstream does: thought text only when
`thinkingConfig.includeThoughts` is true.

One rule is stricter than upstream on purpose: upstream's JSON parser also
takes proto field names (`system_instruction`, `max_output_tokens`), but the
documented wire spelling is camelCase, so this fake accepts camelCase only and
answers anything else with upstream's unknown-field error.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import secrets
from typing import Any

from aiohttp import web

from .script import (
    GEMINI_FINISH,
    FakeUpstream,
    Frame,
    Invalid,
    RecordedRequest,
    Reply,
    arguments_object,
    json_response,
    mapped_stop,
    new_id,
    split_text,
    sse,
)

METHODS = ("generateContent", "streamGenerateContent")
PROTO = "type.googleapis.com/google.ai.generativelanguage.v1beta."
STRUCT = "type.googleapis.com/google.protobuf.Struct"
STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
NO_KEY = (
    "Method doesn't allow unregistered callers (callers without established identity). "
    "Please use API Key or other form of API consumer identity to call this API."
)
BAD_KEY = "API key not valid. Please pass a valid API key."

TOP_KEYS = {"contents", "systemInstruction", "tools", "toolConfig", "generationConfig", "safetySettings",
            "cachedContent"}  # fmt: skip
ROLES = ("user", "model")
PART_DATA = ("text", "inlineData", "fileData", "functionCall", "functionResponse")
PART_KEYS = {*PART_DATA, "thought", "thoughtSignature"}
TOOL_KEYS = {"functionDeclarations", "googleSearch", "googleSearchRetrieval", "codeExecution", "urlContext"}
DECLARATION_KEYS = {"name", "description", "parameters", "parametersJsonSchema", "response", "responseJsonSchema",
                    "behavior"}  # fmt: skip
# The OpenAPI subset Gemini's Schema knows: JSON-Schema-only keys ($schema,
# additionalProperties, const, ...) are unknown fields upstream.
SCHEMA_KEYS = {"type", "format", "title", "description", "nullable", "enum", "maxItems", "minItems", "properties",
               "required", "minProperties", "maxProperties", "minLength", "maxLength", "pattern", "example",
               "anyOf", "propertyOrdering", "default", "items", "minimum", "maximum"}  # fmt: skip
SCHEMA_TYPES = ("TYPE_UNSPECIFIED", "STRING", "NUMBER", "INTEGER", "BOOLEAN", "ARRAY", "OBJECT", "NULL")
MODES = ("AUTO", "ANY", "NONE", "VALIDATED")
INT_CONFIG = ("maxOutputTokens", "topK", "candidateCount", "seed")
FLOAT_CONFIG = {"temperature": (0, 2), "topP": (0, 1), "presencePenalty": None, "frequencyPenalty": None}
GENERATION_KEYS = {*INT_CONFIG, *FLOAT_CONFIG, "stopSequences", "thinkingConfig", "responseMimeType",
                   "responseSchema", "responseJsonSchema", "responseModalities"}  # fmt: skip
THINKING_KEYS = {"thinkingBudget": int, "includeThoughts": bool, "thinkingLevel": str}
FUNCTION_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_.:-]{0,127}$")
THOUGHT_SIGNATURE_DOCS = "https://ai.google.dev/gemini-api/docs/thought-signatures"


class FakeGemini(FakeUpstream):
    """Serves POST /v1beta/models/{model}:generateContent and :streamGenerateContent."""

    object_arguments = True

    def __init__(self, api_key: str = "gemini-test-key") -> None:
        super().__init__(api_key)
        self.app.router.add_post("/v1beta/models/{target}", self._models)
        self.app.router.add_route("*", "/{tail:.*}", self._unknown_route)

    async def _models(self, request: web.Request) -> web.StreamResponse:
        recorded = await self.record(request)
        model, _, method = request.match_info["target"].partition(":")
        try:
            if method not in METHODS:
                raise Invalid(f"Method not found: models/{model}:{method}", status=404)
            check_auth(recorded, self.api_key)
            body = checked_body(recorded, model)
        except Invalid as exc:
            recorded.rejected = exc.message
            return error_response(exc)
        reply = self.next_reply()
        if reply.error_status is not None:
            return scripted_error(reply)
        thoughts = wants_thoughts(body)
        if method == "generateContent":
            return json_response(whole_response(model, reply, thoughts))
        chunks = stream_chunks(model, reply, thoughts)
        if recorded.query.get("alt") != "sse":
            # Without alt=sse upstream streams one JSON array of chunks, not SSE.
            return web.json_response(chunks)
        # There is no error event in Gemini SSE: a stream that fails mid-way just ends
        # after some chunks, with no chunk carrying a finishReason. Hence no error frame.
        return await self.write_stream(request, recorded, sse_frames(chunks), reply, b"", {})

    async def _unknown_route(self, request: web.Request) -> web.Response:
        recorded = await self.record(request)
        exc = Invalid(f"Method not found: {request.method} {request.path}", status=404)
        recorded.rejected = exc.message
        return error_response(exc)


# ---------------------------------------------------------------- errors


def error_body(status: int, message: str, details: list[dict] | None = None) -> dict:
    """Google's RPC error: numeric code, message, canonical status name, optional details."""
    default = "INTERNAL" if status >= 500 else "INVALID_ARGUMENT"
    error: dict[str, Any] = {"code": status, "message": message, "status": STATUS_NAMES.get(status, default)}
    if details:
        error["details"] = details
    return {"error": error}


def error_response(exc: Invalid) -> web.Response:
    """A refusal; field errors name the field in a BadRequest detail, as upstream does."""
    details = None
    if exc.code == "API_KEY_INVALID":
        details = [
            {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID",
             "domain": "googleapis.com", "metadata": {"service": "generativelanguage.googleapis.com"}},
            {"@type": "type.googleapis.com/google.rpc.LocalizedMessage", "locale": "en-US", "message": exc.message},
        ]  # fmt: skip
    elif exc.param:
        violation = {"field": exc.param, "description": exc.message.removeprefix("* ").strip()}
        details = [{"@type": "type.googleapis.com/google.rpc.BadRequest", "fieldViolations": [violation]}]
    return json_response(error_body(exc.status, exc.message, details), status=exc.status)


def scripted_error(reply: Reply) -> web.Response:
    """The error a test asked for; a 429 tells the client when to retry, in its details."""
    status = reply.error_status or 500
    details = None
    if status == 429:
        details = [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1s"}]
    return json_response(error_body(status, reply.error_message, details), status=status)


# ---------------------------------------------------------------- responses


def thought_signature() -> str:
    """Opaque signature; on the wire it is proto bytes, so always valid base64."""
    return base64.b64encode(secrets.token_bytes(48)).decode()


def function_call_parts(model: str, reply: Reply) -> list[dict]:
    """Whole `args` objects (never fragments). Ids only when scripted: the Gemini API
    usually sends none. The first call carries the thought signature when the model
    thought, whether or not thoughts were shown (always on Gemini 3, which requires it back)."""
    parts = []
    for call in reply.tool_calls:
        function_call = {"id": call.id} if call.id else {}
        function_call.update({"name": call.name, "args": arguments_object(call)})
        parts.append({"functionCall": function_call})
    if parts and (reply.reasoning or model.startswith("gemini-3")):
        parts[0]["thoughtSignature"] = thought_signature()
    return parts


def usage_metadata(reply: Reply, output_tokens: int) -> dict:
    """promptTokenCount INCLUDES cached tokens; zero counts are left out, as upstream does."""
    prompt = reply.input_tokens + reply.cache_read_tokens
    usage: dict[str, Any] = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": output_tokens,
        "totalTokenCount": prompt + output_tokens,
    }
    if reply.cache_read_tokens:
        usage["cachedContentTokenCount"] = reply.cache_read_tokens
    usage["promptTokensDetails"] = [{"modality": "TEXT", "tokenCount": prompt}]
    return usage


def response_chunk(model: str, response_id: str, parts: list[dict], usage: dict, finish: str | None) -> dict:
    """One GenerateContentResponse. A candidate with nothing to say still has a
    `content` without `parts` (e.g. MAX_TOKENS spent thinking); a SAFETY block has none."""
    candidate: dict[str, Any] = {}
    if parts:
        candidate["content"] = {"parts": parts, "role": "model"}
    elif finish != "SAFETY":
        candidate["content"] = {"role": "model"}
    if finish:
        candidate["finishReason"] = finish
    candidate["index"] = 0
    return {"candidates": [candidate], "usageMetadata": usage, "modelVersion": model, "responseId": response_id}


def wants_thoughts(body: dict) -> bool:
    """Thought summaries come back only when the request asks for them."""
    thinking = (body.get("generationConfig") or {}).get("thinkingConfig") or {}
    return thinking.get("includeThoughts") is True


def whole_response(model: str, reply: Reply, thoughts: bool) -> dict:
    """Non-streamed answer: thought summary, text, then function calls, in one candidate."""
    parts = [{"text": reply.reasoning, "thought": True}] if reply.reasoning and thoughts else []
    parts += [{"text": reply.text}] if reply.text else []
    parts += function_call_parts(model, reply)
    usage = usage_metadata(reply, reply.output_tokens)
    return response_chunk(model, new_id("", 22), parts, usage, mapped_stop(reply, GEMINI_FINISH))


def stream_chunks(model: str, reply: Reply, thoughts: bool) -> list[dict]:
    """Thought and text deltas, then all calls in one chunk; the last chunk carries the
    finishReason, and every chunk the running usage."""
    reasoning = reply.reasoning if thoughts else ""
    pieces = [[{"text": p, "thought": True}] for p in split_text(reasoning, reply.text_chunks)]
    pieces += [[{"text": p}] for p in split_text(reply.text, reply.text_chunks)]
    calls = function_call_parts(model, reply)
    pieces += [calls] if calls else []
    pieces = pieces or [[]]
    response_id = new_id("", 22)
    chunks = []
    for index, parts in enumerate(pieces, start=1):
        last = index == len(pieces)
        usage = usage_metadata(reply, round(reply.output_tokens * index / len(pieces)))
        finish = mapped_stop(reply, GEMINI_FINISH) if last else None
        chunks.append(response_chunk(model, response_id, parts, usage, finish))
    return chunks


def sse_frames(chunks: list[dict]) -> list[Frame]:
    """`data:` lines only, CRLF line endings; the finishing chunk is the tail, so a
    scripted failure never sends a finishReason."""
    frames = []
    for index, chunk in enumerate(chunks, start=1):
        kind = "tail" if index == len(chunks) else "delta"
        frames.append(Frame(kind, sse(chunk).replace(b"\n", b"\r\n")))
    return frames


# ---------------------------------------------------------------- auth


def check_auth(recorded: RecordedRequest, api_key: str) -> None:
    """x-goog-api-key header, else ?key=. No key is a 403, a wrong one a 400 (as upstream)."""
    given = recorded.headers.get("x-goog-api-key") or recorded.query.get("key")
    if not given:
        raise Invalid(NO_KEY, status=403)
    if given != api_key:
        raise Invalid(BAD_KEY, code="API_KEY_INVALID")


# ---------------------------------------------------------------- body: helpers


def snake(name: str) -> str:
    """Proto field name of a JSON name: upstream's messages quote paths this way."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def join(parent: str, child: str) -> str:
    return f"{parent}.{child}" if parent else child


def unknown_name(name: str, at: str) -> Invalid:
    where = f" at '{at}'" if at else ""
    return Invalid(f'Invalid JSON payload received. Unknown name "{name}"{where}: Cannot find field.', param=at or name)


def check_keys(given: dict, allowed: set[str], at: str) -> None:
    for key in given:
        if key not in allowed:
            raise unknown_name(key, at)


def field_violation(path: str, message: str) -> Invalid:
    """Upstream's semantic validation message: `* GenerateContentRequest.<path>: <why>`."""
    return Invalid(f"* GenerateContentRequest.{path}: {message}\n", param=path)


def invalid_value(at: str, type_name: str, value: Any) -> Invalid:
    return Invalid(f"Invalid value at '{at}' ({type_name}), {json.dumps(value)[:80]}", param=at)


def need_object(value: Any, parent: str, name: str, type_name: str) -> dict:
    """A message (or Struct) field; a list there is 'not repeating', a scalar an invalid value."""
    if isinstance(value, dict):
        return value
    if isinstance(value, list):
        where = f" at '{parent}'" if parent else ""
        raise Invalid(
            f'Invalid JSON payload received. Unknown name "{name}"{where}: Proto field is not repeating, '
            "cannot start list.",
            param=join(parent, snake(name)),
        )
    raise invalid_value(join(parent, snake(name)), type_name, value)


def need_list(value: Any, at: str, type_name: str) -> list:
    """Repeated field. (Upstream also takes a lone object here; the canonical form is a list.)"""
    if not isinstance(value, list):
        raise invalid_value(at, type_name, value)
    return value


def need_scalar(value: Any, at: str, kind: type) -> None:
    """int / float / bool / str field with upstream's TYPE_* naming."""
    type_name = {int: "TYPE_INT32", float: "TYPE_FLOAT", bool: "TYPE_BOOL", str: "TYPE_STRING"}[kind]
    if isinstance(value, bool) != (kind is bool):
        raise invalid_value(at, type_name, value)
    valid = isinstance(value, (int, float)) if kind is float else isinstance(value, kind)
    if not valid:
        raise invalid_value(at, type_name, value)


def is_base64(data: Any) -> bool:
    """Raw (standard or URL-safe) base64; a `data:` URI prefix is not base64."""
    if not isinstance(data, str) or not data or data.startswith("data:"):
        return False
    try:
        base64.b64decode(data.replace("-", "+").replace("_", "/") + "=" * (-len(data) % 4), validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def need_bytes(value: Any, at: str) -> None:
    if not is_base64(value):
        raise Invalid(f"Invalid value at '{at}' (TYPE_BYTES), Base64 decoding failed for {json.dumps(value)[:60]}",
                      param=at)  # fmt: skip


# ---------------------------------------------------------------- body: checks


def checked_body(recorded: RecordedRequest, model: str) -> dict:
    """The request body once every rule the real endpoint enforces has passed."""
    body = recorded.body
    if body is None:
        raise Invalid("Invalid JSON payload received. Unexpected token.")
    check_keys(body, TOP_KEYS, "")
    if body.get("systemInstruction") is not None:
        check_system(body["systemInstruction"])
    check_contents(body.get("contents"), model)
    if body.get("tools") is not None:
        check_tools(body["tools"])
    if body.get("toolConfig") is not None:
        check_tool_config(body["toolConfig"])
    if body.get("generationConfig") is not None:
        check_generation_config(body["generationConfig"])
    if body.get("safetySettings") is not None:
        for index, setting in enumerate(need_list(body["safetySettings"], "safety_settings", PROTO + "SafetySetting")):
            at = f"safety_settings[{index}]"
            check_keys(need_object(setting, "safety_settings", "safetySettings", PROTO + "SafetySetting"),
                       {"category", "threshold", "method"}, at)  # fmt: skip
    if body.get("cachedContent") is not None:
        need_scalar(body["cachedContent"], "cached_content", str)
    return body


def check_system(value: Any) -> None:
    """`{parts: [{text}]}` (role optional): the system prompt is text only."""
    system = need_object(value, "", "systemInstruction", PROTO + "Content")
    check_keys(system, {"role", "parts"}, "system_instruction")
    parts = need_list(system.get("parts"), "system_instruction.parts", PROTO + "Part")
    if not parts:
        raise field_violation("system_instruction.parts", "contents.parts must not be empty.")
    for index, part in enumerate(parts):
        at = f"system_instruction.parts[{index}]"
        part = need_object(part, "system_instruction", "parts", PROTO + "Part")
        check_keys(part, {"text"}, at)
        if not part.get("text"):
            raise field_violation(f"{at}.data", "required oneof field 'data' must have one initialized field")
        need_scalar(part["text"], f"{at}.text", str)


def check_contents(contents: Any, model: str) -> None:
    if not contents:
        raise field_violation("contents", "contents is not specified")
    for index, content in enumerate(need_list(contents, "contents", PROTO + "Content")):
        check_content(content, f"contents[{index}]")
    check_function_turns(contents)
    if model.startswith("gemini-3"):
        check_thought_signatures(contents)


def check_content(value: Any, at: str) -> None:
    content = need_object(value, "", "contents", PROTO + "Content")
    check_keys(content, {"role", "parts"}, at)
    if content.get("role") not in ROLES:
        raise Invalid("Please use a valid role: user, model.")
    parts = need_list(content.get("parts", []), f"{at}.parts", PROTO + "Part")
    if not parts:
        raise field_violation(f"{at}.parts", "contents.parts must not be empty.")
    for index, part in enumerate(parts):
        check_part(part, f"{at}.parts[{index}]")


def check_part(value: Any, at: str) -> None:
    """Exactly one data field (an empty text is no data: proto3 drops it), plus the
    optional thought flag and signature."""
    part = need_object(value, at.rsplit(".", 1)[0], "parts", PROTO + "Part")
    check_keys(part, PART_KEYS, at)
    data = [key for key in PART_DATA if key in part]
    if len(data) > 1:
        raise Invalid(f"Invalid value at '{at}' (oneof), oneof field 'data' is already set. Cannot set '{data[1]}'",
                      param=at)  # fmt: skip
    if not data or (data == ["text"] and part["text"] == "" and "thoughtSignature" not in part):
        raise field_violation(f"{at}.data", "required oneof field 'data' must have one initialized field")
    PART_CHECKS[data[0]](part[data[0]], at)
    if "thought" in part:
        need_scalar(part["thought"], f"{at}.thought", bool)
    if "thoughtSignature" in part:
        need_bytes(part["thoughtSignature"], f"{at}.thought_signature")


def check_text(value: Any, at: str) -> None:
    need_scalar(value, f"{at}.text", str)


def check_inline_data(value: Any, at: str) -> None:
    """mimeType plus raw base64 `data` (no `data:` URI prefix)."""
    blob = need_object(value, at, "inlineData", PROTO + "Blob")
    check_keys(blob, {"mimeType", "data"}, f"{at}.inline_data")
    if not blob.get("mimeType"):
        raise field_violation(f"{at}.inline_data.mime_type", "mime_type must be specified")
    need_scalar(blob["mimeType"], f"{at}.inline_data.mime_type", str)
    need_bytes(blob.get("data"), f"{at}.inline_data.data")


def check_file_data(value: Any, at: str) -> None:
    data = need_object(value, at, "fileData", PROTO + "FileData")
    check_keys(data, {"mimeType", "fileUri"}, f"{at}.file_data")
    if not isinstance(data.get("fileUri"), str) or not data["fileUri"]:
        raise field_violation(f"{at}.file_data.file_uri", "file_uri must be specified")


def check_function_name(value: Any, at: str) -> None:
    if not isinstance(value, str) or not FUNCTION_NAME.match(value):
        raise field_violation(
            at,
            "[FIELD_INVALID] Invalid function name. Must start with a letter or an underscore. Must be "
            "alphameric (a-z, A-Z, 0-9), underscores (_), dots (.), colons (:), or dashes (-), with a "
            "maximum length of 128.",
        )


def check_function_call(value: Any, at: str) -> None:
    """`args` is an object (a Struct): a JSON string of arguments is refused."""
    call = need_object(value, at, "functionCall", PROTO + "FunctionCall")
    check_keys(call, {"id", "name", "args"}, f"{at}.function_call")
    check_function_name(call.get("name"), f"{at}.function_call.name")
    if "args" in call:
        need_object(call["args"], f"{at}.function_call", "args", STRUCT)


def check_function_response(value: Any, at: str) -> None:
    """`response` is an object (a Struct): wrap strings, e.g. {"result": "..."}."""
    response = need_object(value, at, "functionResponse", PROTO + "FunctionResponse")
    check_keys(response, {"id", "name", "response"}, f"{at}.function_response")
    check_function_name(response.get("name"), f"{at}.function_response.name")
    if "response" not in response:
        raise field_violation(f"{at}.function_response.response", "response must be specified")
    need_object(response["response"], f"{at}.function_response", "response", STRUCT)


PART_CHECKS = {
    "text": check_text,
    "inlineData": check_inline_data,
    "fileData": check_file_data,
    "functionCall": check_function_call,
    "functionResponse": check_function_response,
}


def parts_with(content: dict | None, kind: str) -> list[dict]:
    return [part[kind] for part in (content or {}).get("parts", []) if kind in part]


def check_function_turns(contents: list[dict]) -> None:
    """A call turn follows a user turn; a response turn answers, one for one and by
    name, the calls of the model turn right before it."""
    for index, content in enumerate(contents):
        previous = contents[index - 1] if index else None
        if parts_with(content, "functionCall") and (previous is None or previous["role"] != "user"):
            raise Invalid(
                "Please ensure that function call turn comes immediately after a user turn or after a "
                "function response turn."
            )
        responses = parts_with(content, "functionResponse")
        if not responses:
            continue
        calls = parts_with(previous, "functionCall") if previous and previous["role"] == "model" else []
        if not calls:
            raise Invalid("Please ensure that function response turn comes immediately after a function call turn.")
        if len(responses) != len(calls):
            raise Invalid(
                "Please ensure that the number of function response parts is equal to the number of "
                "function call parts of the function call turn."
            )
        asked = {call["name"] for call in calls}
        for response in responses:
            if response["name"] not in asked:
                raise Invalid(
                    f"Please ensure that function response names match the function call names of the "
                    f"function call turn: no call of '{response['name']}' in contents[{index - 1}]."
                )


def check_thought_signatures(contents: list[dict]) -> None:
    """Gemini 3: in the current turn (since the last user text), each model step that
    calls functions must echo the thoughtSignature on its first functionCall part."""
    start = 0
    for index, content in enumerate(contents):
        if content["role"] == "user" and parts_with(content, "text"):
            start = index + 1
    for index, content in enumerate(contents[start:], start=start):
        if content["role"] != "model":
            continue
        first = next((part for part in content["parts"] if "functionCall" in part), None)
        if first is not None and "thoughtSignature" not in first:
            raise Invalid(
                "Function call is missing a thought_signature in functionCall parts. This is required for "
                "tools to work correctly, and missing thought_signature may lead to degraded model "
                f"performance. Additional data, function call `default_api:{first['functionCall']['name']}` , "
                f"position {index + 1}. Please refer to {THOUGHT_SIGNATURE_DOCS} for more details."
            )


# ---- tools and config


def check_tools(value: Any) -> None:
    for index, tool in enumerate(need_list(value, "tools", PROTO + "Tool")):
        at = f"tools[{index}]"
        tool = need_object(tool, "", "tools", PROTO + "Tool")
        check_keys(tool, TOOL_KEYS, at)
        declarations = need_list(tool.get("functionDeclarations", []), f"{at}.function_declarations",
                                 PROTO + "FunctionDeclaration")  # fmt: skip
        for position, declaration in enumerate(declarations):
            check_declaration(declaration, f"{at}.function_declarations[{position}]")


def check_declaration(value: Any, at: str) -> None:
    """Name, and `parameters` as an OBJECT schema in Gemini's OpenAPI subset
    (arbitrary JSON Schema goes in `parametersJsonSchema`)."""
    declaration = need_object(value, at.rsplit(".", 1)[0], "functionDeclarations", PROTO + "FunctionDeclaration")
    check_keys(declaration, DECLARATION_KEYS, at)
    check_function_name(declaration.get("name"), f"{at}.name")
    if "parameters" in declaration:
        schema = need_object(declaration["parameters"], at, "parameters", PROTO + "Schema")
        check_schema(schema, f"{at}.parameters")
        if str(schema.get("type", "")).upper() != "OBJECT":
            raise field_violation(f"{at}.parameters.type", "parameters must be of type OBJECT")
    if "parametersJsonSchema" in declaration:
        need_object(declaration["parametersJsonSchema"], at, "parametersJsonSchema", "google.protobuf.Value")


def check_schema(schema: dict, at: str) -> None:
    """Known Schema fields only, recursively through properties, items and anyOf."""
    check_keys(schema, SCHEMA_KEYS, at)
    kind = schema.get("type")
    if isinstance(kind, list):
        raise Invalid(
            f"Invalid JSON payload received. Unknown name \"type\" at '{at}': Proto field is not repeating, "
            "cannot start list.",
            param=at,
        )
    if kind is not None and (not isinstance(kind, str) or kind.upper() not in SCHEMA_TYPES):
        raise invalid_value(f"{at}.type", PROTO + "Type", kind)
    properties = schema.get("properties") or {}
    if not isinstance(properties, dict):
        raise invalid_value(f"{at}.properties", PROTO + "Schema.PropertiesEntry", properties)
    for index, child in enumerate(properties.values()):
        check_schema(need_object(child, f"{at}.properties[{index}]", "value", PROTO + "Schema"),
                     f"{at}.properties[{index}].value")  # fmt: skip
    if "items" in schema:
        check_schema(need_object(schema["items"], at, "items", PROTO + "Schema"), f"{at}.items")
    for index, child in enumerate(need_list(schema.get("anyOf", []), f"{at}.any_of", PROTO + "Schema")):
        check_schema(need_object(child, at, "anyOf", PROTO + "Schema"), f"{at}.any_of[{index}]")


def check_tool_config(value: Any) -> None:
    """functionCallingConfig.mode is an enum: upper-case AUTO / ANY / NONE / VALIDATED."""
    config = need_object(value, "", "toolConfig", PROTO + "ToolConfig")
    check_keys(config, {"functionCallingConfig", "retrievalConfig"}, "tool_config")
    if "functionCallingConfig" not in config:
        return
    at = "tool_config.function_calling_config"
    calling = need_object(config["functionCallingConfig"], "tool_config", "functionCallingConfig",
                          PROTO + "FunctionCallingConfig")  # fmt: skip
    check_keys(calling, {"mode", "allowedFunctionNames"}, at)
    if "mode" in calling and calling["mode"] not in MODES:
        raise invalid_value(f"{at}.mode", PROTO + "FunctionCallingConfig.Mode", calling["mode"])
    for index, name in enumerate(need_list(calling.get("allowedFunctionNames", []), f"{at}.allowed_function_names",
                                           "TYPE_STRING")):  # fmt: skip
        need_scalar(name, f"{at}.allowed_function_names[{index}]", str)


def check_generation_config(value: Any) -> None:
    """Only real GenerationConfig fields, with their types and documented ranges."""
    config = need_object(value, "", "generationConfig", PROTO + "GenerationConfig")
    at = "generation_config"
    check_keys(config, GENERATION_KEYS, at)
    for name in INT_CONFIG:
        if name in config:
            need_scalar(config[name], f"{at}.{snake(name)}", int)
    for name, bounds in FLOAT_CONFIG.items():
        if name in config:
            need_scalar(config[name], f"{at}.{snake(name)}", float)
            if bounds and not bounds[0] <= config[name] <= bounds[1]:
                raise field_violation(f"{at}.{snake(name)}",
                                      f"{snake(name)} must be in the range [{bounds[0]}, {bounds[1]}]")  # fmt: skip
    if config.get("candidateCount", 1) != 1:
        raise field_violation(f"{at}.candidate_count", "the fake upstream supports only one candidate")
    stops = need_list(config.get("stopSequences", []), f"{at}.stop_sequences", "TYPE_STRING")
    for index, stop in enumerate(stops):
        need_scalar(stop, f"{at}.stop_sequences[{index}]", str)
    if len(stops) > 5:
        raise field_violation(f"{at}.stop_sequences", "the number of stop_sequences must not exceed 5")
    if "thinkingConfig" in config:
        thinking = need_object(config["thinkingConfig"], at, "thinkingConfig", PROTO + "ThinkingConfig")
        check_keys(thinking, set(THINKING_KEYS), f"{at}.thinking_config")
        for name, kind in THINKING_KEYS.items():
            if name in thinking:
                need_scalar(thinking[name], f"{at}.thinking_config.{snake(name)}", kind)
    if "responseSchema" in config:
        check_schema(need_object(config["responseSchema"], at, "responseSchema", PROTO + "Schema"),
                     f"{at}.response_schema")  # fmt: skip
