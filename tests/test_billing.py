"""Money paths, to the micro-USD: reserve, settle, refund, no charge on failure,
concurrent spending from one key, a client that leaves mid-stream, crash recovery."""
import asyncio
import time

import aiohttp
import openai
import pytest

from gateway import create_app
from plugins.accounts import create_account
from plugins.appstate import STORE
from plugins.storage import HoldRequest, Settlement
from tests.conftest import MICRO, openai_upstream, upstream_cost as cost
from tests.fakes import Reply

ENGINES = ("sqlite", "postgresql")     # every money test runs on both storage engines

HI = [{"role": "user", "content": "hi"}]          # 2 characters -> 1 input token estimated



async def usage_rows(gw, account):
    return await gw.store.fetchall("SELECT * FROM usage WHERE account_id = ? ORDER BY id", (account,))


async def test_reserve_settle_refund_exact(start_gateway, fake_openai):
    gw = await start_gateway(openai_upstream(fake_openai))
    key, account = await gw.key(1)
    fake_openai.enqueue(Reply(text="ok", output_tokens=7))
    await gw.openai(key).chat.completions.create(model="up/gpt", max_tokens=500, messages=HI)
    entries = await gw.store.fetchall("SELECT amount_micro, kind FROM ledger WHERE account_id = ? ORDER BY id",
                                      (account,))
    reserve, charge = cost(1, 500), cost(1, 7)
    assert [(e["amount_micro"], e["kind"]) for e in entries] == [
        (MICRO, "grant"), (-reserve, "hold"), (reserve - charge, "release")]
    assert await gw.balance(account) == MICRO - charge == await gw.ledger_sum(account)
    hold = await gw.store.fetchone("SELECT status, charge_micro, amount_micro FROM holds")
    assert (hold["status"], hold["charge_micro"], hold["amount_micro"]) == ("settled", charge, reserve)
    row = (await usage_rows(gw, account))[0]
    assert (row["usd_micro"], row["input_tokens"], row["output_tokens"], row["outcome"]) == (charge, 1, 7, "ok")


async def test_short_balance_is_402_and_nothing_changes(start_gateway, fake_openai):
    gw = await start_gateway(openai_upstream(fake_openai))
    key, account = await gw.key(0)
    await gw.store.ledger.credit(account, cost(1, 100) - 1)
    with pytest.raises(openai.APIStatusError) as info:
        await gw.openai(key).chat.completions.create(model="up/gpt", max_tokens=100, messages=HI)
    assert info.value.status_code == 402
    assert "does not cover" in info.value.message and "max_tokens 100" in info.value.message
    assert fake_openai.requests == []
    assert await gw.balance(account) == cost(1, 100) - 1 == await gw.ledger_sum(account)
    # ...and exactly enough is enough.
    await gw.store.ledger.credit(account, 1)
    fake_openai.enqueue(Reply(output_tokens=100))
    await gw.openai(key).chat.completions.create(model="up/gpt", max_tokens=100, messages=HI)
    assert await gw.balance(account) == 0 == await gw.ledger_sum(account)


async def test_output_beyond_the_hold_is_never_charged(start_gateway, fake_openai):
    gw = await start_gateway(openai_upstream(fake_openai))
    key, account = await gw.key(1)
    fake_openai.enqueue(Reply(output_tokens=999))            # the upstream over-reports
    resp = await gw.openai(key).chat.completions.create(model="up/gpt", max_tokens=10, messages=HI)
    assert resp.model_extra["billing"]["output_tokens_billed"] == 10
    assert await gw.balance(account) == MICRO - cost(1, 10)


async def test_concurrent_spending_never_overdraws(start_gateway, fake_openai):
    """100 calls at once from one key whose credits cover exactly 10 reserves."""
    gw = await start_gateway(openai_upstream(fake_openai))
    reserve = cost(1, 100)
    key, account = await gw.key(0)
    await gw.store.ledger.credit(account, 10 * reserve)
    fake_openai.enqueue(*[Reply(output_tokens=100) for _ in range(100)])   # each charge == its reserve
    client = gw.openai(key)

    async def call():
        try:
            await client.chat.completions.create(model="up/gpt", max_tokens=100, messages=HI)
            return 200
        except openai.APIStatusError as exc:
            return exc.status_code

    statuses = await asyncio.gather(*[call() for _ in range(100)])
    assert statuses.count(200) == 10 and statuses.count(402) == 90
    assert await gw.balance(account) == 0 == await gw.ledger_sum(account)
    rows = await usage_rows(gw, account)
    assert len(rows) == 10 and sum(r["usd_micro"] for r in rows) == 10 * reserve


async def test_concurrent_refunds_are_exact(start_gateway, fake_openai):
    gw = await start_gateway(openai_upstream(fake_openai))
    key, account = await gw.key(1)
    fake_openai.enqueue(*[Reply(output_tokens=i) for i in range(1, 41)])
    client = gw.openai(key)
    await asyncio.gather(*[client.chat.completions.create(model="up/gpt", max_tokens=64, messages=HI)
                           for _ in range(40)])
    expected = sum(cost(1, i) for i in range(1, 41))
    assert await gw.balance(account) == MICRO - expected == await gw.ledger_sum(account)
    assert tuple(await gw.store.fetchone("SELECT COUNT(*) FROM holds WHERE status = 'open'")) == (0,)


async def test_client_disconnect_mid_stream_charges_what_was_relayed(start_gateway, fake_openai):
    gw = await start_gateway(openai_upstream(fake_openai))
    key, account = await gw.key(1)
    fake_openai.enqueue(Reply(text="word " * 200, text_chunks=200, chunk_delay=0.02, output_tokens=200))
    async with aiohttp.ClientSession() as session:
        resp = await session.post(f"{gw.url}/api/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                                  json={"model": "up/gpt", "stream": True, "max_tokens": 1000, "messages": HI})
        for _ in range(5):
            await resp.content.readline()
        resp.close()                                  # the client goes away mid-stream
    for _ in range(200):
        hold = await gw.store.fetchone("SELECT status, charge_micro FROM holds")
        if hold["status"] == "settled":
            break
        await asyncio.sleep(0.02)
    row = (await usage_rows(gw, account))[0]
    assert row["outcome"] == "client_gone"
    assert 0 < row["output_tokens"] < 200             # charged for what was relayed, not the whole answer
    assert hold["charge_micro"] == row["usd_micro"] == cost(1, row["output_tokens"])
    assert await gw.balance(account) == MICRO - row["usd_micro"] == await gw.ledger_sum(account)


async def test_a_restart_leaves_other_processes_holds_alone_until_their_lease_expires(write_config,
                                                                                       aiohttp_server):
    cfg = write_config()
    first = await aiohttp_server(create_app(cfg))
    store = first.app[STORE]
    account, _ = await create_account(store, "crash", 5 * MICRO)
    assert await store.ledger.reserve(HoldRequest("call-in-flight", account, 2 * MICRO, endpoint="chat.completions"))
    second = await aiohttp_server(create_app(cfg))     # another process starts on the same database
    store = second.app[STORE]
    assert await store.ledger.balance(account) == 3 * MICRO              # the first one's call is untouched
    assert tuple(await store.fetchone("SELECT status FROM holds")) == ("open",)
    await first.close()                                # ... which then dies without renewing its lease
    assert await store.ledger.release_expired(at=time.time() + store.lease_seconds + 1) == 1
    assert await store.ledger.balance(account) == 5 * MICRO == await store.ledger.entries_sum(account)
    assert tuple(await store.fetchone("SELECT status, charge_micro FROM holds")) == ("released", 0)
    assert tuple(await store.fetchone("SELECT outcome, usd_micro, endpoint FROM usage")) == \
        ("crashed", 0, "chat.completions")


async def test_settle_is_idempotent(gw):
    account, _ = await create_account(gw.store, "x", 100)
    held = await gw.store.ledger.reserve(HoldRequest("c1", account, 60))
    assert held.credit_micro == 60 and held.free_micro == 0                   # nothing from an allowance
    assert await gw.store.ledger.reserve(HoldRequest("c2", account, 41)) is None   # 40 left: refused
    assert await gw.store.ledger.settle(Settlement(held, 25, 0)) is True
    assert await gw.store.ledger.settle(Settlement(held, 0, 0)) is False     # a second settle changes nothing
    assert await gw.balance(account) == 75 == await gw.ledger_sum(account)


async def test_failed_calls_record_usage_but_cost_nothing(start_gateway, fake_openai):
    gw = await start_gateway(openai_upstream(fake_openai))
    key, account = await gw.key(1)
    fake_openai.enqueue(Reply(error_status=503))
    with pytest.raises(openai.InternalServerError):
        await gw.openai(key).chat.completions.create(model="up/gpt", messages=HI)
    row = (await usage_rows(gw, account))[0]
    assert (row["usd_micro"], row["outcome"], row["status"]) == (0, "failed", 502)
    assert await gw.balance(account) == MICRO
