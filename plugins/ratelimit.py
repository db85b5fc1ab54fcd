"""Rate limits (429) per API key, and per client address for keyless calls.

`limits.per_key` / `limits.per_address` take `rpm` and `tpm`:
- `rpm`: at most that many requests in any 60 seconds (a sliding window, so a burst of
  200 calls against `rpm: 50` admits exactly 50, however long the burst takes);
- `tpm`: a token bucket holding a minute's worth and refilling continuously; a call takes
  its input estimate plus its output cap and gets back what it did not use.

Admission checks and takes both at once, all or nothing, so concurrent calls can never
overshoot and a refused call takes nothing. Where they live is a `LimitStore`
(plugins/limitstores.py): in process by default, or in Redis with `redis:` (one Lua script
per admission: one round trip, atomic across every gateway process; the tokens given back
ride on the key's next admission).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from aiohttp import web

from config.schema import Count, Section

from . import hookimpl
from .context import CallContext
from .errors import GatewayError
from .limitstores import Bucket, LimitStore, MemoryLimits, RedisLimits
from .metrics.instruments import RATE_LIMITED
from .pricing import input_estimate
from .redis_link import REDIS_SCRIPTS

LIMITS = web.AppKey("limits", object)


class Rule(Section):
    rpm: Count | None = None        # requests in any 60 seconds (none: no limit)
    tpm: Count | None = None        # tokens a minute


class LimitsSection(Section):
    """`limits:` in the YAML."""
    per_key: Rule = Rule()
    per_address: Rule = Rule()      # keyless (x402) callers, by client address


@dataclass
class Limits:
    per_key: Rule
    per_address: Rule
    store: LimitStore
    key_names: dict[int, tuple[str, str]] = field(default_factory=dict)    # key id -> its rpm and tpm limits' names

    def rules(self, principal) -> Rule:
        """A key's limits, or a keyless client address's."""
        return self.per_key if principal is not None else self.per_address

    def names(self, request: web.Request, principal) -> tuple[str, str]:
        """The names of the rpm and tpm limits of a call's key (made once per key) or client address."""
        if principal is None:
            who = f"gw:rl:{{addr:{request.remote}}}"
            return f"{who}:rpm", f"{who}:tpm"
        names = self.key_names.get(principal.key_id)
        if names is None:
            who = f"gw:rl:{{key:{principal.key_id}}}"
            names = self.key_names[principal.key_id] = (f"{who}:rpm", f"{who}:tpm")
        return names


@hookimpl
def gateway_register_settings(register):
    register("limits", LimitsSection)


@hookimpl
def gateway_configure(app, config):
    section: LimitsSection = config.settings("limits")
    app[LIMITS] = Limits(section.per_key, section.per_address, MemoryLimits())
    app.cleanup_ctx.append(_use_redis)


async def _use_redis(app: web.Application):
    """After the Redis connection opens (and, in reverse, before it closes: once the calls
    have settled, what is still owed to the buckets is sent)."""
    if REDIS_SCRIPTS in app:
        app[LIMITS].store = RedisLimits(app[REDIS_SCRIPTS])
    yield
    await app[LIMITS].store.close()


async def admit_request(request: web.Request, principal) -> dict[str, str]:
    """The rpm limit for routes outside the call pipeline (agent registration, credit
    purchases): raises the 429, or returns the RateLimit-* headers to send."""
    limits = request.app[LIMITS]
    rules = limits.rules(principal)
    if not rules.rpm:
        return {}
    rpm_name, _ = limits.names(request, principal)
    got = await limits.store.take([Bucket(rpm_name, 1, float(rules.rpm), window=True)])
    if got.refused is not None:
        raise _refuse("requests", rules.rpm, got.left[0], got.wait)
    return _headers(rules.rpm, got.left[0], 60.0 * (rules.rpm - got.left[0]) / rules.rpm)


def _tokens(ctx: CallContext) -> int:
    return input_estimate(ctx) + ctx.chat.max_tokens if ctx.chat is not None else 0


def _headers(limit: float, left: float, reset: float) -> dict[str, str]:
    return {"RateLimit-Limit": str(int(limit)), "RateLimit-Remaining": str(max(0, int(left))),
            "RateLimit-Reset": str(max(0, math.ceil(reset)))}


@hookimpl
async def gateway_admit(ctx: CallContext):
    limits, p = ctx.app[LIMITS], ctx.principal
    rules = limits.rules(p)
    rpm, tpm = rules.rpm, rules.tpm
    tokens = _tokens(ctx)
    if not rpm and not (tpm and tokens):
        return
    rpm_name, tpm_name = limits.names(ctx.request, p)
    buckets = []
    if rpm:
        buckets.append(Bucket(rpm_name, 1, float(rpm), True))      # a window
    if tpm and tokens:
        buckets.append(Bucket(tpm_name, tokens, float(tpm)))
    got = await limits.store.take(buckets)
    if got.refused is not None:
        refused = buckets[got.refused]
        kind, limit = ("requests", rpm) if refused.key.endswith(":rpm") else ("tokens", tpm)
        raise _refuse(kind, limit, got.left[got.refused], got.wait, tokens)
    if rpm:
        left = got.left[0]
        ctx.response_headers.update(_headers(rpm, left, 60.0 * (rpm - left) / rpm))
    if tpm and tokens:
        ctx.rate_taken = buckets[-1]


def _refuse(kind: str, limit: float, left: float, wait: float, cost: int = 1) -> GatewayError:
    RATE_LIMITED[kind].inc()
    retry = max(1, math.ceil(wait))
    what = f"{limit:g} requests a minute" if kind == "requests" else \
        f"{limit:g} tokens a minute (this call needs {cost:,}: input estimate + max_tokens)"
    return GatewayError(429, f"rate limit: {what}; retry in {retry} s", code=f"rate_limit_{kind}",
                        headers={"Retry-After": str(retry), **_headers(limit, left, wait)})


@hookimpl
def gateway_record_usage(ctx: CallContext):
    """Give back the tokens a call reserved but did not use (the store's coroutine, or None)."""
    taken: Bucket | None
    taken, ctx.rate_taken = ctx.rate_taken, None
    if taken is None:
        return None
    used = 0
    if ctx.billing:
        used = ctx.billing.get("input_tokens_billed", 0) + ctx.billing.get("output_tokens_billed", 0)
    if taken.cost > used:
        return ctx.app[LIMITS].store.give_back(Bucket(taken.key, taken.cost - used, taken.capacity))
    return None
