"""Where rate limits live: `MemoryLimits` (one process) or `RedisLimits` (every process).

Two kinds of limit, both "per minute":
- a window (`rpm`): at most `capacity` takes in any 60 s, kept as the times of the takes;
- a token bucket (`tpm`): holds `capacity`, refills continuously at `capacity` a minute,
  and takes back what a call did not use.

`take` checks every limit of a call and takes from all of them, or from none.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Protocol

import structlog
from redis.exceptions import RedisError

from .errors import GatewayError

WINDOW_SECONDS = 60.0
log = structlog.get_logger("ratelimit")


@dataclass(slots=True)
class Bucket:
    key: str
    cost: float
    capacity: float          # per minute
    window: bool = False     # a sliding window of takes (rpm) rather than a token bucket (tpm)


@dataclass(slots=True)
class Admission:
    refused: int | None      # index of the first limit that could not pay, or None: all taken
    left: list[float]        # per limit up to the refused one: what is left after taking
    wait: float = 0.0        # seconds until the refused limit could pay


class LimitStore(Protocol):
    async def take(self, buckets: list[Bucket]) -> Admission:
        """Take each limit's cost, all or nothing."""

    async def give_back(self, bucket: Bucket) -> None:
        """Return `bucket.cost` unused tokens to a token bucket (never above capacity)."""


class MemoryLimits:
    """One process's limits. No await between check and take: atomic on the event loop."""

    def __init__(self, clock=time.monotonic):
        self.buckets: dict[str, tuple[float, float]] = {}    # token buckets: key -> (tokens, updated)
        self.windows: dict[str, deque] = {}                   # windows: key -> times of the takes
        self.clock = clock

    def _level(self, b: Bucket, now: float) -> tuple[float, float]:
        """-> (what is left now, seconds until `b.cost` would fit)."""
        if b.window:
            takes = self.windows.setdefault(b.key, deque())
            while takes and takes[0] <= now - WINDOW_SECONDS:
                takes.popleft()
            left = b.capacity - len(takes)
            return left, (takes[0] + WINDOW_SECONDS - now) if left < b.cost and takes else 0.0
        tokens, updated = self.buckets.get(b.key, (b.capacity, now))
        left = min(b.capacity, tokens + (now - updated) * b.capacity / 60.0)
        return left, (b.cost - left) * 60.0 / b.capacity

    async def take(self, buckets):
        now = self.clock()
        levels = []
        for i, b in enumerate(buckets):
            left, wait = self._level(b, now)
            levels.append(left)
            if left < b.cost:
                return Admission(i, levels, wait)
        for b, left in zip(buckets, levels):
            if b.window:
                self.windows[b.key].extend([now] * int(b.cost))
            else:
                self.buckets[b.key] = (left - b.cost, now)
        return Admission(None, [left - b.cost for b, left in zip(buckets, levels)])

    async def give_back(self, bucket):
        now = self.clock()
        left, _ = self._level(bucket, now)
        self.buckets[bucket.key] = (min(bucket.capacity, left + bucket.cost), now)


# KEYS: the limits; ARGV: (window 1|0, cost, capacity) per limit. Redis's own clock, so every
# process agrees on time. Windows are sorted sets of take times (member: time and count,
# unique); token buckets are hashes. A limit untouched for a minute is full again, so its
# key may expire.
_COMMON = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local function arg(i, j) return ARGV[3 * (i - 1) + j] end
local function level(i)
  local cost, cap = tonumber(arg(i, 2)), tonumber(arg(i, 3))
  if arg(i, 1) == '1' then
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - 60)
    local left = cap - redis.call('ZCARD', KEYS[i])
    if left >= cost then return left, 0 end
    local oldest = redis.call('ZRANGE', KEYS[i], 0, 0, 'WITHSCORES')
    return left, (oldest[2] and tonumber(oldest[2]) + 60 - now or 0)
  end
  local b = redis.call('HMGET', KEYS[i], 'tokens', 'at')
  local left = cap
  if b[1] then left = math.min(cap, tonumber(b[1]) + (now - tonumber(b[2])) * cap / 60) end
  return left, (cost - left) * 60 / cap
end
local function put(i, left)
  local cost, cap = tonumber(arg(i, 2)), tonumber(arg(i, 3))
  if arg(i, 1) == '1' then
    for k = 1, cost do
      redis.call('ZADD', KEYS[i], now, string.format('%.6f:%d', now, cap - left + k))
    end
  else
    redis.call('HSET', KEYS[i], 'tokens', string.format('%.6f', left), 'at', string.format('%.6f', now))
  end
  redis.call('PEXPIRE', KEYS[i], 61000)
end
"""
TAKE_SCRIPT = _COMMON + """
local levels = {}
for i = 1, #KEYS do
  local left, wait = level(i)
  levels[i] = string.format('%.6f', left)
  if left < tonumber(arg(i, 2)) then
    local out = {tostring(i)}
    for j = 1, i do out[#out + 1] = levels[j] end
    out[#out + 1] = string.format('%.6f', wait)
    return out
  end
end
local out = {'0'}
for i = 1, #KEYS do
  local before = tonumber(levels[i])
  local after = before - tonumber(arg(i, 2))
  if arg(i, 1) == '1' then put(i, before) else put(i, after) end
  out[#out + 1] = string.format('%.6f', after)
end
return out
"""
GIVE_BACK_SCRIPT = _COMMON + """
local left = level(1)
put(1, math.min(tonumber(arg(1, 3)), left + tonumber(arg(1, 2))))
return 1
"""


class RedisLimits:
    """Limits shared by every process, under `gw:rl:{who}:rpm|tpm`. The braces keep one
    caller's limits in one Redis Cluster slot, so one script can take them all."""

    def __init__(self, client):
        self._take = client.register_script(TAKE_SCRIPT)
        self._give_back = client.register_script(GIVE_BACK_SCRIPT)

    @staticmethod
    def _args(buckets: list[Bucket]) -> list:
        return [x for b in buckets for x in (int(b.window), b.cost, b.capacity)]

    async def take(self, buckets):
        try:
            out = [float(v) for v in await self._take(keys=[b.key for b in buckets], args=self._args(buckets))]
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
            await self._give_back(keys=[bucket.key], args=self._args([bucket]))
        except (RedisError, OSError) as exc:      # the bucket refills on its own within a minute
            log.warning("rate_limit_give_back_failed", error=str(exc))
