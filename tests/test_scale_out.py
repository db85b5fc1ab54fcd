"""Four gateway processes on one database and one Redis, driven over HTTP with the official
SDKs: money stays exact, limits stay exact, a payment pays once, the free allowance is
never overspent and a revoked key stops everywhere within a second. Every test runs on
SQLite with `gateway run --workers 4` and on PostgreSQL with four separate processes."""
from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import time
from asyncio.subprocess import PIPE

import aiohttp
import asyncpg
import httpx
import openai
import pytest
import redis.asyncio as redis
from eth_account import Account

from plugins.keycache import CHANNEL, TTL_SECONDS
from tests.cluster import FLAT_MICRO, GATEWAY, MICRO, Cluster
from tests.fakes.facilitator import FakeFacilitator
from tests.test_x402 import chains, sign

HI = [{"role": "user", "content": "hi"}]
VARIANTS = ["sqlite-workers", "postgresql-processes"]


@pytest.fixture(params=VARIANTS)
async def cluster(request, tmp_path, redis_url):
    """`await cluster(extra_config)` -> four running gateway processes."""
    started: list[Cluster] = []
    engine, mode = request.param.split("-")
    storage = await request.getfixturevalue("postgres_server").fresh_url() if engine == "postgresql" else None

    async def start(extra: dict | None = None, **kw) -> Cluster:
        c = Cluster(tmp_path, redis_url=redis_url, mode=mode, storage=storage, extra=extra, **kw)
        started.append(c)
        return await c.start()
    yield start
    for c in started:
        await c.stop()


async def status_of(call) -> int:
    try:
        await call
        return 200
    except openai.APIStatusError as err:
        return err.status_code


@pytest.mark.timeout(180)      # 1,000 calls through four processes: slow on a busy machine, not wrong
async def test_credit_for_exactly_100_reserves_admits_exactly_100_of_1000_calls(cluster):
    c = await cluster()
    key, account = await c.key(100 * FLAT_MICRO)
    clients = c.clients(key)
    statuses = await asyncio.gather(*[
        status_of(clients[i % len(clients)].chat.completions.create(model="demo/flat", messages=HI, max_tokens=5))
        for i in range(1000)])
    assert statuses.count(200) == 100 and statuses.count(402) == 900
    assert await c.money(account) == (0, 0)                                 # balance and ledger exact to the micro-USD
    assert await c.scalar("SELECT SUM(usd_micro) FROM usage WHERE account_id = ?", (account,)) == 100 * FLAT_MICRO
    assert await c.scalar("SELECT COUNT(*) FROM holds WHERE status = 'open'") == 0


async def test_rpm_50_admits_exactly_50_of_200_calls_over_four_processes(cluster):
    c = await cluster({"limits": {"per_key": {"rpm": 50}}})
    key, account = await c.key(MICRO)
    clients = c.clients(key)
    statuses = await asyncio.gather(*[
        status_of(clients[i % len(clients)].chat.completions.create(model="demo/echo", messages=HI, max_tokens=5))
        for i in range(200)])
    assert statuses.count(200) == 50 and statuses.count(429) == 150
    balance, ledger = await c.money(account)
    assert balance == ledger == MICRO - await c.scalar("SELECT SUM(usd_micro) FROM usage WHERE account_id = ?", (account,))


async def test_one_x402_payment_sent_to_every_process_at_once_pays_once(cluster, aiohttp_server):
    facilitator = FakeFacilitator()
    fac = await aiohttp_server(facilitator.app)
    c = await cluster({"payments": {"x402": {"facilitator": {"url": str(fac.make_url(""))},
                                             "chains": chains("usdc")}}})
    body = {"model": "demo/flat", "max_tokens": 5, "messages": HI}
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{c.urls[0]}/api/v1/chat/completions", json=body) as r:
            assert r.status == 402
            price = int((await r.json())["accepts"][0]["maxAmountRequired"])
        payment = sign(Account.create(), amount=price)

        async def pay(url: str) -> int:
            async with aiohttp.ClientSession() as own:                 # its own connection: any worker
                async with own.post(f"{url}/api/v1/chat/completions", json=body, headers=payment) as r:
                    return r.status
        statuses = await asyncio.gather(*[pay(url) for url in c.spread(24)])
    assert statuses.count(200) == 1 and statuses.count(402) == 23
    assert len(facilitator.settled) == 1
    assert await c.scalar("SELECT COUNT(*) FROM x402_payments") == 1
    assert await c.scalar("SELECT status FROM x402_payments") == "settled"


async def test_the_free_allowance_spent_from_four_processes_is_never_overspent(cluster):
    c = await cluster({"free": {"daily_allowance_usd": 10 * FLAT_MICRO / MICRO, "models": ["demo/flat"]}})
    key, account = await c.key(0)                                      # no credits: only the allowance pays
    clients = c.clients(key)
    statuses = await asyncio.gather(*[
        status_of(clients[i % len(clients)].chat.completions.create(model="demo/flat", messages=HI, max_tokens=5))
        for i in range(100)])
    assert statuses.count(200) == 10 and statuses.count(402) == 90
    assert await c.scalar("SELECT SUM(used_micro) FROM free_usage WHERE account_id = ?", (account,)) == 10 * FLAT_MICRO
    assert await c.money(account) == (0, 0)


async def test_a_key_revoked_through_one_process_is_refused_by_all_within_a_second(cluster):
    c = await cluster()
    owner, _ = await c.key(MICRO)
    async with httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0)) as http:   # a new connection
        made = (await http.post(f"{c.urls[0]}/api/v1/account/keys", json={"name": "leaked"},  # per call: any worker
                                headers={"Authorization": f"Bearer {owner}"})).json()
        headers = {"Authorization": f"Bearer {made['key']}"}
        body = {"model": "demo/echo", "max_tokens": 5, "messages": HI}

        async def call(url: str) -> int:
            return (await http.post(f"{url}/api/v1/chat/completions", json=body, headers=headers)).status_code
        assert set(await asyncio.gather(*[call(url) for url in c.spread(40)])) == {200}   # cached everywhere
        revoked = await http.delete(f"{c.urls[-1]}/api/v1/account/keys/{made['id']}",
                                    headers={"Authorization": f"Bearer {owner}"})
        assert revoked.status_code == 200
        started, last_accepted = time.monotonic(), None
        while time.monotonic() - started < 2.0:
            sent = time.monotonic() - started
            statuses = await asyncio.gather(*[call(url) for url in c.spread(8)])
            if 200 in statuses:
                last_accepted = sent
            elif sent > 1.0:
                break
            await asyncio.sleep(0.02)
    assert last_accepted is None or last_accepted < 1.0
    assert set(statuses) == {401}


async def until(check, timeout: float, what: str) -> None:
    """Until the async `check()` is true."""
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.05)


async def stream_to_end(client) -> tuple[str, dict | None]:
    """-> ("ok", billing) for a finished stream, ("broken", None) if its process died."""
    words = " ".join(f"word{i}" for i in range(40))
    try:
        stream = await client.chat.completions.create(model="demo/echo", stream=True, max_tokens=200,
                                                      messages=[{"role": "user", "content": words}])
        billing = None
        async for chunk in stream:
            billing = getattr(chunk, "billing", None) or billing
        return "ok", billing
    except (openai.APIConnectionError, httpx.HTTPError):
        return "broken", None


async def test_kill_9_of_one_process_leaves_the_others_calls_untouched(cluster):
    lease = 5
    c = await cluster({"providers": {"demo": {"type": "demo", "stream_delay_seconds": 0.1}}}, lease_seconds=lease)
    key, account = await c.key(MICRO)
    streams = [asyncio.create_task(stream_to_end(client)) for client in c.clients(key, count=16)]
    async def open_calls() -> set[str]:
        return set().union(*(await c.open_holds_by_pid()).values())

    async def all_in_flight() -> bool:
        return len(await open_calls()) == 16

    await until(all_in_flight, 20, "16 streams in flight")
    holds = await c.open_holds_by_pid()
    victim = max(holds, key=lambda pid: len(holds[pid]))
    doomed = set(holds[victim])
    c.kill9(victim)
    await c.restart(victim)                                          # a new process in its place
    assert doomed <= await open_calls()                                     # its lease has not expired: nobody took them

    results = await asyncio.gather(*streams)
    assert [r[0] for r in results].count("broken") == len(doomed)
    survivors = [billing for outcome, billing in results if outcome == "ok"]
    assert len(survivors) == 16 - len(doomed) and all(b["usd"] > 0 for b in survivors)   # charged by their owners

    async def released() -> bool:
        return not doomed & await open_calls()

    await until(released, lease + 5, "the dead process's holds released after their lease")
    marks = ",".join("?" * len(doomed))
    assert await c.scalar(f"SELECT COUNT(*) FROM usage WHERE outcome = 'crashed' AND usd_micro = 0 "
                    f"AND call_id IN ({marks})", tuple(doomed)) == len(doomed)
    assert await c.scalar("SELECT COUNT(*) FROM usage WHERE account_id = ? AND outcome = 'ok'", (account,)) == len(survivors)
    balance, ledger = await c.money(account)
    charged = await c.scalar("SELECT SUM(usd_micro) FROM usage WHERE account_id = ?", (account,))
    assert balance == ledger == MICRO - charged
    assert charged == sum(round(b["usd"] * MICRO) for b in survivors)


@contextlib.asynccontextmanager
async def revocations_held(c: Cluster, cli_pid: int):
    """Hold the database's write lock on keys until the CLI (`cli_pid`) waits on it; -> the
    release, after which the CLI's revocation commits within milliseconds. So the test knows
    when the key stops being valid, and can refresh every process's cached copy just before."""
    url, _, query = c.storage_url.partition("?")
    query = "&".join(p for p in query.split("&") if not p.startswith("lease_seconds="))
    if url.startswith("postgresql"):
        conn = await asyncpg.connect(f"{url}?{query}" if query else url)
        try:
            held = conn.transaction()
            await held.start()
            await conn.execute("LOCK TABLE api_keys IN EXCLUSIVE MODE")      # reads go on
            deadline = time.monotonic() + 30
            while not await conn.fetchval("SELECT count(*) FROM pg_locks l JOIN pg_class t ON t.oid = l.relation "
                                          "WHERE t.relname = 'api_keys' AND NOT l.granted"):
                assert time.monotonic() < deadline, "the CLI never tried to revoke"
                await asyncio.sleep(0.02)
            yield held.commit
        finally:
            await conn.close()
    else:
        path = url.removeprefix("sqlite:///")
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA busy_timeout=5000")
            conn.execute("BEGIN IMMEDIATE")                                    # WAL: reads go on
            deadline = time.monotonic() + 30
            while not _has_open(cli_pid, path):
                assert time.monotonic() < deadline, "the CLI never opened the database"
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.5)    # SQLite shows no waiter: give the CLI's read and write the time to queue

            async def release():
                conn.execute("COMMIT")
            yield release
        finally:
            conn.close()


def _has_open(pid: int, path: str) -> bool:
    """Whether process `pid` has the file open (one of its descriptors may close while we look)."""
    wanted = os.path.realpath(path)
    for fd in os.scandir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(fd.path) == wanted:
                return True
        except OSError:                 # closed since the listing
            continue
    return False


async def test_a_key_revoked_with_the_cli_is_refused_by_every_process_at_once(cluster, redis_url):
    """`gateway keys revoke` publishes the change on Redis as the HTTP path does: every process
    refuses the key as soon as the command says it is revoked, not when its cached copy
    expires (up to TTL_SECONDS later). Every process caches the key just before the revocation
    commits, so without the message they would all serve it for most of a second more."""
    c = await cluster()
    key, _ = await c.key(MICRO)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0)) as http:   # a new connection
        async def every_process(calls: int = 16) -> list[httpx.Response]:                   # per call: any worker
            """GET /api/v1/account: authenticated through the key cache, and no write to wait on."""
            return await asyncio.gather(*[http.get(f"{url}/api/v1/account", headers=headers)
                                          for url in c.spread(calls)])

        cli = await asyncio.create_subprocess_exec(*GATEWAY, "keys", "revoke", "--config", str(c.config), key,
                                                   cwd=c.folder, stdout=PIPE, stderr=PIPE)
        try:
            async with revocations_held(c, cli.pid) as release:
                async with redis.Redis.from_url(redis_url) as channel:
                    await channel.publish(CHANNEL, "*")           # drop every cached copy, then cache it afresh
                assert {r.status_code for r in await every_process()} == {200}
                await release()
            said = await cli.stdout.readline()              # printed once every process has been told
            revoked = time.monotonic()
            assert b"revoked at" in said, (said, await cli.stderr.read())

            last_accepted = None
            while (sent := time.monotonic() - revoked) < TTL_SECONDS:
                statuses = {r.status_code for r in await every_process()}
                if 200 in statuses:
                    last_accepted = sent
                await asyncio.sleep(0.02)
            _, err = await cli.communicate()
            assert cli.returncode == 0 and not err, err
        finally:
            if cli.returncode is None:
                cli.kill()
                await cli.wait()
    assert last_accepted is None or last_accepted < 0.3, f"served {last_accepted:.2f} s after the CLI said revoked"
    assert statuses == {401}
