"""What every client wire format shares: field validation that names the field, and the
interface the core pipeline drives (parse -> canonical; canonical -> wire / SSE)."""
from __future__ import annotations

from typing import Any, ClassVar

import orjson
from aiohttp import web

from plugins.context import CallContext
from plugins.errors import GatewayError, bad_request
from providers.types import ChatRequest, ChatResponse, StreamEvent, ToolChoice

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json",
                        headers=headers)


async def read_json(request: web.Request) -> Any:
    """The request body as JSON; an empty or malformed body is a 400 that says so."""
    raw = await request.read()
    if not raw:
        raise bad_request("the request body is empty; send a JSON object")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}", code="invalid_json") from None


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
                maximum: int | None = None, required: bool = False) -> int | None:
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
        return value

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

    def error(self, err: GatewayError) -> bytes:
        raise NotImplementedError


def openai_error_body(err: GatewayError) -> dict[str, Any]:
    """The OpenAI error shape, used by chat completions and responses."""
    body = {"error": {"message": err.message, "type": err.type, "param": err.param, "code": err.code}}
    body.update(err.extra)
    return body
