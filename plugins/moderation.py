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

from config import ConfigError

from . import hookimpl
from .appstate import HTTP, PROVIDERS
from .context import CallContext
from .errors import GatewayError

MODERATION = web.AppKey("moderation", object)
log = structlog.get_logger("moderation")


@dataclass
class Moderation:
    rules: list[tuple[str, re.Pattern]] = field(default_factory=list)
    provider: str | None = None
    model: str = "omni-moderation-latest"
    fail_closed: bool = False


@hookimpl
def gateway_configure(app, config):
    raw = config.section("moderation")
    mod, problems = Moderation(), []
    for i, rule in enumerate(raw.get("rules") or []):
        category = rule.get("category") if isinstance(rule, dict) else None
        if not category:
            problems.append(f"moderation.rules[{i}].category: required")
            continue
        for j, pattern in enumerate(rule.get("patterns") or []):
            try:
                mod.rules.append((str(category), re.compile(pattern)))
            except re.error as exc:
                problems.append(f"moderation.rules[{i}].patterns[{j}]: not a regular expression ({exc})")
    upstream = raw.get("provider")
    if isinstance(upstream, dict):
        mod.provider, mod.model = upstream.get("provider") or upstream.get("type"), upstream.get("model", mod.model)
        if mod.provider not in config.providers:
            problems.append(f"moderation.provider.provider: no provider named {mod.provider!r}")
    mod.fail_closed = bool(raw.get("fail_closed", False))
    if problems:
        raise ConfigError([f"{config.path}: {p}" for p in problems])
    app[MODERATION] = mod


def texts(ctx: CallContext) -> str:
    """What the caller wrote: every message's text, or the media prompt."""
    if ctx.chat is not None:
        return "\n".join(m.text() for m in ctx.chat.messages)
    return ctx.prompt


def flagged(category: str, how: str) -> GatewayError:
    return GatewayError(422, f"the request was refused by moderation (category: {category}); it was not "
                             f"processed and nothing was charged", code="moderation_flagged", param=category,
                        extra={"moderation": {"category": category, "by": how}})


@hookimpl
async def gateway_moderate(ctx: CallContext):
    mod: Moderation = ctx.request.app[MODERATION]
    if not mod.rules and not mod.provider:
        return
    text = texts(ctx)
    for category, pattern in mod.rules:
        if pattern.search(text):
            raise flagged(category, "rules")
    if mod.provider:
        category = await _ask_upstream(ctx, mod, text)
        if category:
            raise flagged(category, "provider")


async def _ask_upstream(ctx: CallContext, mod: Moderation, text: str) -> str | None:
    provider = ctx.request.app[PROVIDERS][mod.provider]
    try:
        async with ctx.request.app[HTTP].post(
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
