"""PostgreSQL's group commit: the reserves and settles of one turn of the event loop go as
one batch (one round trip, one commit), each caller answered its own way, the money exact
to the micro-USD; a batch whose statement fails runs again element by element, so only the
failing one fails."""
import asyncio
import time

import asyncpg
import openai
import pytest

from plugins import keycache
from plugins.storage import HoldRequest, Settlement, UsageRow, open_storage, statements
from plugins.storage.pg_batch import Batcher
from tests.conftest import MICRO, openai_upstream, upstream_cost as cost
from tests.fakes import Reply
from tests.servers import stats_once_quiet

ENGINES = ("postgresql",)               # the gateway tests here run on PostgreSQL only

HI = [{"role": "user", "content": "hi"}]          # 2 characters -> 1 input token estimated


def test_migration_sql_splits_on_semicolons_outside_quotes_and_dollar_quoted_bodies():
    sql = """
    CREATE TABLE t (a TEXT DEFAULT 'x;y', b TEXT DEFAULT 'it''s; -- not a comment');  -- a comment; not a statement
    CREATE FUNCTION f() RETURNS INT LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM 1;   -- kept: inside the body
        RETURN 2;
    END
    $$;
    CREATE FUNCTION g() RETURNS TEXT LANGUAGE sql AS $body$ SELECT '$$;' $body$;
    SELECT a$b$c FROM t
    """
    assert statements(sql) == [
        "CREATE TABLE t (a TEXT DEFAULT 'x;y', b TEXT DEFAULT 'it''s; -- not a comment')",
        "CREATE FUNCTION f() RETURNS INT LANGUAGE plpgsql AS $$\n    BEGIN\n        PERFORM 1;   -- kept: inside the "
        "body\n        RETURN 2;\n    END\n    $$",
        "CREATE FUNCTION g() RETURNS TEXT LANGUAGE sql AS $body$ SELECT '$$;' $body$",
        "SELECT a$b$c FROM t",
    ]


# ---- the ledger, one batch at a time ----------------------------------------------

@pytest.fixture
async def storage(postgres_server):
    store = await open_storage(await postgres_server.fresh_url(), [], instance_id="first")
    yield store
    await store.close()


async def account(store, credits: int, name: str) -> int:
    return await store.keys.create_account(name, f"hash-{name}-{time.monotonic_ns()}", f"chk_{name}", credits)


async def books(store, account_id: int) -> int:
    balance = await store.ledger.balance(account_id)
    assert balance == await store.ledger.entries_sum(account_id)
    return balance


def usage_row(call_id: str, account_id: int, usd_micro: int) -> UsageRow:
    return UsageRow(call_id=call_id, account_id=account_id, key_id=None, agent_id=None, endpoint="chat.completions",
                    requested_model="m", model="m", usd_micro=usd_micro, outcome="ok", billing="{}", created_at=1)


async def test_a_short_reserve_among_ones_that_fit_is_refused_alone_on_one_and_on_two_accounts(storage):
    a, b = await account(storage, 25, "a"), await account(storage, 7, "b")
    # One loop turn, so one batch, taken in this order per account (as the single statements
    # would): a 10 fits, a 20 does not (15 left), a 10 fits, a 5 fits; b 8 does not, b 7 fits.
    asks = [("a1", a, 10), ("b1", b, 8), ("a2", a, 20), ("a3", a, 10), ("b2", b, 7), ("a4", a, 5)]
    results = await asyncio.gather(*[storage.ledger.reserve(HoldRequest(c, acc, n)) for c, acc, n in asks])
    assert [r is not None for r in results] == [True, False, False, True, True, True]
    assert [(r.call_id, r.account_id, r.credit_micro) for r in results if r] == [
        ("a1", a, 10), ("a3", a, 10), ("b2", b, 7), ("a4", a, 5)]
    assert await books(storage, a) == 0 and await books(storage, b) == 0
    holds = await storage.fetchall("SELECT call_id, amount_micro FROM holds ORDER BY call_id")
    assert [tuple(h) for h in holds] == [("a1", 10), ("a3", 10), ("a4", 5), ("b2", 7)]


async def test_a_failing_element_fails_alone_and_the_rest_of_its_batch_stands(storage):
    a = await account(storage, 100, "a")
    # "c2" twice: the batch's statement fails on the second, and each then runs alone.
    asks = [HoldRequest("c1", a, 10), HoldRequest("c2", a, 20), HoldRequest("c2", a, 30), HoldRequest("c3", a, 5)]
    results = await asyncio.gather(*[storage.ledger.reserve(h) for h in asks], return_exceptions=True)
    assert [r.credit_micro for r in (results[0], results[1], results[3])] == [10, 20, 5]
    assert isinstance(results[2], asyncpg.UniqueViolationError)
    assert await books(storage, a) == 100 - 35


async def test_a_batch_of_settles_closes_each_hold_once_and_refunds_exactly(storage):
    a, b = await account(storage, 100, "a"), await account(storage, 100, "b")
    held = await asyncio.gather(*[storage.ledger.reserve(HoldRequest(f"c{i}", a if i % 2 else b, 20))
                                  for i in range(6)])
    assert await books(storage, a) == 40 == await books(storage, b)
    again = Settlement(held[0], 3, 0, usage_row("c0", b, 3))
    settlements = [Settlement(h, i + 1, 0, usage_row(h.call_id, h.account_id, i + 1) if i != 5 else None)
                   for i, h in enumerate(held)]
    closed = await asyncio.gather(*[storage.ledger.settle(s) for s in [*settlements, again]])
    assert closed == [True] * 6 + [False]                   # the second settle of c0 finds it closed
    assert await books(storage, a) == 100 - (2 + 4 + 6)
    assert await books(storage, b) == 100 - (1 + 3 + 5)
    rows = await storage.fetchall("SELECT call_id, usd_micro FROM usage ORDER BY call_id")
    assert [tuple(r) for r in rows] == [("c0", 1), ("c1", 2), ("c2", 3), ("c3", 4), ("c4", 5)]   # c5 had none
    entries = await storage.fetchall("SELECT ref, amount_micro FROM ledger WHERE kind = 'release' ORDER BY id")
    assert [tuple(e) for e in entries] == [(f"c{i}", 20 - (i + 1)) for i in range(6)]


async def test_a_queued_reserve_or_settle_runs_even_if_its_caller_is_cancelled(storage):
    a = await account(storage, 100, "a")
    held = await storage.ledger.reserve(HoldRequest("c1", a, 50))
    callers = [asyncio.ensure_future(storage.ledger.settle(Settlement(held, 20, 0, usage_row("c1", a, 20)))),
               asyncio.ensure_future(storage.ledger.reserve(HoldRequest("c2", a, 30)))]
    await asyncio.sleep(0)                                 # queued; the batch leaves at the end of this turn
    for caller in callers:
        caller.cancel()
    await storage.ledger.drain()
    assert await books(storage, a) == 100 - 20 - 30
    holds = await storage.fetchall("SELECT call_id, status FROM holds ORDER BY call_id")
    assert [tuple(h) for h in holds] == [("c1", "settled"), ("c2", "open")]


# ---- through HTTP --------------------------------------------------------------------

async def commits(server) -> int:
    """Transactions committed in the test database."""
    return await stats_once_quiet(server.url(),
                                  "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")


async def test_200_calls_at_once_from_one_key_are_exact_and_batched(start_gateway, fake_openai, postgres_server,
                                                                   monkeypatch):
    monkeypatch.setattr(keycache, "TTL_SECONDS", 600)   # the key looked up once: the commits counted are the calls'
    gw = await start_gateway(openai_upstream(fake_openai))
    key, account_id = await gw.key(1)
    client = gw.openai(key)
    fake_openai.enqueue(Reply(text="ok", output_tokens=1))
    await client.chat.completions.create(model="up/gpt", max_tokens=256, messages=HI)      # the key known
    spent = cost(1, 1)
    fake_openai.enqueue(*[Reply(text="ok", output_tokens=i) for i in range(1, 201)])
    stats = await asyncpg.connect(postgres_server.url())
    try:
        before = await stats.fetchval("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
    finally:
        await stats.close()
    answers = await asyncio.gather(*[client.chat.completions.create(model="up/gpt", max_tokens=256, messages=HI)
                                     for _ in range(200)])
    charged = sorted(a.model_extra["billing"]["output_tokens_billed"] for a in answers)
    assert charged == list(range(1, 201))
    expected = spent + sum(cost(1, i) for i in range(1, 201))
    assert await gw.balance(account_id) == MICRO - expected == await gw.ledger_sum(account_id)
    rows = await gw.store.fetchall("SELECT output_tokens, usd_micro FROM usage WHERE account_id = ?", (account_id,))
    assert sorted((r["output_tokens"], r["usd_micro"]) for r in rows) == sorted(
        [(1, spent)] + [(i, cost(1, i)) for i in range(1, 201)])
    open_holds = await gw.store.fetchone("SELECT COUNT(*) FROM holds WHERE status = 'open'")
    assert tuple(open_holds) == (0,)
    await gw.store.close()              # its sessions end and report their commits
    delta = await commits(postgres_server) - before
    # One at a time, each call commits twice (its reserve, its settle): 400. Batched, a few dozen at most.
    assert delta < 100, delta


async def test_a_short_call_among_ones_that_fit_gets_402_alone(start_gateway, fake_openai):
    gw = await start_gateway(openai_upstream(fake_openai))
    first, a = await gw.key(0)
    second, b = await gw.key(0)
    small = cost(1, 100)
    await gw.store.ledger.credit(a, 3 * small)           # three small calls each, and no big one, fit
    await gw.store.ledger.credit(b, 2 * small)
    fake_openai.enqueue(*[Reply(output_tokens=100) for _ in range(5)])

    async def call(key: str, max_tokens: int) -> int:
        try:
            await gw.openai(key).chat.completions.create(model="up/gpt", max_tokens=max_tokens, messages=HI)
            return 200
        except openai.APIStatusError as exc:
            return exc.status_code

    plan = [(first, 100), (first, 10_000), (second, 100), (first, 100), (second, 5_000), (first, 100), (second, 100)]
    statuses = await asyncio.gather(*[call(k, n) for k, n in plan])
    assert statuses == [200, 402, 200, 200, 402, 200, 200]
    assert await gw.balance(a) == 0 == await gw.ledger_sum(a)
    assert await gw.balance(b) == 0 == await gw.ledger_sum(b)
    assert len(fake_openai.requests) == 5


async def test_a_batch_cut_short_at_shutdown_fails_its_callers_and_the_store_still_closes():
    """The loop cancels every task when it stops: the callers of the batch on its way learn it
    failed, and closing the store (which drains the batches first) still completes."""
    started = asyncio.Event()

    async def one(args):
        started.set()
        await asyncio.sleep(3600)

    async def many(items):
        raise AssertionError("a batch of one goes alone")

    batcher = Batcher(one, many)
    answer = batcher.submit(("call",), True, False)
    await started.wait()
    sender = next(t for t in asyncio.all_tasks() if t.get_coro().__qualname__ == "Batcher._send")
    closing = asyncio.create_task(batcher.drain())
    await asyncio.sleep(0)              # the store is closing, waiting for the batch
    sender.cancel()                     # as the loop's shutdown does
    await asyncio.wait_for(closing, 1)
    with pytest.raises(RuntimeError, match="cancelled"):
        await answer


def committed_then_lost(many):
    """A batch that commits, after which the connection breaks before its answer arrives."""
    async def run(items):
        await many(items)
        raise ConnectionResetError("connection lost after COMMIT")
    return run


async def test_a_batch_whose_answer_is_lost_after_its_commit_answers_each_caller_as_it_would_have(storage):
    a = await account(storage, 100, "a")
    reserves, settles = storage.ledger._reserves, storage.ledger._settles
    reserves._many = committed_then_lost(reserves._many)        # fault injection: the batch path only
    held = await asyncio.gather(storage.ledger.reserve(HoldRequest("c1", a, 30)),
                                storage.ledger.reserve(HoldRequest("c2", a, 50)),
                                storage.ledger.reserve(HoldRequest("c3", a, 40)))     # 20 left: refused
    assert [h.credit_micro if h else None for h in held] == [30, 50, None]
    assert await books(storage, a) == 20                       # each hold taken once
    settles._many = committed_then_lost(settles._many)
    closed = await asyncio.gather(storage.ledger.settle(Settlement(held[0], 10, 0, usage_row("c1", a, 10))),
                                  storage.ledger.settle(Settlement(held[1], 50, 0, usage_row("c2", a, 50))))
    assert closed == [True, True]                              # charged, and told so
    assert await books(storage, a) == 100 - 10 - 50            # each refund made once
    rows = await storage.fetchall("SELECT call_id, usd_micro FROM usage ORDER BY call_id")
    assert [tuple(r) for r in rows] == [("c1", 10), ("c2", 50)]
