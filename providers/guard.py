"""What every remote provider does to survive a hostile or broken upstream, once.

- Deadlines: a total one per call, a first-byte one for streams (time to the response
  headers and to the first event), an idle one (the longest silence between reads), and
  a connect one. Plain provider settings, with defaults sane for chat and media alike.
- A cap on what is read: the whole body of a JSON answer, and each SSE event.
- A malformed answer (wrong types, missing fields) is the upstream's fault: 502, never a
  500 and never charged.
- Error text from an upstream is relayed only after removing the provider's configured
  secrets and anything shaped like a credential; the operator's log gets it with only
  the configured secrets masked.
"""
from __future__ import annotations

import asyncio
import contextlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import aiohttp
import structlog

from plugins.errors import GatewayError

from .types import STOP_REASONS, ReasoningPart, TextPart, ToolCall

if TYPE_CHECKING:
    from .base import RemoteProvider


class UpstreamError(GatewayError):
    """The upstream failed or refused. Never charged."""
    from_upstream = True

    def __init__(self, status: int, message: str, *, code: str = "upstream_error",
                 retry_after: str | None = None):
        headers = {"Retry-After": retry_after} if retry_after else None
        super().__init__(status, message, code=code, headers=headers)


log = structlog.get_logger("upstream")

MB = 1_000_000
# Plain provider settings, their defaults, and what they bound.
LIMIT_SETTINGS = {
    "total_timeout_seconds": 600.0,       # a whole call, connect to last byte
    "first_byte_timeout_seconds": 120.0,  # a stream: to the response headers, and to its first event
    "idle_timeout_seconds": 60.0,         # the longest silence while reading an answer
    "connect_timeout_seconds": 10.0,
    "max_response_mb": 32.0,              # a JSON answer (or error body)
    "max_event_mb": 8.0,                  # one SSE event
}


@dataclass(slots=True, frozen=True)
class UpstreamLimits:
    total: float = LIMIT_SETTINGS["total_timeout_seconds"]
    first_byte: float = LIMIT_SETTINGS["first_byte_timeout_seconds"]
    idle: float = LIMIT_SETTINGS["idle_timeout_seconds"]
    connect: float = LIMIT_SETTINGS["connect_timeout_seconds"]
    max_response_bytes: int = int(LIMIT_SETTINGS["max_response_mb"] * MB)
    max_event_bytes: int = int(LIMIT_SETTINGS["max_event_mb"] * MB)

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> "UpstreamLimits":
        """From a provider's settings; `timeout_seconds` (older name) sets the idle deadline."""
        value = {name: float(settings.get(name, default)) for name, default in LIMIT_SETTINGS.items()}
        if "timeout_seconds" in settings and "idle_timeout_seconds" not in settings:
            value["idle_timeout_seconds"] = float(settings["timeout_seconds"])
        return cls(value["total_timeout_seconds"], value["first_byte_timeout_seconds"],
                   value["idle_timeout_seconds"], value["connect_timeout_seconds"],
                   int(value["max_response_mb"] * MB), int(value["max_event_mb"] * MB))

    def client_timeout(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=self.total, sock_connect=self.connect)


async def read_capped(provider: "RemoteProvider", resp: aiohttp.ClientResponse, max_bytes: int | None = None) -> bytes:
    """The whole body, read with the idle deadline between reads and the size cap (the
    provider's `max_response_mb`, or `max_bytes` for a file such as a rendered video)."""
    limits = provider.limits
    cap = max_bytes or limits.max_response_bytes
    declared = resp.content_length
    if declared is not None and declared > cap:
        raise _too_large(provider, cap)
    if resp.content.is_eof():              # the whole body is here already: no read can stall
        body = await resp.content.read()
        if len(body) > cap:
            raise _too_large(provider, cap)
        return body
    chunks, size = [], 0
    try:
        while True:
            async with asyncio.timeout(limits.idle):
                chunk = await resp.content.readany()
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > cap:
                raise _too_large(provider, cap)
            chunks.append(chunk)
    except asyncio.TimeoutError:
        raise UpstreamError(502, f"{provider.name} stopped answering mid-response",
                            code="upstream_timeout") from None


def _too_large(provider, cap: int):
    return UpstreamError(502, f"{provider.name} answered with more than {cap / MB:g} MB; "
                              "the answer was dropped and nothing was charged", code="upstream_too_large")


MALFORMED = (KeyError, TypeError, ValueError, AttributeError, IndexError, UnicodeError, OverflowError)


@contextlib.contextmanager
def answer_shape(provider: "RemoteProvider"):
    """Around parsing an upstream's answer: a wrong shape is a 502 (uncharged), and an
    upstream error's text leaves scrubbed."""
    try:
        yield
    except UpstreamError as err:
        err.message = provider.scrub(err.message)
        raise
    except MALFORMED as exc:
        log.warning("upstream_malformed", provider=provider.name, error=repr(exc)[:300])
        raise UpstreamError(502, f"{provider.name} answered in a shape the gateway does not understand; "
                                 "nothing was charged", code="upstream_malformed") from None


MAX_COUNT = 2 ** 53      # token counts beyond this are nonsense (and break JSON numbers)


def _text(value, optional: bool = False) -> None:
    if not (isinstance(value, str) or (optional and value is None)):
        raise TypeError(f"expected text, got {type(value).__name__}")


def check_usage(usage) -> None:
    if usage is None:
        return
    for name in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens"):
        value = getattr(usage, name)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_COUNT:
            raise TypeError(f"usage.{name} is not a token count: {value!r}")


def check_response(resp):
    """The canonical answer a parser built, checked field by field: a parser that read a
    malformed body without noticing still cannot hand the formats or billing nonsense."""
    _text(resp.id)
    _text(resp.model)
    _text(resp.stop_sequence, optional=True)
    if resp.stop_reason not in STOP_REASONS:
        raise ValueError(f"stop reason {resp.stop_reason!r}")
    for part in resp.content:
        if isinstance(part, TextPart):
            _text(part.text)
        elif isinstance(part, ToolCall):
            for value in (part.id, part.name, part.arguments):
                _text(value)
        elif isinstance(part, ReasoningPart):
            _text(part.text)
            _text(part.signature, optional=True)
            _text(part.redacted, optional=True)
    check_usage(resp.usage)
    return resp


def check_files(files) -> list:
    """Media results: each a URL (text) or bytes."""
    for f in files:
        if not (isinstance(f.url, str) or isinstance(f.data, bytes)) or not isinstance(f.content_type, str):
            raise TypeError("a result without a URL or data")
    return files


# Credential shapes: an Authorization-style scheme and token, and common key prefixes.
_TOKEN_SHAPES = re.compile(
    r"(?i)\b(bearer|basic|key|token)(\s+|=|:\s*)(?=[^\s\d]*\d)[A-Za-z0-9._~+/=:-]{8,}"
    r"|\b(?:sk|rk|pk|r8|xai|gsk|chk)[-_][A-Za-z0-9._-]{8,}"
    r"|\bAIza[0-9A-Za-z_-]{20,}"
    r"|\beyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]*")
_SECRET_NAME = re.compile(r"(?i)(secret|key|password|token|credential)")


def scrubber(provider: str, settings: dict[str, Any]) -> Callable[..., str]:
    """-> scrub(text, status=None): the text with this provider's configured secrets and
    anything credential-shaped replaced by [redacted]. When something was removed, or
    for an HTTP error status, the operator's log gets the text (configured secrets masked)."""
    secrets = sorted({str(v) for k, v in settings.items()
                      if _SECRET_NAME.search(str(k)) and isinstance(v, str) and len(v) >= 4}, key=len, reverse=True)

    def mask(text: str) -> str:
        for secret in secrets:
            text = text.replace(secret, "[redacted]")
        return text

    def scrub(text: str, status: int | None = None) -> str:
        masked = mask(text)
        clean = _TOKEN_SHAPES.sub(lambda m: (m.group(1) + m.group(2) if m.group(1) else "") + "[redacted]", masked)
        if clean != text or status is not None:
            log.warning("upstream_error_text", provider=provider, status=status, text=masked[:2000])
        return clean

    return scrub
