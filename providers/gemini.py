"""Google Gemini API: generateContent, and streamGenerateContent with `alt=sse`; images
and Veo videos in providers/gemini_media.py.

Settings: base_url (default https://generativelanguage.googleapis.com), api_key,
timeout_seconds, poll_seconds (Veo renders). Roles are user/model only; the system
prompt is `systemInstruction`; tool results are `functionResponse` parts that name the
function and carry an object.

Gemini 3 refuses a conversation whose function calls lost their `thoughtSignature`.
Chat completions has no field for it, so the signature rides inside the tool-call id
(`gts_<signature>~<n>`), which every client format already sends back unchanged.
"""
from __future__ import annotations

import mimetypes
from typing import Any, AsyncIterator

import orjson

from .base import HTTPProvider, HTTPSettings, UpstreamError, loads_event
from .media_base import QueueProvider, QueueSettings
from .types import (
    CONTENT_FILTER, END, MAX_TOKENS, TOOL_USE, ChatRequest, ChatResponse, ImagePart, Message, ReasoningDelta,
    ReasoningPart, StreamEnd, StreamEvent, StreamStart, TextDelta, TextPart, ToolCall, ToolCallDelta, ToolCallStart,
    ToolResult, Usage,
)

FINISH = {"STOP": END, "MAX_TOKENS": MAX_TOKENS, "SAFETY": CONTENT_FILTER, "RECITATION": CONTENT_FILTER,
          "BLOCKLIST": CONTENT_FILTER, "PROHIBITED_CONTENT": CONTENT_FILTER, "SPII": CONTENT_FILTER,
          "IMAGE_SAFETY": CONTENT_FILTER, "IMAGE_PROHIBITED_CONTENT": CONTENT_FILTER,
          "IMAGE_RECITATION": CONTENT_FILTER, "LANGUAGE": CONTENT_FILTER, "UNEXPECTED_TOOL_CALL": TOOL_USE,
          "OTHER": END}
FAILED_FINISH = {"MALFORMED_FUNCTION_CALL", "MISSING_THOUGHT_SIGNATURE", "TOO_MANY_TOOL_CALLS"}
MODES = {"auto": "AUTO", "none": "NONE", "required": "ANY", "tool": "ANY"}
SCHEMA_KEYS_REFUSED = ("$schema", "additionalProperties", "strict")
SIGNED = "gts_"


def call_id(signature: str | None, n: int, given: str | None) -> str:
    if signature:
        return f"{SIGNED}{signature}~{n}"
    return given or f"call_gemini_{n}"


def signature_of(call: ToolCall) -> str | None:
    if call.id.startswith(SIGNED) and "~" in call.id:
        return call.id[len(SIGNED):].rsplit("~", 1)[0]
    return None


def clean_schema(node: Any) -> Any:
    """Gemini's schema dialect refuses a few JSON-schema keywords; drop them."""
    if isinstance(node, dict):
        return {k: clean_schema(v) for k, v in node.items() if k not in SCHEMA_KEYS_REFUSED}
    if isinstance(node, list):
        return [clean_schema(v) for v in node]
    return node


def _image(p: ImagePart) -> dict[str, Any]:
    if p.is_data:
        mime, data = p.split_data_url()
        return {"inlineData": {"mimeType": mime, "data": data}}
    return {"fileData": {"mimeType": mimetypes.guess_type(p.url.split("?", 1)[0])[0] or "image/jpeg",
                         "fileUri": p.url}}


def _args(call: ToolCall) -> dict[str, Any]:
    if call.kind == "custom":
        return {"input": call.arguments}
    try:
        value = orjson.loads(call.arguments or "{}")
    except orjson.JSONDecodeError:
        return {"input": call.arguments}
    return value if isinstance(value, dict) else {"value": value}


def to_contents(messages: list[Message]) -> tuple[dict | None, list[dict[str, Any]]]:
    names = {p.id: p.name for m in messages for p in m.parts if isinstance(p, ToolCall)}
    system = [{"text": m.text()} for m in messages if m.role == "system" and m.text()]
    contents: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "system":
            continue
        parts: list[dict[str, Any]] = []
        for p in m.parts:
            if isinstance(p, TextPart) and p.text:
                parts.append({"text": p.text})
            elif isinstance(p, ImagePart):
                parts.append(_image(p))
            elif isinstance(p, ToolCall):
                part: dict[str, Any] = {"functionCall": {"name": p.name, "args": _args(p)}}
                if signature_of(p):
                    part["thoughtSignature"] = signature_of(p)
                parts.append(part)
            elif isinstance(p, ToolResult):
                parts.append({"functionResponse": {"name": p.name or names.get(p.call_id, "tool"),
                                                   "response": {"result": p.text()}}})
        if not parts:
            continue
        role = "model" if m.role == "assistant" else "user"
        if contents and contents[-1]["role"] == role:
            contents[-1]["parts"].extend(parts)
        else:
            contents.append({"role": role, "parts": parts})
    return ({"parts": system} if system else None), contents


def usage_from_gemini(u: dict[str, Any] | None) -> Usage | None:
    if not u:
        return None
    thoughts = int(u.get("thoughtsTokenCount") or 0)
    return Usage(input_tokens=int(u.get("promptTokenCount") or 0) + int(u.get("toolUsePromptTokenCount") or 0),
                 output_tokens=int(u.get("candidatesTokenCount") or 0) + thoughts,
                 cache_read_tokens=int(u.get("cachedContentTokenCount") or 0), reasoning_tokens=thoughts)


class GeminiSettings(HTTPSettings, QueueSettings):
    pass


class GeminiProvider(HTTPProvider, QueueProvider):
    """Chat here; images and videos through the media provider's transport (the key only
    on the API's origin, polling), translated in providers/gemini_media.py."""
    type_name = "gemini"
    wire_format = "gemini"
    default_base_url = "https://generativelanguage.googleapis.com"
    Settings = GeminiSettings
    wants_reference_files = True      # reference images and start frames go inline, as bytes

    def headers(self) -> dict[str, str]:
        return {"x-goog-api-key": self.api_key}

    auth = headers

    def error_status(self, status: int, body: Any) -> int:
        """Google answers a bad API key with 400 INVALID_ARGUMENT, reason API_KEY_INVALID."""
        error = body.get("error") if isinstance(body, dict) else None
        details = error.get("details") if isinstance(error, dict) else None
        invalid_key = any(isinstance(d, dict) and d.get("reason") == "API_KEY_INVALID" for d in details or [])
        return 401 if status == 400 and invalid_key else status

    async def generate_images(self, job, model):
        from .gemini_media import generate_images
        return await generate_images(self, job, model)

    async def render_video(self, job, model):
        from .gemini_media import render_video
        return await render_video(self, job, model)

    def url(self, req: ChatRequest, upstream: str) -> str:
        action = "streamGenerateContent?alt=sse" if req.stream else "generateContent"
        return f"{self.base_url}/v1beta/models/{upstream}:{action}"

    def build_request(self, req: ChatRequest, upstream: str) -> dict[str, Any]:
        system, contents = to_contents(req.messages)
        body: dict[str, Any] = {"contents": contents}
        if system:
            body["systemInstruction"] = system
        if req.tools:
            body["tools"] = [{"functionDeclarations": [self._declaration(t) for t in req.tools]}]
            if req.tool_choice is not None:
                config: dict[str, Any] = {"mode": MODES[req.tool_choice.mode]}
                if req.tool_choice.mode == "tool":
                    config["allowedFunctionNames"] = [req.tool_choice.name]
                body["toolConfig"] = {"functionCallingConfig": config}
        generation: dict[str, Any] = {"maxOutputTokens": req.max_tokens}
        if req.temperature is not None:
            generation["temperature"] = req.temperature
        if req.top_p is not None:
            generation["topP"] = req.top_p
        if req.stop:
            generation["stopSequences"] = req.stop
        if req.reasoning and req.reasoning.get("budget_tokens"):
            generation["thinkingConfig"] = {"thinkingBudget": int(req.reasoning["budget_tokens"])}
        body["generationConfig"] = generation
        return body

    @staticmethod
    def _declaration(t) -> dict[str, Any]:
        decl: dict[str, Any] = {"name": t.name}
        if t.description:
            decl["description"] = t.description
        if t.kind == "custom":
            decl["parameters"] = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}
        elif t.parameters and t.parameters.get("properties"):
            decl["parameters"] = clean_schema(t.parameters)
        return decl

    def _parts(self, parts: list[dict[str, Any]], custom: set[str], start: int) -> list:
        out: list = []
        for p in parts:
            if "functionCall" in p:
                fc = p["functionCall"]
                args = fc.get("args") or {}
                n = start + sum(isinstance(x, ToolCall) for x in out)
                if fc.get("name") in custom:
                    out.append(ToolCall(call_id(p.get("thoughtSignature"), n, fc.get("id")), fc["name"],
                                        str(args.get("input", "")), "custom"))
                else:
                    out.append(ToolCall(call_id(p.get("thoughtSignature"), n, fc.get("id")), fc.get("name", ""),
                                        orjson.dumps(args).decode()))
            elif p.get("thought") and "text" in p:
                out.append(ReasoningPart(text=p["text"]))
            elif "text" in p:
                out.append(TextPart(p["text"]))
        return out

    def _stop(self, finish: str | None, calls: bool) -> str:
        if finish in FAILED_FINISH:
            raise UpstreamError(502, f"{self.name} could not finish the answer ({finish})")
        stop = FINISH.get(finish or "STOP", END)
        return TOOL_USE if calls and stop == END else stop

    def parse_response(self, body: dict[str, Any], req: ChatRequest) -> ChatResponse:
        custom = {t.name for t in req.tools if t.kind == "custom"}
        candidates = body.get("candidates") or []
        if not candidates:
            blocked = (body.get("promptFeedback") or {}).get("blockReason")
            if not blocked:
                raise UpstreamError(502, f"{self.name} answered without candidates")
            return ChatResponse(id=body.get("responseId", ""), model=body.get("modelVersion", ""), content=[],
                                stop_reason=CONTENT_FILTER, usage=usage_from_gemini(body.get("usageMetadata")))
        cand = candidates[0]
        content = self._parts((cand.get("content") or {}).get("parts") or [], custom, 0)
        calls = any(isinstance(p, ToolCall) for p in content)
        return ChatResponse(id=body.get("responseId", ""), model=body.get("modelVersion", ""), content=content,
                            stop_reason=self._stop(cand.get("finishReason"), calls),
                            usage=usage_from_gemini(body.get("usageMetadata")), raw=body, raw_format=self.wire_format)

    async def parse_stream(self, events, req: ChatRequest) -> AsyncIterator[StreamEvent]:
        custom = {t.name for t in req.tools if t.kind == "custom"}
        started, calls, usage, finish = False, 0, None, None
        async for _, data in events:
            chunk = loads_event(self.name, data)
            if "error" in chunk:
                raise UpstreamError(502, f"{self.name} failed mid-stream: {(chunk['error'] or {}).get('message')}")
            if not started:
                started = True
                yield StreamStart(id=chunk.get("responseId", ""), model=chunk.get("modelVersion", ""))
            usage = usage_from_gemini(chunk.get("usageMetadata")) or usage
            for cand in chunk.get("candidates") or []:
                for part in self._parts((cand.get("content") or {}).get("parts") or [], custom, calls):
                    if isinstance(part, TextPart):
                        yield TextDelta(part.text)
                    elif isinstance(part, ReasoningPart):
                        yield ReasoningDelta(text=part.text)
                    else:                      # Gemini sends each call whole, never in fragments
                        yield ToolCallStart(calls, part.id, part.name, part.kind)
                        yield ToolCallDelta(calls, part.arguments)
                        calls += 1
                finish = cand.get("finishReason") or finish
        if finish is None:   # Gemini has no error event: a stream cut short just stops
            raise UpstreamError(502, f"{self.name} ended the stream before finishing")
        yield StreamEnd(stop_reason=self._stop(finish, calls > 0), usage=usage)
