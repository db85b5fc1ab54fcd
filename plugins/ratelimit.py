"""Rate limits (429): token buckets per API key, and per client address for keyless calls.

`limits.per_key` / `limits.per_address` take `rpm` (requests a minute) and `tpm` (tokens a
minute: the call's input estimate plus its output cap, given back once the real output
is known). A bucket holds a minute's worth and refills continuously.

Admission checks and takes every bucket of a call at once, all or nothing, so concurrent
calls can never overshoot and a refused call takes nothing. The buckets live in a
`LimitStore`: in process (`MemoryLimits`) by default, or in Redis (`RedisLimits`, one Lua
script per admission: one round trip, atomic across every gateway process) when the config
has `redis:`.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Protocol

import structlog
from aiohttp import web
from redis.exceptions import RedisError

from . import hookimpl
from .context import CallContext
from .errors import GatewayError
from .pricing import input_estimate
from .redis_link import REDIS

LIMITS = web.AppKey("limits", object)
log = structlog.get_logger("ratelimit")


@dataclass(slots=True)
class Bucket:
    key: str
    cost: float
    capacity: float          # per minute


@dataclass(slots=True)
class Admission:
    refused: int | None      # index of the first bucket that could not pay, or None: all taken
    left: list[float]        # per bucket up to the refused one: what is left after taking
    wait: float = 0.0        # seconds until the refused bucket could pay


class LimitStore(Protocol):
    async def take(self, buckets: list[Bucket]) -> Admission:
        """Take each bucket's cost, all or nothing."""

    async def give_back(self, bucket: Bucket) -> None:
        """Return `bucket.cost` unused tokens (never above capacity)."""


class MemoryLimits:
    """One process's buckets. No await between check and take: atomic on the event loop."""

    def __init__(self, clock=time.monotonic):
        self.buckets: dict[str, tuple[float, float]] = {}    # key -> (tokens, updated)
        self.clock = clock

    def _level(self, b: Bucket, now: float) -> float:
        tokens, updated = self.buckets.get(b.key, (b.capacity, now))
        return min(b.capacity, tokens + (now - updated) * b.capacity / 60.0)

    async def take(self, buckets):
        now = self.clock()
        levels = [self._level(b, now) for b in buckets]
        for i, (b, level) in enumerate(zip(buckets, levels)):
            if level < b.cost:
                return Admission(i, levels[:i + 1], (b.cost - level) * 60.0 / b.capacity)
        for b, level in zip(buckets, levels):
            self.buckets[b.key] = (level - b.cost, now)
        return Admission(None, [level - b.cost for b, level in zip(buckets, levels)])

    async def give_back(self, bucket):
        now = self.clock()
        self.buckets[bucket.key] = (min(bucket.capacity, self._level(bucket, now) + bucket.cost), now)


# KEYS: the buckets; ARGV: cost, capacity per bucket. Redis's own clock, so every process
# agrees on time. A bucket untouched for a minute is full again, so its key may expire.
_LEVELS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local function level(i)
  local cap = tonumber(ARGV[2 * i])
  local b = redis.call('HMGET', KEYS[i], 'tokens', 'at')
  if not b[1] then return cap end
  return math.min(cap, tonumber(b[1]) + (now - tonumber(b[2])) * cap / 60)
end
local function put(i, tokens)
  redis.call('HSET', KEYS[i], 'tokens', string.format('%.6f', tokens), 'at', string.format('%.6f', now))
  redis.call('PEXPIRE', KEYS[i], 61000)
end
"""
TAKE_SCRIPT = _LEVELS + """
local levels = {}
for i = 1, #KEYS do
  local cost, cap = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  levels[i] = level(i)
  if levels[i] < cost then
    local out = {tostring(i)}
    for j = 1, i do out[#out + 1] = string.format('%.6f', levels[j]) end
    out[#out + 1] = string.format('%.6f', (cost - levels[i]) * 60 / cap)
    return out
  end
end
local out = {'0'}
for i = 1, #KEYS do
  put(i, levels[i] - tonumber(ARGV[2 * i - 1]))
  out[#out + 1] = string.format('%.6f', levels[i] - tonumber(ARGV[2 * i - 1]))
end
return out
"""
GIVE_BACK_SCRIPT = _LEVELS + """
put(1, math.min(tonumber(ARGV[2]), level(1) + tonumber(ARGV[1])))
return 1
"""


class RedisLimits:
    """Buckets shared by every process, as Redis hashes `gw:rl:{who}:rpm|tpm`. The braces
    keep one caller's buckets in one Redis Cluster slot, so one script can take them all."""

    def __init__(self, client):
        self._take = client.register_script(TAKE_SCRIPT)
        self._give_back = client.register_script(GIVE_BACK_SCRIPT)

    async def take(self, buckets):
        args = [x for b in buckets for x in (b.cost, b.capacity)]
        try:
            out = [float(v) for v in await self._take(keys=[b.key for b in buckets], args=args)]
        except (RedisError, OSError) as exc:
            log.error("rate_limit_store_unreachable", error=str(exc))
            raise GatewayError(503, "rate limits cannot be checked right now (the shared store is unreachable); "
                                    "retry shortly", type="api_error", code="rate_limit_store_unavailable",
                               headers={"Retry-After": "1"}) from None
        refused = int(out[0])
        if refused == 0:
            return Admission(None, out[1:])
        return Admission(refused - 1, out[1:-1], out[-1])

    async def give_back(self, bucket):
        try:
            await self._give_back(keys=[bucket.key], args=[bucket.cost, bucket.capacity])
        except (RedisError, OSError) as exc:      # the bucket refills on its own within a minute
            log.warning("rate_limit_give_back_failed", error=str(exc))


@dataclass
class Limits:
    per_key: dict
    per_address: dict
    store: LimitStore


@hookimpl
def gateway_configure(app, config):
    section = config.section("limits")
    app[LIMITS] = Limits(section.get("per_key") or {}, section.get("per_address") or {}, MemoryLimits())
    app.on_startup.append(_use_redis)


async def _use_redis(app: web.Application) -> None:
    if REDIS in app:
        app[LIMITS].store = RedisLimits(app[REDIS])


def _who(ctx: CallContext) -> tuple[str, dict]:
    limits = ctx.request.app[LIMITS]
    if ctx.principal is not None:
        return f"gw:rl:{{key:{ctx.principal.key_id}}}", limits.per_key
    return f"gw:rl:{{addr:{ctx.request.remote}}}", limits.per_address


def _tokens(ctx: CallContext) -> int:
    return input_estimate(ctx) + ctx.chat.max_tokens if ctx.chat is not None else 0


def _headers(limit: float, left: float, reset: float) -> dict[str, str]:
    return {"RateLimit-Limit": str(int(limit)), "RateLimit-Remaining": str(max(0, int(left))),
            "RateLimit-Reset": str(max(0, math.ceil(reset)))}


@hookimpl
async def gateway_admit(ctx: CallContext):
    who, rules = _who(ctx)
    rpm, tpm = rules.get("rpm"), rules.get("tpm")
    tokens = _tokens(ctx)
    buckets = []
    if rpm:
        buckets.append(Bucket(f"{who}:rpm", 1, float(rpm)))
    if tpm and tokens:
        buckets.append(Bucket(f"{who}:tpm", tokens, float(tpm)))
    if not buckets:
        return
    got = await ctx.request.app[LIMITS].store.take(buckets)
    if got.refused is not None:
        refused = buckets[got.refused]
        kind, limit = ("requests", rpm) if refused.key.endswith(":rpm") else ("tokens", tpm)
        raise _refuse(kind, limit, got.left[got.refused], got.wait, tokens)
    if rpm:
        left = got.left[0]
        ctx.response_headers.update(_headers(rpm, left, 60.0 * (rpm - left) / rpm))
    if tpm and tokens:
        ctx.state["tpm_taken"] = buckets[-1]


def _refuse(kind: str, limit: float, left: float, wait: float, cost: int = 1) -> GatewayError:
    retry = max(1, math.ceil(wait))
    what = f"{limit:g} requests a minute" if kind == "requests" else \
        f"{limit:g} tokens a minute (this call needs {cost:,}: input estimate + max_tokens)"
    return GatewayError(429, f"rate limit: {what}; retry in {retry} s", code=f"rate_limit_{kind}",
                        headers={"Retry-After": str(retry), **_headers(limit, left, wait)})


@hookimpl
async def gateway_record_usage(ctx: CallContext):
    """Give back the tokens a call reserved but did not use."""
    taken: Bucket | None = ctx.state.pop("tpm_taken", None)
    if taken is None:
        return
    used = 0
    if ctx.billing:
        used = ctx.billing.get("input_tokens_billed", 0) + ctx.billing.get("output_tokens_billed", 0)
    if taken.cost > used:
        await ctx.request.app[LIMITS].store.give_back(Bucket(taken.key, taken.cost - used, taken.capacity))
