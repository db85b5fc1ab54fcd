"""The key cache shares a lookup between calls that miss at the same moment (a busy key's
entry expiring must not send one query per call in flight), never across a change to the
key, and a caller that leaves does not cancel the lookup the others wait for."""
import asyncio

from plugins.keycache import KeyCache
from tests.conftest import openai_upstream
from tests.fakes import Reply
from tests.servers import stats_once_quiet

ENGINES = ("postgresql",)               # the gateway test counts PostgreSQL's own index scans

HI = [{"role": "user", "content": "hi"}]


async def key_lookups(url: str) -> int:
    """Scans of the API keys' hash index in the test's schema (a lookup of a key is one)."""
    return await stats_once_quiet(url, "SELECT idx_scan FROM pg_stat_user_indexes WHERE schemaname = current_schema() "
                                       "AND indexrelname = 'api_keys_hash_key'")


async def test_100_calls_that_miss_the_cache_together_look_their_key_up_once(start_gateway, fake_openai,
                                                                              storage_url):
    gw = await start_gateway(openai_upstream(fake_openai))
    key, _ = await gw.key(1)
    client = gw.openai(key)
    fake_openai.enqueue(*[Reply(text="ok", output_tokens=1) for _ in range(100)])
    answers = await asyncio.gather(*[client.chat.completions.create(model="up/gpt", max_tokens=16, messages=HI)
                                     for _ in range(100)])
    assert [a.choices[0].message.content for a in answers] == ["ok"] * 100
    await gw.store.close()              # its sessions end and report their scans
    # One per second the calls took at most (the entry lives 1 s); one query per call would be 100.
    assert 1 <= await key_lookups(storage_url) <= 5


async def test_a_lookup_begun_before_a_change_is_not_shared_with_calls_after_it():
    cache, release = KeyCache(), asyncio.Event()
    rows = iter(["row before the change", "row after it"])      # a third lookup would raise

    async def load():
        row = next(rows)
        if row == "row before the change":
            await release.wait()
        return row

    first = asyncio.create_task(cache.get("digest", load))
    await asyncio.sleep(0)
    cache.drop("digest")                # the key is revoked while the first lookup is out
    assert await cache.get("digest", load) == "row after it"
    release.set()
    assert await first == "row before the change"       # the call that read it before the change
    assert await cache.get("digest", load) == "row after it"     # what the cache keeps


async def test_a_caller_leaving_does_not_cancel_the_lookup_the_others_share():
    cache, release, lookups = KeyCache(), asyncio.Event(), []

    async def load():
        lookups.append(1)
        await release.wait()
        return "row"

    callers = [asyncio.create_task(cache.get("digest", load)) for _ in range(5)]
    await asyncio.sleep(0)
    callers[0].cancel()                 # the caller whose miss began the lookup leaves
    release.set()
    assert [await c for c in callers[1:]] == ["row"] * 4
    assert len(lookups) == 1
