"""The auth cache: a found key is kept for `TTL_SECONDS` so a busy key does not cost a query
per call, and a change to a key (revoked, given an agent) reaches every process at once.

- Everywhere, an entry lives at most 1 s: a change made anywhere (another process, another
  machine, the CLI writing to the database) is seen within a second, even with no Redis or
  with its subscription down.
- The process that made a change drops its own entries at once.
- With `redis:`, every change is also published on `CHANNEL`; each process subscribes and
  drops the entry as the message arrives, so the others see it within milliseconds. A CLI
  command that changes a key publishes the same message (`publish_once`).

A lookup that raced a change (it read the database before the change and would cache the
old row after it) is not cached: every drop bumps a generation that the lookup checks.

Calls that miss at the same moment share one lookup: when a busy key's entry expires, the
calls in flight wait for the first one's query instead of each sending their own (200 calls
at once made 200 queries). A call that arrives after a drop starts a lookup of its own, so
sharing never hands out a row read before a change. The shared lookup runs as its own task,
so a caller that leaves (a client gone) does not cancel it for the others.
"""
from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable

import redis.asyncio as aioredis
import structlog
from aiohttp import web
from redis.exceptions import RedisError

from .redis_link import REDIS

CHANNEL = "gw:keys"
ALL = b"*"
TTL_SECONDS = 1.0
POLL_SECONDS = 0.5                 # how often the listener looks up from its channel to see if it must stop
ONCE_TIMEOUT_SECONDS = TTL_SECONDS  # a CLI command's whole publish: any later, every cache has expired anyway

log = structlog.get_logger("keycache")


async def publish(redis, digest: str | None) -> None:
    """The one message that makes every process drop its entry for `digest` (None: every
    entry). Raises RedisError or OSError when Redis cannot take it."""
    await redis.publish(CHANNEL, digest or ALL)


async def publish_once(url: str, digest: str | None) -> str | None:
    """From outside a gateway (a CLI command): `publish` over a connection of its own, within
    ONCE_TIMEOUT_SECONDS. -> None when published, else why not (one line)."""
    client = aioredis.Redis.from_url(url, socket_connect_timeout=ONCE_TIMEOUT_SECONDS,
                                     socket_timeout=ONCE_TIMEOUT_SECONDS)
    try:
        async with asyncio.timeout(ONCE_TIMEOUT_SECONDS):
            await publish(client, digest)
        return None
    except TimeoutError:
        return f"no answer within {ONCE_TIMEOUT_SECONDS:g} s"
    except (RedisError, OSError) as exc:
        return str(exc) or type(exc).__name__
    finally:
        await client.aclose()


class KeyCache:
    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._entries: dict[str, tuple[float, object]] = {}     # key hash -> (fetched at, principal)
        self._generation = 0
        self._lookups: dict[str, tuple[int, asyncio.Task]] = {}   # key hash -> (generation, its lookup)
        self.redis = None                # set when a shared channel exists

    async def get(self, digest: str, load: Callable[[], Awaitable[object | None]]):
        """The cached principal for `digest`, or `load()`ed (and cached if found); a lookup
        of the same digest already under way since the last drop is shared."""
        now = self.clock()
        hit = self._entries.get(digest)
        if hit is not None and now - hit[0] < TTL_SECONDS:
            return hit[1]
        flight = self._lookups.get(digest)
        if flight is None or flight[0] != self._generation:     # none, or one begun before a change
            task = asyncio.get_running_loop().create_task(self._lookup(digest, load, now, self._generation))
            task.add_done_callback(_retrieved)
            flight = self._lookups[digest] = (self._generation, task)
        return await asyncio.shield(flight[1])

    async def _lookup(self, digest: str, load: Callable[[], Awaitable[object | None]], now: float,
                      generation: int):
        try:
            principal = await load()
        finally:
            flight = self._lookups.get(digest)
            if flight is not None and flight[1] is asyncio.current_task():
                del self._lookups[digest]
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
                await publish(self.redis, digest)
            except (RedisError, OSError) as exc:     # the others still see it within TTL_SECONDS
                log.warning("key_change_not_published", error=str(exc))

    async def listen(self, stopping: asyncio.Event) -> None:
        """Follow the change channel until `stopping` is set, resubscribing after any failure.
        (redis-py's pub/sub read can swallow a cancellation and return normally, so the
        event, not the cancellation alone, ends the loop.)"""
        while not stopping.is_set():
            try:
                async with self.redis.pubsub(ignore_subscribe_messages=True) as pubsub:
                    await pubsub.subscribe(CHANNEL)
                    self.drop()          # whatever was missed while unsubscribed
                    while not stopping.is_set():
                        message = await pubsub.get_message(timeout=POLL_SECONDS)
                        if message is not None:
                            self.drop(message["data"])
            except (RedisError, OSError) as exc:
                if not stopping.is_set():
                    log.warning("key_changes_unsubscribed", error=str(exc))
                    await asyncio.sleep(0.2)


def _retrieved(task: asyncio.Task) -> None:
    """Every caller of a shared lookup may have left: its failure is theirs, not a log line."""
    if not task.cancelled():
        task.exception()


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
