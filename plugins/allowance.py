"""The daily free allowance and svc/free.

Every account with a key gets `free.daily_allowance_usd` each UTC day. Eligible calls use
it before credits: models in `free.models` fully; models in `free.frontier.models` for
their input plus output up to `free.frontier.output_cap` tokens (output beyond the cap is
charged); media models within their `free_tier`. svc/smart never uses it. The allowance
is held at reserve time in the same transaction as the credits, so two calls at once can
never both spend the last of it.

svc/free answers with the day's featured model: `free.featured[days since epoch % n]`,
rotating at midnight UTC.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from aiohttp import web
from pydantic import Field

from config import usd
from config.schema import USD, Section

from . import hookimpl
from .appstate import CLOCK, STORE, now  # noqa: F401 - CLOCK: tests install their clock under it
from .context import CallContext
from .errors import bad_request
from .pricing import token_cost
from .routing import route_to
from .storage import FreeAsk

FREE = web.AppKey("free", object)
FREE_ID, SMART_ID = "svc/free", "svc/smart"


@dataclass
class FreeSettings:
    daily_micro: int = 0
    models: set[str] = field(default_factory=set)
    frontier: set[str] = field(default_factory=set)
    output_cap: int = 0
    featured: list[str] = field(default_factory=list)


def today(app) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(now(app)))


class FrontierSection(Section):
    models: list[str] = []
    output_cap: int = Field(0, ge=0)       # output tokens the allowance covers on these models


class FreeSection(Section):
    """`free:` in the YAML."""
    daily_allowance_usd: USD = 0
    models: list[str] = []
    frontier: FrontierSection = FrontierSection()
    featured: list[str] = []

    def references(self, known):
        for key, ids in (("models", self.models), ("frontier.models", self.frontier.models),
                         ("featured", self.featured)):
            for i, model_id in enumerate(ids):
                yield from known.chat_model(f"{key}[{i}]", model_id)


@hookimpl
def gateway_register_settings(register):
    register("free", FreeSection)


@hookimpl
def gateway_configure(app, config):
    free: FreeSection = config.settings("free")
    app[FREE] = FreeSettings(daily_micro=free.daily_allowance_usd, models=set(free.models),
                             frontier=set(free.frontier.models), output_cap=free.frontier.output_cap,
                             featured=list(free.featured))


def featured_today(app) -> str | None:
    featured = app[FREE].featured
    return featured[int(now(app) // 86400) % len(featured)] if featured else None


def eligible(ctx: CallContext, input_tokens: int, output_tokens: int) -> int:
    """The part of a call's price the allowance may cover (micro-USD)."""
    settings: FreeSettings = ctx.app[FREE]
    if not settings.daily_micro or ctx.principal is None or ctx.route is None or \
            ctx.route.requested_model == SMART_ID or ctx.format.name == "messages":
        return 0                  # svc/smart and /messages (SPEC: credits only) never use it
    model = ctx.route.model
    if ctx.chat is not None:
        if model.id in settings.models:
            return token_cost(model, input_tokens, output_tokens)
        if model.id in settings.frontier:
            return token_cost(model, input_tokens, min(output_tokens, settings.output_cap))
        return 0
    tier = getattr(model, "free_tier", None)
    return ctx.pricer.free_part(tier) if tier else 0


def ask(ctx: CallContext, input_tokens: int, output_cap: int) -> FreeAsk | None:
    want = eligible(ctx, input_tokens, output_cap)
    if not want:
        return None
    app = ctx.app
    return FreeAsk(day=today(app), want=want, daily=app[FREE].daily_micro)


async def left(app, account_id: int) -> int:
    return max(0, app[FREE].daily_micro - await app[STORE].allowance.used(account_id, today(app)))


@hookimpl
async def gateway_account_info(app, principal):
    return {"free_allowance_left_usd": usd(await left(app, principal.account_id)),
            "free_allowance_daily_usd": usd(app[FREE].daily_micro)}


@hookimpl(tryfirst=True)
def gateway_select_route(ctx: CallContext):
    if ctx.chat is None or ctx.model_id != FREE_ID:
        return None
    model = featured_today(ctx.app)
    if model is None:
        raise bad_request("svc/free is not configured on this gateway", param="model")
    route = route_to(ctx, model, requested=FREE_ID)
    route.notes.append(f"svc/free is {model} today (UTC)")
    return route
