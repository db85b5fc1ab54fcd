"""Moderation: refuse a request before any upstream call or any hold, with 422.

Why 422 and not 400 or 403: the request is well formed and the caller is allowed to make
it; its content is what the service will not process. The body names the category
(`error.code` = moderation_flagged, `error.param` = the category). Nothing is charged.

`moderation.rules`: categories with regular expressions, checked locally.
`moderation.provider`: optionally an OpenAI-shape moderation API
({provider: <an openai-type provider name>, model: omni-moderation-latest}); when it cannot
be reached the call goes ahead unless `moderation.fail_closed: true`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import aiohttp
import orjson
import structlog
from aiohttp import web

from pydantic import Field, field_validator

from config.schema import Section

from . import hookimpl
from .appstate import HTTP, PROVIDERS
from .context import CallContext
from .errors import GatewayError
from .metrics.instruments import MODERATION_REFUSALS

MODERATION = web.AppKey("moderation", object)
log = structlog.get_logger("moderation")


@dataclass
class Moderation:
    rules: list[tuple[str, re.Pattern]] = field(default_factory=list)
    provider: str | None = None
    model: str = "omni-moderation-latest"
    fail_closed: bool = False


class RuleSection(Section):
    category: str = Field(min_length=1)
    patterns: list[str] = []

    @field_validator("patterns")
    @classmethod
    def _compile(cls, patterns: list[str]) -> list[str]:
        for j, pattern in enumerate(patterns):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"[{j}]: not a regular expression ({exc})") from None
        return patterns


class UpstreamSection(Section):
    provider: str                        # an openai-type provider under providers
    model: str = "omni-moderation-latest"


class ModerationSection(Section):
    """`moderation:` in the YAML."""
    rules: list[RuleSection] = []
    provider: UpstreamSection | None = None
    fail_closed: bool = False

    def references(self, known):
        if self.provider and self.provider.provider not in known.providers:
            yield "provider.provider", f"no provider named {self.provider.provider!r} under providers"


@hookimpl
def gateway_register_settings(register):
    register("moderation", ModerationSection)


@hookimpl
def gateway_configure(app, config):
    raw: ModerationSection = config.settings("moderation")
    app[MODERATION] = Moderation(
        rules=[(rule.category, re.compile(p)) for rule in raw.rules for p in rule.patterns],
        provider=raw.provider.provider if raw.provider else None,
        model=raw.provider.model if raw.provider else "omni-moderation-latest", fail_closed=raw.fail_closed)


def texts(ctx: CallContext) -> str:
    """What the caller wrote: every message's text, or the media prompt."""
    if ctx.chat is not None:
        return "\n".join(m.text() for m in ctx.chat.messages)
    return ctx.prompt


def flagged(category: str, how: str) -> GatewayError:
    MODERATION_REFUSALS[how].inc()
    return GatewayError(422, f"the request was refused by moderation (category: {category}); it was not "
                             f"processed and nothing was charged", code="moderation_flagged", param=category,
                        extra={"moderation": {"category": category, "by": how}})


@hookimpl
def gateway_moderate(ctx: CallContext):
    """The rules at once; the provider's check, when there is one, as a coroutine."""
    mod: Moderation = ctx.app[MODERATION]
    if not mod.rules and not mod.provider:
        return None
    text = texts(ctx)
    for category, pattern in mod.rules:
        if pattern.search(text):
            raise flagged(category, "rules")
    return _check_upstream(ctx, mod, text) if mod.provider else None


async def _check_upstream(ctx: CallContext, mod: Moderation, text: str) -> None:
    category = await _ask_upstream(ctx, mod, text)
    if category:
        raise flagged(category, "provider")


async def _ask_upstream(ctx: CallContext, mod: Moderation, text: str) -> str | None:
    provider = ctx.app[PROVIDERS][mod.provider]
    try:
        async with ctx.app[HTTP].post(
                f"{provider.base_url}/moderations", data=orjson.dumps({"model": mod.model, "input": text[:100_000]}),
                headers={"Content-Type": "application/json", **provider.headers()},
                timeout=aiohttp.ClientTimeout(total=10)) as resp:
            body = orjson.loads(await resp.read())
            if resp.status != 200:
                raise ValueError(f"HTTP {resp.status}")
        result = (body.get("results") or [{}])[0]
        if not result.get("flagged"):
            return None
        return next((name for name, hit in (result.get("categories") or {}).items() if hit), "flagged")
    except (aiohttp.ClientError, TimeoutError, ValueError, orjson.JSONDecodeError) as exc:
        log.warning("moderation_unavailable", error=str(exc))
        if mod.fail_closed:
            raise GatewayError(503, "moderation is unavailable and this gateway refuses unchecked requests; "
                                    "try again", code="moderation_unavailable") from None
        return None
