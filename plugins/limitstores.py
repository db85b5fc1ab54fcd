"""Where rate limits live: `MemoryLimits` (one process) or `RedisLimits` (every process).

Two kinds of limit, both "per minute":
- a window (`rpm`): at most `capacity` takes in any 60 s, kept as the times of the takes;
- a token bucket (`tpm`): holds `capacity`, refills continuously at `capacity` a minute,
  and takes back what a call did not use.

`take` checks every limit of a call and takes from all of them, or from none.
"""
from __future__ import annotations

import asyncio
import secrets
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

    async def close(self) -> None:
        """Finish what is owed to the store (at shutdown)."""


class MemoryLimits:
    """One process's limits. No await between check and take: atomic on the event loop."""

    def __init__(self, clock=time.monotonic):
        self.buckets: dict[str, tuple[float, float]] = {}    # token buckets: key -> (tokens, updated)
        self.windows: dict[str, deque] = {}                   # windows: key -> times of the takes
        self.clock = clock

    def _left(self, b: Bucket, now: float) -> float:
        """What is left of `b` now (a window's old takes dropped). How long until `b.cost`
        would fit (`_wait`) is asked only of a limit that refuses."""
        if b.window:
            takes = self.windows.get(b.key)
            if takes is None:
                takes = self.windows[b.key] = deque()
            edge = now - WINDOW_SECONDS
            while takes and takes[0] <= edge:
                takes.popleft()
            return b.capacity - len(takes)
        held = self.buckets.get(b.key)
        if held is None:                # never taken from (or given back to): full
            return b.capacity
        tokens, updated = held
        return min(b.capacity, tokens + (now - updated) * b.capacity / 60.0)

    def _wait(self, b: Bucket, left: float, now: float) -> float:
        if b.window:
            takes = self.windows[b.key]
            return (takes[0] + WINDOW_SECONDS - now) if left < b.cost and takes else 0.0
        return (b.cost - left) * 60.0 / b.capacity

    async def take(self, buckets):
        now = self.clock()
        levels = []
        for i, b in enumerate(buckets):
            left = self._left(b, now)
            levels.append(left)
            if left < b.cost:
                return Admission(i, levels, self._wait(b, left, now))
        after = []
        for b, left in zip(buckets, levels):
            if b.window:
                takes = self.windows[b.key]
                if b.cost == 1:
                    takes.append(now)
                else:
                    takes.extend([now] * int(b.cost))
            else:
                self.buckets[b.key] = (left - b.cost, now)
            after.append(left - b.cost)
        return Admission(None, after)

    async def give_back(self, bucket):
        now = self.clock()
        self.buckets[bucket.key] = (min(bucket.capacity, self._left(bucket, now) + bucket.cost), now)

    async def close(self):
        pass


# KEYS: the limits, then one marker per limit that carries a credit; ARGV: (window 1|0, cost,
# capacity, credit, seq) per limit. Redis's own clock, so every process agrees on time. Windows
# are sorted sets of take times (member: time and count, unique); token buckets are hashes. A
# limit untouched for a minute is full again, so its key may expire.
#
# A credit is tokens a process gives back to a token bucket, carried by its next take (see
# RedisLimits). It is credited first (never above capacity), whether or not the take is then
# refused, and at most once: its marker holds the last `seq` this process credited to that
# bucket, so a call resent after a lost answer credits nothing twice.
TAKE_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local n = #ARGV / 5
local function arg(i, j) return ARGV[5 * (i - 1) + j] end
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
local levels, credited, marker = {}, {}, n
for i = 1, n do
  local cap = tonumber(arg(i, 3))
  local left
  if arg(i, 1) == '1' then
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - 60)
    left = cap - redis.call('ZCARD', KEYS[i])
  else
    local b = redis.call('HMGET', KEYS[i], 'tokens', 'at')
    left = cap
    if b[1] then left = math.min(cap, tonumber(b[1]) + (now - tonumber(b[2])) * cap / 60) end
    local credit = tonumber(arg(i, 4))
    if credit > 0 then
      marker = marker + 1
      local seq = tonumber(arg(i, 5))
      if seq > tonumber(redis.call('GET', KEYS[marker]) or '0') then
        left = math.min(cap, left + credit)
        redis.call('SET', KEYS[marker], arg(i, 5), 'PX', 120000)
        credited[i] = true
      end
    end
  end
  levels[i] = left
end
for i = 1, n do
  local cost, cap = tonumber(arg(i, 2)), tonumber(arg(i, 3))
  if levels[i] < cost then
    local wait = (cost - levels[i]) * 60 / cap
    if arg(i, 1) == '1' then
      local oldest = redis.call('ZRANGE', KEYS[i], 0, 0, 'WITHSCORES')
      wait = oldest[2] and tonumber(oldest[2]) + 60 - now or 0
    end
    for j = 1, n do if credited[j] then put(j, levels[j]) end end
    local out = {tostring(i)}
    for j = 1, i do out[#out + 1] = string.format('%.6f', levels[j]) end
    out[#out + 1] = string.format('%.6f', wait)
    return out
  end
end
local out = {'0'}
for i = 1, n do
  local after = tonumber(string.format('%.6f', levels[i])) - tonumber(arg(i, 2))
  if arg(i, 1) == '1' then put(i, levels[i]) else put(i, after) end
  out[#out + 1] = string.format('%.6f', after)
end
return out
"""
FLUSH_SECONDS = 1.0       # tokens given back reach Redis with the key's next take, or within about this
GIVE_UP_SECONDS = 60.0    # a credit Redis never confirmed is dropped: by then the bucket has refilled
CLOSE_SECONDS = 5.0       # at most this long sending what is owed at shutdown


@dataclass(slots=True)
class _Owed:
    """Tokens this process owes one token bucket."""
    capacity: float
    tokens: float = 0.0      # given back, not sent yet
    since: float = 0.0       # when the oldest of them was given back
    sent: float = 0.0        # sent under `seq`, not known to have landed (0: nothing)
    seq: int = 0
    first_sent: float = 0.0
    last_sent: float = 0.0
    busy: bool = False       # a script call carrying `sent` is under way


class RedisLimits:
    """Limits shared by every process, under `gw:rl:{who}:rpm|tpm`. The braces keep one
    caller's limits in one Redis Cluster slot, so one script can take them all.

    One round trip per admission: `give_back` only notes what this process owes a bucket,
    and the bucket's next `take` from this process credits it in the same script call. A
    flusher sends what no take carried within FLUSH_SECONDS; `close` sends the rest. A bucket
    has at most one credit under way, and one whose answer was lost is resent as it was (same
    `seq`), so a credit lands once and never early: giving back late only makes a caller wait
    a little longer."""

    def __init__(self, client, clock=time.monotonic):
        self._script = client.register_script(TAKE_SCRIPT)
        self._marker = f":given:{secrets.token_hex(8)}"      # this process's credit markers
        self._owed: dict[str, _Owed] = {}
        self._seq = 0
        self._flusher: asyncio.Task | None = None
        self._closing = False
        self.clock = clock

    async def take(self, buckets):
        try:
            out = await self._call(buckets)
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
        owed = self._owed.get(bucket.key)
        if owed is None:
            owed = self._owed[bucket.key] = _Owed(bucket.capacity)
        if not owed.tokens:
            owed.since = self.clock()
        owed.tokens += bucket.cost
        owed.capacity = bucket.capacity
        self._start_flusher()

    async def close(self) -> None:
        """Send every credit still owed (at shutdown, once calls have settled)."""
        self._closing = True
        if self._flusher is not None:
            self._flusher.cancel()
            await asyncio.wait([self._flusher])
        try:
            await asyncio.wait_for(self._flush(everything=True), CLOSE_SECONDS)
        except asyncio.TimeoutError:
            pass
        for owed in self._owed.values():
            if owed.sent or owed.tokens:
                log.warning("rate_limit_give_back_failed", tokens=owed.sent + owed.tokens)

    async def _call(self, buckets: list[Bucket]) -> list[float]:
        """One script call: takes `buckets`, crediting first what this process owes them."""
        now, args, markers, carried = self.clock(), [], [], []
        for b in buckets:
            owed = None if b.window else self._owed.get(b.key)
            if owed is not None and not owed.busy:
                if not owed.sent and owed.tokens:          # nothing unconfirmed: send what is owed
                    self._seq += 1
                    owed.sent, owed.seq, owed.first_sent, owed.tokens = owed.tokens, self._seq, now, 0.0
                if owed.sent:
                    owed.busy, owed.last_sent = True, now
                    carried.append((b.key, owed))
                    markers.append(b.key + self._marker)
                    args += (int(b.window), b.cost, b.capacity, owed.sent, owed.seq)
                    continue
            args += (int(b.window), b.cost, b.capacity, 0, 0)
        try:
            out = await self._script(keys=[b.key for b in buckets] + markers, args=args)
        except BaseException:            # it may or may not have run: resend those credits as they were
            for _, owed in carried:
                owed.busy = False
            if carried:
                self._start_flusher()
            raise
        for key, owed in carried:
            owed.sent, owed.busy = 0.0, False
            if not owed.tokens and self._owed.get(key) is owed:
                del self._owed[key]
        return [float(v) for v in out]

    def _start_flusher(self) -> None:
        if self._flusher is None and not self._closing:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_later())

    async def _flush_later(self) -> None:
        try:
            while self._owed:
                await asyncio.sleep(FLUSH_SECONDS / 4)
                await self._flush()
        finally:
            self._flusher = None

    async def _flush(self, everything: bool = False) -> None:
        """Send, each in a take of nothing, the credits no take carried within FLUSH_SECONDS
        (and retry, as often, those whose answer was lost)."""
        now, due = self.clock(), []
        for key, owed in list(self._owed.items()):
            if owed.busy:
                continue
            if owed.sent and now - owed.first_sent > GIVE_UP_SECONDS:
                log.warning("rate_limit_give_back_dropped", tokens=owed.sent)
                owed.sent = 0.0
            if owed.sent and (everything or now - owed.last_sent >= FLUSH_SECONDS) or \
                    owed.tokens and (everything or now - owed.since >= FLUSH_SECONDS):
                due.append(self._give(key))
            elif not owed.sent and not owed.tokens:
                del self._owed[key]
        if due:
            await asyncio.gather(*due)

    async def _give(self, key: str) -> None:
        owed = self._owed.get(key)
        if owed is None or owed.busy or not (owed.sent or owed.tokens):      # a take carried it meanwhile
            return
        try:
            await self._call([Bucket(key, 0, owed.capacity)])
        except (RedisError, OSError) as exc:       # kept, and sent again on the next round
            log.warning("rate_limit_give_back_failed", error=str(exc))
