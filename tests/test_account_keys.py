"""Account self-service keys through HTTP (list, create shown once, revoke), and revocation
reaching every gateway process within one second, with Redis and without it."""
import asyncio
import time

import aiohttp
import openai
import pytest

from tests.conftest import MICRO
from tests.servers import RedisServer

HI = [{"role": "user", "content": "hi"}]


async def http(method: str, url: str, key: str | None, body=None):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as s:
        async with s.request(method, url, json=body, headers=headers) as r:
            return r.status, await r.json()


async def chat(gw, key: str):
    return await gw.openai(key).chat.completions.create(model="demo/echo", messages=HI, max_tokens=20)


async def test_an_account_key_lists_creates_and_revokes_its_accounts_keys(gw):
    key, account = await gw.key(1)
    other_key, _ = await gw.key(1)
    keys_url = f"{gw.url}/api/v1/account/keys"

    status, listed = await http("GET", keys_url, key)
    assert status == 200 and [(k["prefix"], k["current"]) for k in listed["data"]] == [(key[:12], True)]

    status, made = await http("POST", keys_url, key, {"name": "ci"})
    assert status == 201 and made["key"].startswith("chk_") and made["name"] == "ci"
    assert made["prefix"] == made["key"][:12] and "shown once" in made["note"]
    reply = await chat(gw, made["key"])                             # the new key pays from the same account
    assert await gw.balance(account) == MICRO - round(reply.billing["usd"] * MICRO) < MICRO

    status, listed = await http("GET", keys_url, key)
    assert [k["id"] for k in listed["data"]] == [made["id"], listed["data"][1]["id"]]
    assert all("key" not in k and "hash" not in k for k in listed["data"])      # never shown again
    assert other_key[:12] not in str(listed)                       # another account's keys stay unseen

    _, theirs = await http("GET", keys_url, other_key)
    their_id = theirs["data"][0]["id"]
    status, err = await http("DELETE", f"{keys_url}/{their_id}", key)
    assert status == 404 and err["error"]["code"] == "key_not_found"
    assert (await chat(gw, other_key)).choices                      # untouched

    status, revoked = await http("DELETE", f"{keys_url}/{made['id']}", key)
    assert status == 200 and revoked["id"] == made["id"] and revoked["revoked_at"] > 0
    with pytest.raises(openai.AuthenticationError):
        await chat(gw, made["key"])
    _, listed = await http("GET", keys_url, key)
    assert listed["data"][0]["revoked_at"] == revoked["revoked_at"]
    assert listed["data"][0]["spend_usd"] == reply.billing["usd"] and listed["data"][0]["last_used_at"] > 0
    status, again = await http("DELETE", f"{keys_url}/{made['id']}", key)        # revoking twice is a no-op
    assert status == 200 and again["revoked_at"] == revoked["revoked_at"]


async def test_key_routes_refuse_bad_input_clearly(gw):
    key, _ = await gw.key(1)
    keys_url = f"{gw.url}/api/v1/account/keys"
    assert (await http("GET", keys_url, None))[0] == 401
    status, err = await http("POST", keys_url, key, {"name": "x" * 61})
    assert status == 400 and err["error"]["param"] == "name"
    status, err = await http("DELETE", f"{keys_url}/abc", key)
    assert status == 400 and "GET /api/v1/account/keys" in err["error"]["message"]
    status, made = await http("POST", keys_url, key)                # no body: an unnamed key
    assert status == 201 and made["name"] is None


async def last_accepted(gw, key: str, limit: float) -> float:
    """Keep calling `gw` with `key` until refused: -> how long after the start the last call
    that was still served had been sent (fails if the key works past `limit` + 1 s)."""
    client, started, last = gw.openai(key), time.monotonic(), 0.0
    while (sent := time.monotonic() - started) < limit + 1:
        try:
            await client.chat.completions.create(model="demo/echo", messages=HI, max_tokens=20)
        except openai.AuthenticationError:
            return last
        last = sent
        await asyncio.sleep(0.01)
    raise AssertionError(f"the key still worked {limit + 1} s after its revocation")


async def test_a_key_revoked_through_one_process_is_refused_by_the_other_within_a_second(
        start_gateway, shared_state):
    a, b = await start_gateway(shared_state), await start_gateway(shared_state)   # one database
    key, _ = await a.key(1)
    status, made = await http("POST", f"{a.url}/api/v1/account/keys", key)
    await chat(b, made["key"])                                        # b now has it cached
    await http("DELETE", f"{a.url}/api/v1/account/keys/{made['id']}", key)
    assert await last_accepted(b, made["key"], 1.0) < (0.2 if shared_state else 1.0)   # published: near-instant


async def test_without_its_subscription_a_process_falls_back_to_one_second(start_gateway, tmp_path):
    redis = RedisServer(tmp_path)
    try:
        a, b = await start_gateway({"redis": redis.url}), await start_gateway({"redis": redis.url})
        key, _ = await a.key(1)
        _, made = await http("POST", f"{a.url}/api/v1/account/keys", key)
        await chat(b, made["key"])
    finally:
        redis.stop()                                                  # the change will never be published
    await asyncio.sleep(1.0)
    await http("DELETE", f"{a.url}/api/v1/account/keys/{made['id']}", key)
    assert await last_accepted(b, made["key"], 1.0) < 1.0
