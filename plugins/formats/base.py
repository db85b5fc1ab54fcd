"""What every client wire format shares: field validation that names the field, and the
interface the core pipeline drives (parse -> canonical; canonical -> wire / SSE)."""
from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import orjson
from aiohttp import web

from plugins.appstate import CONFIG
from plugins.context import CallContext
from plugins.errors import GatewayError, bad_request
from plugins.netguard import check_url, check_url_resolved
from providers.types import (
    ChatRequest, ChatResponse, ImagePart, StreamEvent, TextDelta, TextRun, ToolChoice, ToolResult,
)

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json",
                        headers=headers)


MAX_JSON_DEPTH = 64     # nesting deeper than this is refused; upstream bodies wrap it a few levels more


async def read_json(request: web.Request) -> Any:
    """The request body as JSON; an empty, malformed or too deeply nested body is a 400
    that says so. The whole body must arrive within the server's request deadline (408)."""
    try:
        if request.content.is_eof():        # the whole body came with the headers: nothing to wait for
            raw = await request.read()
        else:
            async with asyncio.timeout(request.app[CONFIG].server.request_timeout_seconds):
                raw = await request.read()
    except TimeoutError:
        raise GatewayError(408, "the request body did not arrive in time; send it faster or smaller",
                           code="request_timeout", headers={"Connection": "close"}) from None
    if not raw:
        raise bad_request("the request body is empty; send a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    # Only a body with that many brackets can be that deep: the walk is skipped for almost all.
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and json_depth(body) > MAX_JSON_DEPTH:
        raise bad_request(f"the request body is nested more than {MAX_JSON_DEPTH} levels deep; flatten it",
                          code="json_too_deep")
    return body


def json_depth(value: Any) -> int:
    """How deeply arrays and objects nest in a parsed JSON value (a scalar is 0)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


class Fields:
    """Typed reads from a request object; any mistake is a 400 naming the field."""

    def __init__(self, body: Any, prefix: str = ""):
        if not isinstance(body, dict):
            raise bad_request(f"{prefix or 'the request body'} must be a JSON object", param=prefix or None)
        self.body = body
        self.prefix = prefix

    def path(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

    def fail(self, name: str, what: str) -> GatewayError:
        return bad_request(f"{self.path(name)}: {what}", param=self.path(name))

    def get(self, name: str, default=None):
        return self.body.get(name, default)

    def string(self, name: str, *, required: bool = False, default: str | None = None) -> str | None:
        value = self.body.get(name)
        if value is None:
            if required:
                raise self.fail(name, "is required")
            return default
        if not isinstance(value, str) or (required and not value):
            raise self.fail(name, f"must be a non-empty string, got {_kind(value)}")
        return value

    def integer(self, name: str, *, default: int | None = None, minimum: int | None = None,
                maximum: int | None = None, required: bool = False, clamp: int | None = None) -> int | None:
        """An integer field; above `clamp` it becomes `clamp` (output caps: SPEC clamps, never refuses)."""
        value = self.body.get(name)
        if value is None:
            if required:
                raise self.fail(name, "is required")
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(name, f"must be an integer, got {_kind(value)}")
        if minimum is not None and value < minimum:
            raise self.fail(name, f"must be at least {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise self.fail(name, f"must be at most {maximum}, got {value}")
        return value if clamp is None else min(value, clamp)

    def number(self, name: str) -> float | None:
        value = self.body.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(name, f"must be a number, got {_kind(value)}")
        return float(value)

    def boolean(self, name: str, default: bool = False) -> bool:
        value = self.body.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(name, f"must be true or false, got {_kind(value)}")
        return value

    def array(self, name: str, *, required: bool = False, nonempty: bool = False) -> list:
        value = self.body.get(name)
        if value is None:
            if required:
                raise self.fail(name, "is required")
            return []
        if not isinstance(value, list):
            raise self.fail(name, f"must be an array, got {_kind(value)}")
        if nonempty and not value:
            raise self.fail(name, "must not be empty")
        return value

    def stop_list(self, name: str) -> list[str]:
        value = self.body.get(name)
        if value is None:
            return []
        if isinstance(value, str):
            return [value]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
        raise self.fail(name, "must be a string or an array of strings")


def client_image(url: Any, field: str, detail: str | None = None) -> ImagePart:
    """An image a client gave by URL: https or data: only, never a local address (400
    naming the field). `check_image_hosts` finishes the check once the names resolve."""
    if not isinstance(url, str) or not url.startswith(("https://", "data:")):
        raise bad_request(f"{field}: must be an https URL or a data: URL", param=field)
    check_url(url, field, allow_private=False)
    return ImagePart(url, detail, field)


async def check_image_hosts(req: ChatRequest) -> None:
    """Refuse image URLs whose host resolves to a non-global address (400 naming the field)."""
    for m in req.messages:
        for p in m.parts:
            inner = p.content if isinstance(p, ToolResult) and isinstance(p.content, list) else (p,)
            for q in inner:
                if isinstance(q, ImagePart) and q.field and not q.is_data:
                    await check_url_resolved(q.url, q.field, allow_private=False)


def parallel_flag(f: Fields) -> bool | None:
    """`parallel_tool_calls`, checked: None when absent."""
    parallel = f.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise f.fail("parallel_tool_calls", "must be true or false")
    return parallel


def named_tool(f: Fields, param: str, name, tools: list, parallel: bool | None) -> ToolChoice:
    """A tool_choice that names one tool, which must be among the request's tools."""
    if name not in {t.name for t in tools}:
        raise f.fail(param, f"names tool {name!r}, which is not in tools")
    return ToolChoice("tool", name, parallel)


def _kind(value) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


class ClientFormat:
    """A client wire format. The core calls: parse, then render or stream_writer, and
    error_response for any GatewayError."""

    name: ClassVar[str]
    path: ClassVar[str]                 # POST route
    endpoint: ClassVar[str]             # short name recorded with usage
    key_required: ClassVar[bool] = False
    max_input_chars: ClassVar[int] = 200_000
    pass_headers: ClassVar[tuple[str, ...]] = ()   # client headers a same-format upstream gets
    accepts_x402: ClassVar[bool] = False           # keyless callers may pay per call
    allows_smart: ClassVar[bool] = True            # svc/smart may route its calls

    def parse(self, body: Any) -> ChatRequest:
        raise NotImplementedError

    def resolve_model(self, model_id: str, cfg) -> str:
        """Map the id a client of this format sent to a catalog id (aliases, dated ids)."""
        return model_id

    def render(self, resp: ChatResponse, ctx: CallContext) -> dict[str, Any]:
        raise NotImplementedError

    def stream_writer(self, ctx: CallContext) -> "StreamWriter":
        raise NotImplementedError

    def error_body(self, err: GatewayError) -> dict[str, Any]:
        raise NotImplementedError

    def error_response(self, err: GatewayError, request_id: str | None = None) -> web.Response:
        body = err.body if err.body is not None else self.error_body(err)
        return json_response(body, status=err.status, headers=err.headers)


class StreamWriter:
    """Renders canonical stream events as this format's SSE bytes, keeping its own state.
    `event` returns b"" for events with nothing to send."""

    def event(self, ev: StreamEvent) -> bytes:
        raise NotImplementedError

    def texts(self, run: TextRun) -> bytes:
        """A TextRun: the bytes of a TextDelta of each of its texts (a writer may do it cheaper)."""
        return b"".join([self.event(TextDelta(text)) for text in run.texts])

    def error(self, err: GatewayError) -> bytes:
        raise NotImplementedError


def openai_error_body(err: GatewayError) -> dict[str, Any]:
    """The OpenAI error shape, used by chat completions and responses."""
    body = {"error": {"message": err.message, "type": err.type, "param": err.param, "code": err.code}}
    body.update(err.extra)
    return body
