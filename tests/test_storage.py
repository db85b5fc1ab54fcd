"""The storage interfaces, one conformance suite run against every engine (SQLite and a
real PostgreSQL server): money exact to the micro-USD under concurrency, settlement once
per call, holds owned and leased, keys, usage, agents, the allowance and x402 claims."""
import asyncio
import json
import time

import pytest

from plugins.storage import (
    CRASHED, CreditPurchase, FreeAsk, HoldRequest, PaymentClaim, Settlement, UsageRow, open_storage, split_charge,
)

ENGINES = ("sqlite", "postgresql")


@pytest.fixture(params=ENGINES)
async def url(request, tmp_path) -> str:
    if request.param == "postgresql":
        return await request.getfixturevalue("postgres_server").fresh_url()
    return f"sqlite:///{tmp_path / 'gateway.db'}"


@pytest.fixture
async def storage(url):
    store = await open_storage(url, [], instance_id="first")
    yield store
    await store.close()


async def account(store, credits: int = 0, name: str = "a") -> int:
    return await store.keys.create_account(name, f"hash-{name}-{time.monotonic_ns()}", f"chk_{name}", credits)


async def books_balance(store, account_id: int) -> int:
    """The balance, after checking it equals the sum of the ledger entries."""
    balance = await store.ledger.balance(account_id)
    assert balance == await store.ledger.entries_sum(account_id)
    return balance


def usage_row(call_id: str, account_id: int, usd_micro: int = 0) -> UsageRow:
    return UsageRow(call_id=call_id, account_id=account_id, key_id=None, agent_id=None, endpoint="chat.completions",
                    requested_model="m", model="m", usd_micro=usd_micro, outcome="ok", billing="{}", created_at=1)


# ---- the ledger --------------------------------------------------------------------

async def test_credit_reserve_settle_release_to_the_micro(storage):
    a = await account(storage, 100)
    assert await storage.ledger.credit(a, 5, "grant", "t") == 105
    with pytest.raises(ValueError):
        await storage.ledger.credit(a, -1)
    held = await storage.ledger.reserve(HoldRequest("c1", a, 60))
    assert (held.credit_micro, held.free_micro) == (60, 0)
    assert await storage.ledger.reserve(HoldRequest("c2", a, 46)) is None      # 45 left: refused, nothing changed
    assert await books_balance(storage, a) == 45
    assert await storage.ledger.settle(Settlement(held, 25, 0, usage_row("c1", a, 25))) is True
    assert await storage.ledger.settle(Settlement(held, 0, 0)) is False          # once per call id
    assert await storage.ledger.release("c1") is False
    assert await books_balance(storage, a) == 80
    other = await storage.ledger.reserve(HoldRequest("c3", a, 80))
    assert await storage.ledger.release("c3") is True and await storage.ledger.release("c3") is False
    assert await storage.ledger.settle(Settlement(other, 80, 0)) is False       # released: no late charge
    assert await books_balance(storage, a) == 80
    assert [r.call_id for r in await storage.usage.recent(a)] == ["c1"]


async def test_a_settlement_outside_its_hold_is_refused_before_any_write(storage):
    a = await account(storage, 100)
    held = await storage.ledger.reserve(HoldRequest("c1", a, 50))
    with pytest.raises(ValueError):
        Settlement(held, 51, 0)


async def test_concurrent_reserves_from_one_key_never_overdraw_or_lose_a_charge(storage):
    a = await account(storage, 1_000)
    results = await asyncio.gather(*[storage.ledger.reserve(HoldRequest(f"c{i}", a, 10)) for i in range(250)])
    held = [r for r in results if r is not None]
    assert len(held) == 100                                     # exactly what the balance covers
    assert await books_balance(storage, a) == 0
    charges = [(h, 1 + i % 10) for i, h in enumerate(held)]     # 1..10 each
    settled = await asyncio.gather(*[storage.ledger.settle(Settlement(h, c, 0, usage_row(h.call_id, a, c)))
                                     for h, c in charges])
    assert all(settled)
    charged = sum(c for _, c in charges)
    assert await books_balance(storage, a) == 1_000 - charged
    assert sum(r.usd_micro for r in await storage.usage.recent(a, 500)) == charged


async def test_the_free_allowance_is_held_first_and_never_overspent(storage):
    a = await account(storage, 1_000)
    free = FreeAsk(day="2026-01-01", want=30, daily=100)
    results = await asyncio.gather(*[storage.ledger.reserve(HoldRequest(f"c{i}", a, 50, free)) for i in range(10)])
    assert sum(r.free_micro for r in results) == 100            # the day's allowance, not a micro more
    assert sum(r.credit_micro for r in results) == 500 - 100
    assert await storage.allowance.used(a, "2026-01-01") == 100
    first = next(r for r in results if r.free_micro == 30)
    charge, free_use = split_charge(first, 40, free_eligible=10)
    assert (charge, free_use) == (20, 20)       # eligible 10, but the credit hold (20) cannot cover 30 alone
    assert await storage.ledger.settle(Settlement(first, charge, free_use))
    for r in results:
        if r is not first:
            await storage.ledger.release(r.call_id)
    assert await storage.allowance.used(a, "2026-01-01") == 20
    assert await storage.allowance.used(a, "2026-01-02") == 0
    assert await books_balance(storage, a) == 1_000 - 20


async def test_credit_purchases_get_the_first_order_bonus_once(storage):
    a = await account(storage)
    order = CreditPurchase("o1", a, 1_000, "claim-1", "0xtx", bonus_first_micro=100, bonus_micro=10)
    assert await storage.ledger.purchase(order) == (100, 1_100)
    assert await storage.ledger.purchase(CreditPurchase("o2", a, 1_000, "claim-2", None, 100, 10)) == (10, 2_110)
    # One order per payment, ever: crediting a payment again (recovery after a crash) is a no-op.
    assert await storage.ledger.purchase(CreditPurchase("o3", a, 1_000, "claim-2", None, 100, 10)) == (10, 2_110)
    assert await books_balance(storage, a) == 2_110


# ---- owners and leases ----------------------------------------------------------------

async def test_holds_of_a_live_process_are_never_released_by_another(url, storage):
    a = await account(storage, 100)
    await storage.ledger.reserve(HoldRequest("mine", a, 40, key_id=7, endpoint="messages", model="m"))
    second = await open_storage(url, [], instance_id="second")
    try:
        assert await second.ledger.release_expired() == 0          # the lease is fresh: untouched
        assert await books_balance(second, a) == 60
        later = time.time() + storage.lease_seconds + 5
        await storage.ledger.renew_leases()                       # ... and renewed while the call runs
        assert await second.ledger.release_expired(at=later - 10) == 0
        # The first process dies: nobody renews; once the lease is over the hold is released.
        assert await second.ledger.release_expired(at=later) == 1
        assert await second.ledger.release_expired(at=later) == 0
        assert await books_balance(second, a) == 100
        crashed = (await second.usage.recent(a))[0]
        assert (crashed.call_id, crashed.outcome, crashed.usd_micro, crashed.key_id, crashed.endpoint) == \
            ("mine", CRASHED, 0, 7, "messages")
    finally:
        await second.close()


async def test_renewal_touches_only_the_owners_holds(url, storage):
    a = await account(storage, 100)
    second = await open_storage(url, [], instance_id="second", lease_seconds=1)
    try:
        await storage.ledger.reserve(HoldRequest("first-call", a, 10))
        await second.ledger.reserve(HoldRequest("second-call", a, 10))
        assert await second.ledger.renew_leases() == 1
        # Past the second's short lease, before the first's: only the second's hold goes.
        assert await storage.ledger.release_expired(at=time.time() + 3) == 1
        assert tuple(await storage.fetchone("SELECT status FROM holds WHERE call_id = ?", ("first-call",))) == \
            ("open",)
    finally:
        await second.close()


# ---- keys, usage, agents, payments ----------------------------------------------------

async def test_keys_create_look_up_list_and_revoke(storage):
    a = await storage.keys.create_account("acme", "h1", "chk_ab%_", 0)
    k2 = await storage.keys.create(a, "h2", "chk_abcd", "second")
    first = await storage.keys.get("h1")
    assert (first.account_id, first.prefix, first.revoked) == (a, "chk_ab%_", False)
    assert await storage.keys.get("nope") is None
    assert [k.id for k in await storage.keys.with_prefix("chk_ab")] == [first.id, k2]
    assert [k.id for k in await storage.keys.with_prefix("chk_ab%")] == [first.id]   # % is a character here
    assert [k.name for k in await storage.keys.list(a)] == ["acme", "second"]
    assert await storage.keys.revoke(k2) is True and await storage.keys.revoke(k2) is False
    assert (await storage.keys.get("h2")).revoked


async def test_usage_is_written_once_per_call_newest_first(storage):
    a = await account(storage)
    for i in range(3):
        await storage.usage.record(usage_row(f"u{i}", a, i))
    await storage.usage.record(usage_row("u1", a, 99))            # a second write of a call is ignored
    assert [(r.call_id, r.usd_micro) for r in await storage.usage.recent(a, 2)] == [("u2", 2), ("u1", 1)]


async def test_agents_keep_one_id_per_name_and_a_key_stays_with_its_first_agent(storage):
    a = await storage.keys.create_account("acme", "h1", "chk_1")
    key = (await storage.keys.get("h1")).id
    scout = await storage.agents.register(a, key, "scout")
    assert (scout.created, scout.attached) == (True, True)
    again = await storage.agents.register(a, key, "scout")
    assert (again.agent_id, again.created, again.attached) == (scout.agent_id, False, True)
    other = await storage.agents.register(a, key, "other")
    assert (other.created, other.attached) == (True, False)
    assert (await storage.keys.get("h1")).agent_id == scout.agent_id


async def test_a_payment_is_claimed_once_even_sent_many_times_at_once(storage):
    claim = PaymentClaim("base:usdc:0xpayer:nonce1", "base", "usdc", "0xpayer", "10000", 10_000, "call-1")
    assert not await storage.payments.is_claimed(claim.claim_key)
    assert sum(await asyncio.gather(*[storage.payments.claim(claim) for _ in range(20)])) == 1
    assert await storage.payments.is_claimed(claim.claim_key)
    await storage.payments.record(claim.claim_key, "settled", "0xtx")
    assert tuple(await storage.fetchone("SELECT status, tx FROM x402_payments")) == ("settled", "0xtx")


async def test_a_dead_process_payment_is_adopted_by_exactly_one_other(url, storage):
    claim = PaymentClaim("k1", "base", "usdc", "0xpayer", "5000", 5_000, "call-1", scheme="upto",
                         settle_with='{"payload": 1}', deadline=2_000_000_000)
    assert await storage.payments.claim(claim)
    await storage.payments.owe("k1", 1200, 1_200)
    assert await storage.payments.renew_leases() == 1
    assert await storage.payments.unfinished() == []                  # its owner is alive
    later = time.time() + storage.lease_seconds + 5
    (found,) = await storage.payments.unfinished(at=later)
    assert (found.claim_key, found.ref, found.scheme, found.due, found.deadline) == \
        ("k1", "call-1", "upto", "1200", 2_000_000_000)
    others = [await open_storage(url, [], instance_id=f"other-{i}") for i in range(3)]
    try:
        adopted = await asyncio.gather(*[o.payments.adopt("k1", at=later) for o in others])
        assert sorted(adopted) == [False, False, True]                 # exactly one finishes it
        await others[adopted.index(True)].payments.record("k1", "settled", "0xtx", amount=1200, usd_micro=1_200)
    finally:
        for o in others:
            await o.close()
    assert await storage.payments.unfinished(at=later + 100) == []
    assert tuple(await storage.fetchone("SELECT status, amount, usd_micro FROM x402_payments")) == \
        ("settled", "1200", 1_200)


@pytest.mark.parametrize("owed", [None, 1_200], ids=["never-priced", "priced"])
async def test_a_dead_process_call_payment_is_finished_with_one_crashed_usage_row(url, storage, owed):
    claim = PaymentClaim("k1", "base", "usdc", "0xpayer", "5000", 5_000, "call-1", scheme="upto",
                         settle_with="{}", deadline=2_000_000_000, endpoint="chat.completions",
                         requested_model="cheap", model="up/gpt")
    assert await storage.payments.claim(claim)
    if owed:
        await storage.payments.owe("k1", owed, owed)                  # priced, then the process died
    end = ("settled", "0xtx", None, {"amount": owed}) if owed else \
        ("unused", None, "crashed_before_priced", {"amount": 0, "usd_micro": 0})
    others = [await open_storage(url, [], instance_id=f"other-{i}") for i in range(3)]
    try:
        finished = await asyncio.gather(*[o.payments.finish_crashed("k1", *end[:3], note="it stopped", **end[3])
                                          for o in others])
        assert sorted(finished) == [False, False, True]               # exactly one finishes it
    finally:
        for o in others:
            await o.close()
    assert not await storage.payments.finish_crashed("k1", "settle_failed", note="again")   # finished: no-op
    (row,) = await storage.fetchall("SELECT call_id, account_id, key_id, endpoint, requested_model, model, "
                                    "usd_micro, outcome, billing FROM usage")
    assert tuple(row)[:8] == ("call-1", None, None, "chat.completions", "cheap", "up/gpt", owed or 0, CRASHED)
    billing = json.loads(row[8])
    assert (billing["payment"], billing["payer"], billing["usd"], billing["note"]) == \
        ("x402", "0xpayer", (owed or 0) / 1_000_000, "it stopped")
    assert tuple(await storage.fetchone("SELECT status, usd_micro FROM x402_payments")) == (end[0], owed or 0)


async def test_a_paid_render_is_orphaned_only_once_its_payment_outlived_its_process(storage):
    for n in (1, 2):
        assert await storage.payments.claim(PaymentClaim(f"k{n}", "base", "usdc", "0xpayer", "5000", 5_000,
                                                         f"call-{n}", settle_with="{}", deadline=2_000_000_000))
        await storage.payments.note_job(f"call-{n}", f'{{"job": {n}}}')
    assert await storage.payments.orphaned_jobs() == []               # their owner is alive and rendering
    later = time.time() + storage.lease_seconds + 5
    assert sorted(await storage.payments.orphaned_jobs(at=later)) == [("call-1", '{"job": 1}'),
                                                                      ("call-2", '{"job": 2}')]
    await storage.payments.record("k1", "unused", reason="crashed_before_priced")   # finished unsettled
    assert await storage.payments.orphaned_jobs() == [("call-1", '{"job": 1}')]
    await storage.payments.note_job("call-1", None)                   # cancelled: no longer an orphan
    await storage.payments.note_job("call-2", None)                   # the render ended
    assert await storage.payments.orphaned_jobs(at=later) == []


async def test_an_orphaned_render_is_taken_by_exactly_one_of_the_processes_that_find_it(url, storage):
    a = await account(storage, 100)
    await storage.ledger.reserve(HoldRequest("keyed", a, 10))
    await storage.ledger.note_job("keyed", '{"job": "k"}')
    await storage.ledger.release("keyed")
    await storage.payments.claim(PaymentClaim("k1", "base", "usdc", "0xpayer", "5000", 5_000, "paid",
                                              settle_with="{}", deadline=2_000_000_000))
    await storage.payments.note_job("paid", '{"job": "p"}')
    await storage.payments.record("k1", "unused", reason="crashed_before_priced")
    others = [await open_storage(url, [], instance_id=f"other-{i}") for i in range(3)]
    try:
        for book, call_id, job in [("ledger", "keyed", '{"job": "k"}'), ("payments", "paid", '{"job": "p"}')]:
            assert await getattr(others[0], book).orphaned_jobs() == [(call_id, job)]
            taken = await asyncio.gather(*[getattr(o, book).take_job(call_id, job) for o in others])
            assert sorted(taken) == [False, False, True]              # exactly one cancels it
            assert await getattr(storage, book).orphaned_jobs() == []
    finally:
        for o in others:
            await o.close()


# ---- migrations -------------------------------------------------------------------------

async def test_plugin_migrations_run_once_per_engine(url):
    steps = [("5000_notes", "CREATE TABLE notes (call_id TEXT)"),
             ("5001_notes_size", {"sqlite": "ALTER TABLE notes ADD COLUMN size INTEGER",
                                  "postgresql": "ALTER TABLE notes ADD COLUMN size BIGINT"})]
    for _ in range(2):                                            # reopening applies nothing twice
        store = await open_storage(url, steps)
        await store.execute("INSERT INTO notes (call_id, size) VALUES (?, ?)", ("c", 3))
        await store.close()
    store = await open_storage(url, steps)
    assert [tuple(r) for r in await store.fetchall("SELECT call_id, size FROM notes")] == [("c", 3), ("c", 3)]
    await store.close()
    with pytest.raises(ValueError, match="no SQL for"):
        await open_storage(url, [("5002_x", {"mysql": "SELECT 1"})])


async def test_sqlite_a_failing_write_is_undone_alone_in_its_batch(tmp_path):
    """Writes sent together share one commit; one that fails halfway keeps none of its work,
    and the others of its batch are committed and answered as if it had not been there."""
    from plugins.storage.sqlite import Engine

    def add(conn, n):
        conn.execute("INSERT INTO t (n) VALUES (?)", (n,))
        return n

    def add_then_fail(conn, n):
        conn.execute("INSERT INTO t (n) VALUES (?)", (n,))
        raise LookupError(f"no {n}")

    engine = Engine(str(tmp_path / "batch.db"))
    await engine.open([("0001_t", "CREATE TABLE t (n INTEGER)")])
    try:
        for failing in (0, 2, 4):         # first, middle and last of the batch
            await engine.transaction(lambda conn: conn.execute("DELETE FROM t"))
            ops = [engine.transaction(add_then_fail if i == failing else add, i) for i in range(5)]
            results = await asyncio.gather(*ops, return_exceptions=True)
            assert [type(r) if isinstance(r, Exception) else r for r in results] == \
                [LookupError if i == failing else i for i in range(5)]
            rows = await engine.run(lambda conn: [r[0] for r in conn.execute("SELECT n FROM t ORDER BY n")])
            assert rows == [i for i in range(5) if i != failing]
    finally:
        await engine.close()
