"""Rate limits in a real Redis: one script call per admission. The tokens a call reserved and
did not use ride on the key's next admission, or reach Redis within about a second when no
call comes; a credit lands once even when Redis's answer is lost, and concurrent calls never
take more than the bucket holds.

The demo model answers 17 words to "hi" and counts one input token: a call reserving
`max_tokens + 1` uses 18."""
import asyncio

import aiohttp
import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from plugins import limitstores
from plugins.errors import GatewayError
from plugins.limitstores import FLUSH_SECONDS, TAKE_SCRIPT, Bucket, RedisLimits
from tests.test_moderation_limits import HI, post

CHAT = "/api/v1/chat/completions"
USED = 18


@pytest.fixture
async def redis_client(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    await client.script_load(TAKE_SCRIPT)          # so that no call's first try counts twice
    yield client
    await client.aclose()


async def script_calls(client) -> int:
    return (await client.info("commandstats")).get("cmdstat_evalsha", {}).get("calls", 0)


async def tpm_key(client) -> bytes:
    keys = await client.keys("gw:rl:*:tpm")
    assert len(keys) == 1
    return keys[0]


async def one_call_reserving_201_of_300(start_gateway, redis_url, redis_client):
    """A gateway whose key may use 300 tokens a minute, after one call that reserved 201 and
    used 18: -> (the gateway, the key, its bucket), which holds under 100 until the give-back lands."""
    gw = await start_gateway({"redis": redis_url, "limits": {"per_key": {"tpm": 300}}})
    key, _ = await gw.key(1)
    assert (await post(gw, CHAT, {**HI, "max_tokens": 200}, key))[0] == 200
    bucket = await tpm_key(redis_client)
    assert float(await redis_client.hget(bucket, "tokens")) < 100
    return gw, key, bucket


async def test_unused_tokens_come_back_with_the_next_call_in_the_same_round_trip(start_gateway, redis_url,
                                                                                 redis_client, monkeypatch):
    monkeypatch.setattr(limitstores, "FLUSH_SECONDS", 30.0)       # however slow the machine: no flush here
    gw = await start_gateway({"redis": redis_url, "limits": {"per_key": {"tpm": 300}}})
    key, _ = await gw.key(1)
    before = await script_calls(redis_client)
    assert (await post(gw, CHAT, {**HI, "max_tokens": 200}, key))[0] == 200
    left = float(await redis_client.hget(await tpm_key(redis_client), "tokens"))
    assert left < 201                        # the next call would be refused without the give-back
    assert (await post(gw, CHAT, {**HI, "max_tokens": 200}, key))[0] == 200
    assert await script_calls(redis_client) - before == 2       # one script call per call, nothing else
    # the first call's unused 184 tokens were credited before the second took its 201
    left = float(await redis_client.hget(await tpm_key(redis_client), "tokens"))
    assert 300 - 201 - USED - 1 <= left <= 300 - 201 - USED + 5


async def test_an_idle_key_gets_its_tokens_back_after_the_flush_delay(start_gateway, redis_url, redis_client):
    gw, key, bucket = await one_call_reserving_201_of_300(start_gateway, redis_url, redis_client)
    before = await script_calls(redis_client)
    await asyncio.sleep(FLUSH_SECONDS + 0.6)
    assert float(await redis_client.hget(bucket, "tokens")) >= 300 - USED - 1      # given back with no call
    assert await script_calls(redis_client) - before == 1
    assert (await post(gw, CHAT, {**HI, "max_tokens": 270}, key))[0] == 200     # needs 271


async def stream_status(gw, key, max_tokens) -> int:
    body = {**HI, "max_tokens": max_tokens, "stream": True}
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{gw.url}{CHAT}", json=body, headers={"Authorization": f"Bearer {key}"}) as r:
            await r.read()
            return r.status


async def test_concurrent_calls_never_take_more_than_the_bucket_holds(start_gateway, redis_url, redis_client):
    """Streams held open (the demo pauses between words), so every admitted call still holds
    its tokens while the others are admitted: exactly as many as the bucket pays for."""
    gw = await start_gateway({"redis": redis_url, "limits": {"per_key": {"tpm": 1000}},
                              "providers": {"demo": {"type": "demo", "stream_delay_seconds": 0.1}}})
    key, _ = await gw.key(1)
    assert (await post(gw, CHAT, {**HI, "max_tokens": 499}, key))[0] == 200      # 500 taken, 482 owed
    for _ in range(2):
        statuses = await asyncio.gather(*[stream_status(gw, key, 299) for _ in range(12)])
        # ~982 after the credit (1 without it), 300 each: three, never four
        assert sorted(statuses) == [200] * 3 + [429] * 9
    # the second round's three each gave back 282 when their stream ended: three pass again
    statuses = await asyncio.gather(*[stream_status(gw, key, 299) for _ in range(12)])
    assert sorted(statuses) == [200] * 3 + [429] * 9


async def test_one_script_call_per_call_under_load(start_gateway, redis_url, redis_client, monkeypatch):
    monkeypatch.setattr(limitstores, "FLUSH_SECONDS", 30.0)
    gw = await start_gateway({"redis": redis_url, "limits": {"per_key": {"rpm": 10 ** 6, "tpm": 10 ** 9}}})
    key, _ = await gw.key(10)
    body = {**HI, "max_tokens": 200}                  # each call gives back 183 tokens
    before, calls = await script_calls(redis_client), 200
    queue = iter(range(calls))

    async def worker():
        async with aiohttp.ClientSession() as s:
            for _ in queue:
                async with s.post(f"{gw.url}{CHAT}", json=body, headers={"Authorization": f"Bearer {key}"}) as r:
                    assert r.status == 200
                    await r.read()

    await asyncio.gather(*[worker() for _ in range(10)])
    assert await script_calls(redis_client) - before == calls


# ---- a credit whose answer is lost -------------------------------------------------------

class LosesAnswers:
    """The store's script, but the next `lose` calls run in Redis and then fail as if the
    connection dropped before the answer came; `refuse` calls fail without running."""

    def __init__(self, script):
        self.script, self.lose, self.refuse, self.runs = script, 0, 0, 0

    async def __call__(self, keys, args):
        if self.refuse:
            self.refuse -= 1
            raise RedisConnectionError("Connection refused")
        out = await self.script(keys=keys, args=args)
        self.runs += 1
        if self.lose:
            self.lose -= 1
            raise RedisConnectionError("Connection closed by server.")
        return out


async def level(store, key) -> float:
    return (await store.take([Bucket(key, 0, 1000)])).left[0]


async def test_a_credit_whose_answer_was_lost_lands_once(redis_client):
    store = RedisLimits(redis_client)
    store._script = flaky = LosesAnswers(store._script)
    key = "gw:rl:{key:lost}:tpm"
    assert (await store.take([Bucket(key, 800, 1000)])).refused is None               # 200 left
    await store.give_back(Bucket(key, 500, 1000))
    flaky.lose = 1
    with pytest.raises(GatewayError):                 # the credit ran, but this process cannot know it
        await store.take([Bucket(key, 100, 1000)])
    assert flaky.runs == 2
    got = await store.take([Bucket(key, 300, 1000)])     # resent: credits nothing the second time
    assert got.refused is None and 200 + 500 - 100 - 300 - 1 <= got.left[0] <= 200 + 500 - 100 - 300 + 5
    assert not store._owed
    await store.close()


async def test_a_credit_that_never_reached_redis_is_kept(redis_client):
    store = RedisLimits(redis_client)
    store._script = flaky = LosesAnswers(store._script)
    key = "gw:rl:{key:kept}:tpm"
    assert (await store.take([Bucket(key, 800, 1000)])).refused is None
    await store.give_back(Bucket(key, 500, 1000))
    flaky.refuse = 1
    with pytest.raises(GatewayError):
        await store.take([Bucket(key, 100, 1000)])
    assert 200 + 500 - 1 <= await level(store, key) <= 200 + 500 + 5        # the next call credits it
    await store.give_back(Bucket(key, 50, 1000))
    await store.close()                                                     # shutdown sends the rest
    assert not store._owed
    assert 200 + 550 - 1 <= await level(store, key) <= 200 + 550 + 5


async def test_a_refused_call_still_lands_the_credit_it_carried(redis_client):
    store = RedisLimits(redis_client)
    key = "gw:rl:{key:refused}:tpm"
    assert (await store.take([Bucket(key, 800, 1000)])).refused is None
    await store.give_back(Bucket(key, 100, 1000))
    got = await store.take([Bucket(key, 900, 1000)])
    assert got.refused == 0 and 300 - 1 <= got.left[0] <= 300 + 5 and 35 < got.wait < 37   # (900 - 300) / 1000 min
    assert not store._owed
    assert 300 - 1 <= await level(store, key) <= 300 + 5
    await store.close()


async def test_what_is_owed_is_sent_at_shutdown(start_gateway, redis_url, redis_client):
    gw, key, bucket = await one_call_reserving_201_of_300(start_gateway, redis_url, redis_client)
    await gw.server.close()                    # well before the flush delay
    assert float(await redis_client.hget(bucket, "tokens")) >= 300 - USED - 1
