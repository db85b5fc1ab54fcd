"""`GET /healthz` and `GET /readyz` as a load balancer polls them: no key, never rate
limited, no usage row; readiness names the store that does not answer (the database,
Redis when configured, and what a plugin registers)."""
import asyncio

import aiohttp

from plugins import get_plugin_manager, hookimpl
from tests.servers import RedisServer

ENGINES = ("sqlite", "postgresql")


async def get(gw, path):
    async with aiohttp.ClientSession() as s:
        async with s.get(gw.url + path) as r:
            return r.status, r.headers["Content-Type"], await r.json()


async def test_ready_with_redis_then_unready_when_redis_stops(start_gateway, tmp_path):
    redis = RedisServer(tmp_path)
    try:
        gw = await start_gateway({"redis": redis.url, "limits": {"per_address": {"rpm": 1}}})
        for _ in range(3):                                          # polled often: never rate limited
            assert await get(gw, "/healthz") == (200, "application/json", {"status": "ok"})
            assert await get(gw, "/readyz") == (200, "application/json", {
                "status": "ready", "checks": {"database": "ok", "redis": "ok"}})
        redis.stop()
        status, _, body = await get(gw, "/readyz")
        assert status == 503 and body["status"] == "unready" and body["checks"]["database"] == "ok"
        assert body["checks"]["redis"].startswith("error: ConnectionError")
        assert await get(gw, "/healthz") == (200, "application/json", {"status": "ok"})
    finally:
        redis.stop()
    assert tuple(await gw.store.fetchone("SELECT COUNT(*) FROM usage")) == (0,)


async def test_without_redis_only_the_database_is_checked(start_gateway):
    gw = await start_gateway()
    assert await get(gw, "/readyz") == (200, "application/json", {"status": "ready", "checks": {"database": "ok"}})


class QueueCheck:
    """A plugin whose service must answer too: a work queue that can fail or hang."""

    def __init__(self):
        self.state = "up"

    @hookimpl
    def gateway_register_readiness_checks(self, app, register):
        register("queue", self.answers)

    async def answers(self, app):
        if self.state == "down":
            raise OSError("queue refused the connection")
        if self.state == "hung":
            await asyncio.sleep(30)


async def test_a_plugin_adds_a_check_with_a_deadline(start_gateway):
    pm = get_plugin_manager()
    queue = QueueCheck()
    pm.register(queue, "queue")
    gw = await start_gateway(pm=pm)
    assert (await get(gw, "/readyz"))[2]["checks"] == {"database": "ok", "queue": "ok"}
    queue.state = "down"
    status, _, body = await get(gw, "/readyz")
    assert status == 503 and body["checks"] == {"database": "ok",
                                                 "queue": "error: OSError: queue refused the connection"}
    queue.state = "hung"
    started = asyncio.get_running_loop().time()
    status, _, body = await get(gw, "/readyz")
    assert status == 503 and body["checks"]["queue"] == "error: no answer within 2 s"
    assert asyncio.get_running_loop().time() - started < 5
