"""The optional Redis every gateway process shares: `redis: redis://host:port/db` at the top
of the YAML (`${VAR}` expansion as everywhere).

With it, rate-limit buckets live in Redis (plugins/ratelimit.py) and key changes reach every
process's auth cache at once (plugins/keycache.py). The rate-limit script, sent on every
call, goes through a lean pipelined client (plugins/redis_lean.py), everything else through
redis-py. Without it, each process keeps both in memory, which is exactly right for a
single process.

One bounded redis-py connection pool per process, opened at start (an unreachable Redis stops
start-up with a message naming the URL) and closed last, after in-flight calls settled.
"""
from __future__ import annotations

from urllib.parse import urlsplit

import redis.asyncio as aioredis
import structlog
from aiohttp import web

from config import ConfigError, redact_url

from . import hookimpl
from .errors import StartupError
from .redis_lean import LeanRedis

REDIS = web.AppKey("redis", aioredis.Redis)
REDIS_URL = web.AppKey("redis_url", str)
REDIS_SCRIPTS = web.AppKey("redis_scripts", object)    # runs the per-call script: `register_script(source)`
MAX_CONNECTIONS = 64          # admissions are one short script each: a small pool serves thousands of calls

log = structlog.get_logger("redis")


def redis_url(config) -> str | None:
    """The configured URL, checked; None without `redis:`."""
    url = config.raw.get("redis")
    if url in (None, ""):
        return None
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("redis", "rediss") or not parts.hostname:
        raise ConfigError([f"{config.path}: redis: expected redis://host:port/db (or rediss:// for TLS), "
                           f"got {url!r}"])
    return url


@hookimpl(tryfirst=True)      # before the plugins whose start-up uses the connection
def gateway_configure(app, config):
    url = redis_url(config)
    if url is not None:
        app[REDIS_URL] = url
        app.cleanup_ctx.append(_connect)


@hookimpl
def gateway_register_readiness_checks(app, register):
    if REDIS_URL in app:
        register("redis", _answers)


async def _answers(app: web.Application) -> None:
    await app[REDIS].ping()


async def _connect(app: web.Application):
    url = app[REDIS_URL]
    pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=MAX_CONNECTIONS, timeout=10,
                                                    socket_connect_timeout=5)
    client = aioredis.Redis(connection_pool=pool)
    try:
        await client.ping()
    except (aioredis.RedisError, OSError) as exc:
        await client.aclose()
        raise StartupError(f"redis: cannot reach {redact_url(url)}: {exc}; start Redis or remove `redis:` "
                           "from the config") from None
    app[REDIS] = client
    # the lean client connects on its first call; TLS and URL options stay with redis-py
    scripts = app[REDIS_SCRIPTS] = LeanRedis(url) if LeanRedis.serves(url) else client
    log.info("redis_connected", url=redact_url(url))
    yield
    if scripts is not client:
        await scripts.aclose()
    await client.aclose()
