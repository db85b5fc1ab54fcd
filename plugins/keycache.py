"""The auth cache: found keys are kept for a few seconds so a busy key does not cost a query
per call, and a key change (revocation, a new agent) reaches every process within a second.

- One process, or several without Redis: entries live `FALLBACK_SECONDS` (1 s), and the
  process that made a change drops its own entry at once.
- With `redis:`: every change is published on `CHANNEL`; each process subscribes and drops
  the entry as the message arrives (milliseconds), so entries may live `SUBSCRIBED_SECONDS`.
  The subscription is pinged every `PING_SECONDS`; while no message or pong has arrived
  for `LIVE_SECONDS`, it counts as down and entries live only the 1 s fallback again. When
  it comes back, the whole cache is dropped (messages may have been missed meanwhile).

A lookup that raced a change (it read the database before the change and would cache the
old row after it) is not cached: every drop bumps a generation that the lookup checks.
"""
from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable

import structlog
from aiohttp import web
from redis.exceptions import RedisError

from .redis_link import REDIS

CHANNEL = "gw:keys"
ALL = b"*"
FALLBACK_SECONDS = 1.0
SUBSCRIBED_SECONDS = 30.0
PING_SECONDS = 0.25
LIVE_SECONDS = 0.75

log = structlog.get_logger("keycache")


class KeyCache:
    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._entries: dict[str, tuple[float, object]] = {}     # key hash -> (fetched at, principal)
        self._generation = 0
        self.live_until = 0.0            # the subscription is trusted until then
        self.redis = None                # set when a shared channel exists

    def _ttl(self, now: float) -> float:
        return SUBSCRIBED_SECONDS if now < self.live_until else FALLBACK_SECONDS

    async def get(self, digest: str, load: Callable[[], Awaitable[object | None]]):
        """The cached principal for `digest`, or `load()`ed (and cached if found)."""
        now = self.clock()
        hit = self._entries.get(digest)
        if hit is not None and now - hit[0] < self._ttl(now):
            return hit[1]
        generation = self._generation
        principal = await load()
        if principal is None:
            self._entries.pop(digest, None)
        elif generation == self._generation:
            self._entries[digest] = (now, principal)
        return principal

    def drop(self, digest: bytes | str | None = None) -> None:
        self._generation += 1
        if digest is None or digest == ALL:
            self._entries.clear()
        else:
            self._entries.pop(digest.decode() if isinstance(digest, bytes) else digest, None)

    async def changed(self, digest: str | None = None) -> None:
        """A key changed (None: possibly any key): drop it here and in every other process."""
        self.drop(digest)
        if self.redis is not None:
            try:
                await self.redis.publish(CHANNEL, digest or ALL)
            except (RedisError, OSError) as exc:     # the others fall back to the 1 s expiry
                log.warning("key_change_not_published", error=str(exc))

    async def listen(self, stopping: asyncio.Event) -> None:
        """Follow the change channel until `stopping` is set, resubscribing after any failure.
        (The client may turn a cancellation into a connection error, so the event, not the
        cancellation alone, ends the loop.)"""
        while not stopping.is_set():
            try:
                async with self.redis.pubsub() as pubsub:
                    await pubsub.subscribe(CHANNEL)
                    await self._follow(pubsub, stopping)
            except (RedisError, OSError) as exc:
                self.live_until = 0.0
                if not stopping.is_set():
                    log.warning("key_changes_unsubscribed", error=str(exc))
                    await asyncio.sleep(0.2)

    async def _follow(self, pubsub, stopping: asyncio.Event) -> None:
        next_ping = 0.0
        while not stopping.is_set():
            now = self.clock()
            if now >= next_ping:
                await pubsub.ping()
                next_ping = now + PING_SECONDS
            message = await pubsub.get_message(timeout=PING_SECONDS)
            if message is None:
                continue
            now = self.clock()
            if now >= self.live_until:       # (re)joined: what was missed meanwhile is unknown
                self.drop()
            self.live_until = now + LIVE_SECONDS
            if message["type"] == "message":
                self.drop(message["data"])


KEYCACHE = web.AppKey("keycache", KeyCache)


def install(app: web.Application) -> None:
    app[KEYCACHE] = KeyCache()
    app.cleanup_ctx.append(_subscription)


async def _subscription(app: web.Application):
    if REDIS not in app:
        yield
        return
    cache = app[KEYCACHE]
    cache.redis = app[REDIS]
    stopping = asyncio.Event()
    task = asyncio.get_running_loop().create_task(cache.listen(stopping))
    yield
    stopping.set()
    task.cancel()
    await asyncio.wait([task], timeout=2)     # never hold up the shutdown for it
