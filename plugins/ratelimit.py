"""Rate limits (429): token buckets per API key, and per client address for keyless calls.

`limits.per_key` / `limits.per_address` take `rpm` (requests a minute) and `tpm` (tokens a
minute: the call's input estimate plus its output cap, given back once the real output
is known). A bucket holds a minute's worth and refills continuously. Checking and taking
happen with no await in between, so concurrent calls can never overshoot. The buckets
live in a `LimitStore`: in process by default; a shared store (Redis, say) can implement
the same two methods.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from . import hookimpl
from .context import CallContext
from .errors import GatewayError
from .pricing import input_estimate

LIMITS = web.AppKey("limits", object)


class LimitStore(Protocol):
    def take(self, key: str, cost: float, capacity: float, now: float) -> tuple[bool, float, float]:
        """Take `cost` from bucket `key` (capacity per minute). -> (allowed, left, seconds until
        `cost` would fit)."""

    def give_back(self, key: str, amount: float, capacity: float, now: float) -> None:
        """Return unused tokens (never above capacity)."""


class MemoryLimits:
    def __init__(self):
        self.buckets: dict[str, tuple[float, float]] = {}    # key -> (tokens, updated)

    def _level(self, key: str, capacity: float, now: float) -> float:
        tokens, updated = self.buckets.get(key, (capacity, now))
        return min(capacity, tokens + (now - updated) * capacity / 60.0)

    def take(self, key, cost, capacity, now):
        level = self._level(key, capacity, now)
        if level >= cost:
            self.buckets[key] = (level - cost, now)
            return True, level - cost, 0.0
        self.buckets[key] = (level, now)
        return False, level, (cost - level) * 60.0 / capacity

    def give_back(self, key, amount, capacity, now):
        self.buckets[key] = (min(capacity, self._level(key, capacity, now) + amount), now)


@dataclass
class Limits:
    per_key: dict
    per_address: dict
    store: LimitStore
    clock: object = time.monotonic


@hookimpl
def gateway_configure(app, config):
    section = config.section("limits")
    app[LIMITS] = Limits(section.get("per_key") or {}, section.get("per_address") or {}, MemoryLimits())


def _who(ctx: CallContext) -> tuple[str, dict]:
    limits = ctx.request.app[LIMITS]
    if ctx.principal is not None:
        return f"key:{ctx.principal.key_id}", limits.per_key
    return f"addr:{ctx.request.remote}", limits.per_address


def _tokens(ctx: CallContext) -> int:
    return input_estimate(ctx) + ctx.chat.max_tokens if ctx.chat is not None else 0


def _headers(limit: float, left: float, reset: float) -> dict[str, str]:
    return {"RateLimit-Limit": str(int(limit)), "RateLimit-Remaining": str(max(0, int(left))),
            "RateLimit-Reset": str(max(0, math.ceil(reset)))}


@hookimpl
def gateway_admit(ctx: CallContext):
    limits = ctx.request.app[LIMITS]
    who, rules = _who(ctx)
    now = limits.clock()
    rpm, tpm = rules.get("rpm"), rules.get("tpm")
    tokens = _tokens(ctx)
    if rpm:
        ok, left, wait = limits.store.take(f"{who}:rpm", 1, float(rpm), now)
        if not ok:
            raise _refuse("requests", rpm, left, wait)
        ctx.response_headers.update(_headers(rpm, left, 60.0 * (rpm - left) / rpm))
    if tpm and tokens:
        ok, left, wait = limits.store.take(f"{who}:tpm", tokens, float(tpm), now)
        if not ok:
            if rpm:
                limits.store.give_back(f"{who}:rpm", 1, float(rpm), now)   # the refused call used nothing
            raise _refuse("tokens", tpm, left, wait, tokens)
        ctx.rate_taken = (f"{who}:tpm", tokens, float(tpm))


def _refuse(kind: str, limit: float, left: float, wait: float, cost: int = 1) -> GatewayError:
    retry = max(1, math.ceil(wait))
    what = f"{limit:g} requests a minute" if kind == "requests" else \
        f"{limit:g} tokens a minute (this call needs {cost:,}: input estimate + max_tokens)"
    return GatewayError(429, f"rate limit: {what}; retry in {retry} s", code=f"rate_limit_{kind}",
                        headers={"Retry-After": str(retry), **_headers(limit, left, wait)})


@hookimpl
def gateway_record_usage(ctx: CallContext):
    """Give back the tokens a call reserved but did not use."""
    taken, ctx.rate_taken = ctx.rate_taken, None
    if taken is None:
        return
    key, reserved, capacity = taken
    used = 0
    if ctx.billing:
        used = ctx.billing.get("input_tokens_billed", 0) + ctx.billing.get("output_tokens_billed", 0)
    limits = ctx.request.app[LIMITS]
    if reserved > used:
        limits.store.give_back(key, reserved - used, capacity, limits.clock())
