"""The PostgreSQL backend (asyncpg, one connection pool). Several gateway processes on
several machines share one database: every money operation is one transaction, the
debit a conditional UPDATE (`WHERE balance_micro >= amount`), and row locks, not a
single writer, keep concurrent calls exact.

Lock order, the same in every transaction so none can deadlock another: the hold, the
day's free allowance row, then the account; a transaction of several (a batch of settles
or reserves, pg_batch.py) takes its holds first, then its accounts in ascending id.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import fields
from operator import attrgetter
from typing import Any, Awaitable

import asyncpg

from . import for_engine, now, statements
from .pg_batch import Batcher
from .records import (
    PAID_CALL_COLUMNS, USAGE_FIELDS, AgentRegistration, CreditPurchase, HoldRequest, KeyLimit, KeyPolicy, KeyRecord,
    KeySpendLimitReached, PaymentClaim, Reserved, Settlement, UnfinishedPayment, UsageRow, crashed_paid_usage,
    crashed_usage,
)
from .schema import migrations

MIGRATION_LOCK = 0x6761_7465_7761_79      # pg_advisory_xact_lock key: one process migrates at a time
USAGE_INSERT = (f"INSERT INTO usage ({', '.join(USAGE_FIELDS)}) "
                f"VALUES ({', '.join(f'${i}' for i in range(1, len(USAGE_FIELDS) + 1))}) "
                "ON CONFLICT (call_id) DO NOTHING")
KEY_COLUMNS = ("id, account_id, prefix, name, agent_id, created_at, revoked_at, expires_at, spend_limit_micro, "
               "spend_period, models")


def _dollar_params(sql: str) -> str:
    """'... a = ? AND b = ?' -> '... a = $1 AND b = $2' (outside quoted strings)."""
    count = 0

    def number(match: re.Match) -> str:
        nonlocal count
        if match.group(0) != "?":
            return match.group(0)
        count += 1
        return f"${count}"
    return re.sub(r"'(?:[^']|'')*'|\?", number, sql)


async def _keep_session(conn: asyncpg.Connection) -> None:
    """A connection goes back to the pool as it is. asyncpg's default reset is one more round
    trip per checkout (RESET ALL, unlock advisory locks, UNLISTEN): the gateway never changes
    session state (its only lock is transaction-scoped), so there is nothing to reset."""


def _changed(status: str) -> int:
    """asyncpg's command tag 'UPDATE 1' / 'INSERT 0 1' -> rows changed."""
    return int(status.rsplit(" ", 1)[-1])


async def _migrate(conn: asyncpg.Connection, steps: list[tuple[str, str]]) -> None:
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
        await conn.execute("CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at BIGINT)")
        done = {r[0] for r in await conn.fetch("SELECT name FROM _migrations")}
        for name, sql in sorted(steps):
            if name not in done:
                for statement in statements(sql):
                    await conn.execute(statement)
                await conn.execute("INSERT INTO _migrations VALUES ($1, $2)", name, now())


# ---- the ledger ------------------------------------------------------------------

async def _entry(c, account_id: int, amount: int, kind: str, ref: str | None) -> int:
    await c.execute("INSERT INTO ledger (account_id, amount_micro, kind, ref, created_at) VALUES ($1,$2,$3,$4,$5)",
                    account_id, amount, kind, ref, now())
    balance = await c.fetchval("UPDATE accounts SET balance_micro = balance_micro + $1 WHERE id = $2 "
                               "RETURNING balance_micro", amount, account_id)
    if balance is None:
        raise LookupError(f"no account {account_id}")
    return balance


async def _credit(c, account_id: int, amount: int, kind: str, ref: str | None) -> int:
    if amount < 0:
        raise ValueError("a credit must not be negative")
    return await _entry(c, account_id, amount, kind, ref)


async def _close_hold(c, held: Reserved, charge: int, free_use: int, usage: UsageRow | None) -> None:
    """Refund what an hold (already marked closed) did not use, and write its usage row."""
    if held.free_micro > free_use:
        await c.execute("UPDATE free_usage SET used_micro = used_micro - $1 WHERE account_id = $2 AND day = $3",
                        held.free_micro - free_use, held.account_id, held.free_day)
    if held.credit_micro > charge:
        await _entry(c, held.account_id, held.credit_micro - charge, "release", held.call_id)
    if usage is not None:
        await _write_usage(c, usage)


async def _write_usage(c, usage: UsageRow) -> None:
    await c.execute(USAGE_INSERT, *[getattr(usage, f) for f in USAGE_FIELDS])


async def _check_key_limit(c, key_id: int, limit: KeyLimit, credit: int) -> None:
    """Charged since the period began plus holds in flight plus this one, within the limit
    (the caller holds the key's row lock, so no other reserve of the key is in between)."""
    spent = await c.fetchval("SELECT COALESCE(SUM(usd_micro), 0) FROM usage WHERE key_id = $1 AND created_at >= $2",
                             key_id, limit.since)
    held = await c.fetchval("SELECT COALESCE(SUM(amount_micro), 0) FROM holds WHERE key_id = $1 AND status = 'open'",
                            key_id)
    if int(spent) + int(held) + credit > limit.limit_micro:
        raise KeySpendLimitReached(limit, int(spent) + int(held))


# The common reserve (no free allowance to take, no key spend limit) as one statement: one round
# trip, committed on its own, and the account's row lock held for that statement only (a hot
# account's concurrent calls queue on it). The debit's condition gates both inserts.
FAST_RESERVE = """
WITH debit AS (UPDATE accounts SET balance_micro = balance_micro - $3::bigint
               WHERE id = $2 AND balance_micro >= $3::bigint RETURNING id),
     entry AS (INSERT INTO ledger (account_id, amount_micro, kind, ref, created_at)
               SELECT id, -$3::bigint, 'hold', $1::text, $4::bigint FROM debit WHERE $3::bigint > 0),
     hold AS (INSERT INTO holds (call_id, account_id, amount_micro, free_micro, free_day, status, created_at,
                                 owner, lease_until, key_id, agent_id, endpoint, requested_model, model)
              SELECT $1::text, id, $3::bigint, 0, NULL, 'open', $4::bigint, $5::text, $6::bigint, $7::bigint,
                     $8::bigint, $9::text, $10::text, $11::text FROM debit
              RETURNING call_id)
SELECT count(*) FROM hold
"""

# The common settle (nothing to give back to the free allowance) as one statement: close the
# hold, refund what it did not use, write the usage row; every part gated on the hold having
# been open, so a second settle changes nothing.
_FAST_SETTLE = """
WITH closed AS (UPDATE holds SET status = 'settled', charge_micro = $1, free_micro = $2, settled_at = $3::bigint
                WHERE call_id = $4::text AND status = 'open' RETURNING account_id),
     back AS (UPDATE accounts SET balance_micro = balance_micro + $5::bigint
              WHERE id = (SELECT account_id FROM closed) AND $5::bigint > 0 RETURNING id),
     entry AS (INSERT INTO ledger (account_id, amount_micro, kind, ref, created_at)
               SELECT id, $5::bigint, 'release', $4::text, $3::bigint FROM back){usage}
SELECT count(*) FROM closed
"""
_USAGE_VALUES = ", ".join(f"${i}::{'bigint' if 'int' in str(f.type) else 'text'}"   # typed: a SELECT list
                          for i, f in enumerate(fields(UsageRow), start=6))         # gives no column types
_SETTLE_USAGE = f""",
     used AS (INSERT INTO usage ({', '.join(USAGE_FIELDS)}) SELECT {_USAGE_VALUES} FROM closed
              ON CONFLICT (call_id) DO NOTHING)"""
FAST_SETTLE = _FAST_SETTLE.format(usage="")
FAST_SETTLE_WITH_USAGE = _FAST_SETTLE.format(usage=_SETTLE_USAGE)

# Marks an open hold released and returns it as it was (a CTE sees the row before the update).
RELEASE = """
WITH old AS (SELECT * FROM holds WHERE call_id = $1 AND status = 'open' AND lease_until < $2 FOR UPDATE)
UPDATE holds h SET status = 'released', charge_micro = 0, free_micro = 0, settled_at = $3 FROM old
WHERE h.call_id = old.call_id RETURNING old.*
"""


# An element's own work, found in place when it runs again after its batch failed.
HOLD_MADE = ("SELECT 1 FROM holds WHERE call_id = $1 AND account_id = $2 AND amount_micro = $3 AND created_at = $4 "
             "AND owner = $5")
HOLD_SETTLED = ("SELECT 1 FROM holds WHERE charge_micro = $1 AND free_micro = $2 AND settled_at = $3 "
                "AND call_id = $4 AND status = 'settled'")
# A batch's arguments are its elements' columns: a reserve's 10 and the owner; a settle's
# 5 (charge, free, settled at, call id, refund) and its usage row's.
_SETTLE_HEAD = 5
RESERVE_BATCH = "SELECT reserve_batch(" + ", ".join(f"${i}" for i in range(1, 12)) + ")"
SETTLE_BATCH = ("SELECT settle_batch(" + ", ".join(f"${i}" for i in range(1, _SETTLE_HEAD + len(USAGE_FIELDS) + 1))
                + ")")
_NO_USAGE = (None,) * len(USAGE_FIELDS)
_usage_values = attrgetter(*USAGE_FIELDS)          # a usage row -> its values in USAGE_FIELDS order


class PostgresLedger:
    def __init__(self, pool: asyncpg.Pool, owner: str, lease_seconds: int):
        self._pool, self._owner, self._lease = pool, owner, lease_seconds
        self._reserves = Batcher(self._reserve_one, self._reserve_many, self._reserve_again)
        self._settles = Batcher(self._settle_one, self._settle_many, self._settle_again)

    async def drain(self) -> None:
        """Every queued reserve and settle answered."""
        await self._reserves.drain()
        await self._settles.drain()

    # The two writes of every call, when they take the fast path, join a batch (pg_batch.py)
    # and return its future: no coroutine to step through, and no task when billing shields it.

    async def _reserve_one(self, a: tuple) -> bool:
        return await self._pool.fetchval(FAST_RESERVE, *a[:4], self._owner, *a[4:])

    async def _reserve_many(self, items: list[tuple]) -> list[bool]:
        columns = list(zip(*items))
        return await self._pool.fetchval(RESERVE_BATCH, *columns[:4], self._owner, *columns[4:])

    async def _settle_one(self, a: tuple) -> bool:
        if a[_SETTLE_HEAD] is None:                 # the usage row's call id: no row
            return await self._pool.fetchval(FAST_SETTLE, *a[:_SETTLE_HEAD]) == 1
        return await self._pool.fetchval(FAST_SETTLE_WITH_USAGE, *a) == 1

    async def _settle_many(self, items: list[tuple]) -> list[bool]:
        return await self._pool.fetchval(SETTLE_BATCH, *zip(*items))

    # Run alone after their batch failed: if the batch committed before the failure reached
    # this process, an element's own work is already in place (pg_batch's docstring).

    async def _reserve_again(self, a: tuple) -> bool:
        try:
            made = await self._reserve_one(a)       # refused when the batch's debit left too little
        except asyncpg.UniqueViolationError:
            if await self._hold_made(a):
                return True
            raise                                   # another call's hold: a duplicate call id
        return made or await self._hold_made(a)

    async def _hold_made(self, a: tuple) -> bool:
        return await self._pool.fetchval(HOLD_MADE, a[0], a[1], a[2], a[3], self._owner) is not None

    async def _settle_again(self, a: tuple) -> bool:
        return await self._settle_one(a) or await self._pool.fetchval(HOLD_SETTLED, *a[:4]) is not None

    async def credit(self, account_id: int, amount_micro: int, kind: str = "grant", ref: str | None = None) -> int:
        async with self._pool.acquire() as c, c.transaction():
            return await _credit(c, account_id, amount_micro, kind, ref)

    async def adjust(self, account_id: int, amount_micro: int, reason: str) -> int | None:
        async with self._pool.acquire() as c, c.transaction():
            balance = await c.fetchval("UPDATE accounts SET balance_micro = balance_micro + $1 WHERE id = $2 "
                                       "AND balance_micro + $1 >= 0 RETURNING balance_micro", amount_micro, account_id)
            if balance is None:
                return None
            await c.execute("INSERT INTO ledger (account_id, amount_micro, kind, ref, created_at) "
                            "VALUES ($1,$2,'adjustment',$3,$4)", account_id, amount_micro, reason, now())
            return balance

    def reserve(self, h: HoldRequest) -> Awaitable[Reserved | None]:
        if h.key_limit is None and (h.free is None or h.free.want <= 0):
            at = now()
            return self._reserves.submit((h.call_id, h.account_id, h.amount_micro, at, at + self._lease, h.key_id,
                                          h.agent_id, h.endpoint, h.requested_model, h.model),
                                         Reserved(h.call_id, h.account_id, h.amount_micro, 0, None), None)
        return self._reserve(h)

    async def _reserve(self, h: HoldRequest) -> Reserved | None:
        async with self._pool.acquire() as c, c.transaction():
            if h.key_limit is not None:      # the key's row lock: its reserves take turns, so none overshoots
                await c.execute("SELECT 1 FROM api_keys WHERE id = $1 FOR UPDATE", h.key_id)
            taken, free = 0, h.free
            if free is not None and free.want > 0:
                # The upsert locks the day's row: concurrent reserves of one account take turns.
                used = await c.fetchval(
                    "INSERT INTO free_usage (account_id, day, used_micro) VALUES ($1, $2, 0) ON CONFLICT "
                    "(account_id, day) DO UPDATE SET used_micro = free_usage.used_micro RETURNING used_micro",
                    h.account_id, free.day)
                taken = max(0, min(free.want, free.daily - used, h.amount_micro))
            credit = h.amount_micro - taken
            if h.key_limit is not None:
                await _check_key_limit(c, h.key_id, h.key_limit, credit)
            debited = await c.execute("UPDATE accounts SET balance_micro = balance_micro - $1 "
                                      "WHERE id = $2 AND balance_micro >= $1", credit, h.account_id)
            if _changed(debited) != 1:
                return None
            if taken:
                await c.execute("UPDATE free_usage SET used_micro = used_micro + $1 WHERE account_id = $2 "
                                "AND day = $3", taken, h.account_id, free.day)
            if credit:
                await c.execute("INSERT INTO ledger (account_id, amount_micro, kind, ref, created_at) "
                                "VALUES ($1,$2,'hold',$3,$4)", h.account_id, -credit, h.call_id, now())
            day = free.day if free else None
            await c.execute(
                "INSERT INTO holds (call_id, account_id, amount_micro, free_micro, free_day, status, created_at, "
                "owner, lease_until, key_id, agent_id, endpoint, requested_model, model) "
                "VALUES ($1,$2,$3,$4,$5,'open',$6,$7,$8,$9,$10,$11,$12,$13)",
                h.call_id, h.account_id, credit, taken, day, now(), self._owner, now() + self._lease, h.key_id,
                h.agent_id, h.endpoint, h.requested_model, h.model)
            return Reserved(h.call_id, h.account_id, credit, taken, day)

    def settle(self, s: Settlement) -> Awaitable[bool]:
        if s.free_micro == s.held.free_micro:           # nothing to give back to the free allowance
            usage = _NO_USAGE if s.usage is None else _usage_values(s.usage)
            return self._settles.submit((s.charge_micro, s.free_micro, now(), s.held.call_id,
                                         s.held.credit_micro - s.charge_micro, *usage), True, False)
        return self._settle(s)

    async def _settle(self, s: Settlement) -> bool:
        async with self._pool.acquire() as c, c.transaction():
            closed = await c.execute("UPDATE holds SET status = 'settled', charge_micro = $1, free_micro = $2, "
                                     "settled_at = $3 WHERE call_id = $4 AND status = 'open'",
                                     s.charge_micro, s.free_micro, now(), s.held.call_id)
            if _changed(closed) != 1:
                return False            # settled or released already: a second close is a no-op
            await _close_hold(c, s.held, s.charge_micro, s.free_micro, s.usage)
            return True

    async def _release(self, call_id: str, expired_before: int, crashed: bool) -> bool:
        async with self._pool.acquire() as c, c.transaction():
            row = await c.fetchrow(RELEASE, call_id, expired_before, now())
            if row is None:
                return False
            held = Reserved(call_id, row["account_id"], row["amount_micro"], row["free_micro"], row["free_day"])
            await _close_hold(c, held, 0, 0, crashed_usage(row, now()) if crashed else None)
            return True

    async def release(self, call_id: str) -> bool:
        return await self._release(call_id, 2**62, crashed=False)

    async def balance(self, account_id: int) -> int:
        return await self._pool.fetchval("SELECT balance_micro FROM accounts WHERE id = $1", account_id) or 0

    async def entries_sum(self, account_id: int) -> int:
        return await self._pool.fetchval("SELECT COALESCE(SUM(amount_micro), 0)::BIGINT FROM ledger "
                                         "WHERE account_id = $1", account_id)

    async def purchase(self, o: CreditPurchase) -> tuple[int, int]:
        async with self._pool.acquire() as c, c.transaction():
            # Lock the account first: two orders of one account at once see each other.
            await c.execute("SELECT 1 FROM accounts WHERE id = $1 FOR UPDATE", o.account_id)
            done = await c.fetchval("SELECT bonus_micro FROM credit_orders WHERE claim_key = $1", o.claim_key)
            if done is not None:         # credited before (a retry after a crash): never twice
                return done, await c.fetchval("SELECT balance_micro FROM accounts WHERE id = $1", o.account_id)
            first = await c.fetchval("SELECT 1 FROM credit_orders WHERE account_id = $1 LIMIT 1", o.account_id) is None
            bonus = o.bonus_first_micro if first else o.bonus_micro
            await c.execute("INSERT INTO credit_orders (id, account_id, usd_micro, bonus_micro, claim_key, tx, "
                            "created_at) VALUES ($1,$2,$3,$4,$5,$6,$7)", o.order_id, o.account_id, o.usd_micro,
                            bonus, o.claim_key, o.tx, now())
            await c.execute("UPDATE x402_payments SET status = 'settled', tx = $1, reason = NULL, settled_at = $2 "
                            "WHERE claim_key = $3", o.tx, now(), o.claim_key)
            balance = await _credit(c, o.account_id, o.usd_micro, "purchase", o.order_id)
            if bonus:
                balance = await _credit(c, o.account_id, bonus, "bonus", o.order_id)
            return bonus, balance

    async def renew_leases(self) -> int:
        return _changed(await self._pool.execute("UPDATE holds SET lease_until = $1 WHERE status = 'open' "
                                                 "AND owner = $2", now() + self._lease, self._owner))

    async def release_expired(self, at: float | None = None) -> int:
        """Each hold in a transaction of its own; the conditional update makes two
        sweepers (or a late settle) close a hold once."""
        at = int(time.time() if at is None else at)
        rows = await self._pool.fetch("SELECT call_id FROM holds WHERE status = 'open' AND lease_until < $1", at)
        return sum([await self._release(r["call_id"], at, crashed=True) for r in rows])

    async def note_job(self, call_id: str, job: str | None) -> None:
        await self._pool.execute("UPDATE holds SET upstream_job = $1 WHERE call_id = $2", job, call_id)

    async def orphaned_jobs(self) -> list[tuple[str, str]]:
        rows = await self._pool.fetch("SELECT call_id, upstream_job FROM holds WHERE upstream_job IS NOT NULL "
                                      "AND status <> 'open'")
        return [(r["call_id"], r["upstream_job"]) for r in rows]

    async def take_job(self, call_id: str, job: str) -> bool:
        return _changed(await self._pool.execute(
            "UPDATE holds SET upstream_job = NULL WHERE call_id = $1 AND upstream_job = $2", call_id, job)) == 1


# ---- keys, usage, agents, allowance, payments -------------------------------------

class PostgresKeys:
    def __init__(self, pool: asyncpg.Pool):
        self._pool = pool

    async def create_account(self, name: str | None, key_hash: str, prefix: str, credits_micro: int = 0) -> int:
        async with self._pool.acquire() as c, c.transaction():
            account_id = await c.fetchval("INSERT INTO accounts (name, balance_micro, created_at) VALUES ($1, 0, $2) "
                                          "RETURNING id", name, now())
            await self._insert(c, account_id, key_hash, prefix, name)
            if credits_micro:
                await _credit(c, account_id, credits_micro, "grant", "cli")
            return account_id

    @staticmethod
    async def _insert(c, account_id: int, key_hash: str, prefix: str, name: str | None,
                      policy: KeyPolicy | None = None) -> int:
        p = policy or KeyPolicy()
        return await c.fetchval("INSERT INTO api_keys (account_id, hash, prefix, name, created_at, expires_at, "
                                "spend_limit_micro, spend_period, models) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9) "
                                "RETURNING id", account_id, key_hash, prefix, name, now(), p.expires_at,
                                p.spend_limit_micro, p.spend_period,
                                None if p.models is None else json.dumps(list(p.models)))

    async def create(self, account_id: int, key_hash: str, prefix: str, name: str | None = None,
                     policy: KeyPolicy | None = None) -> int:
        return await self._insert(self._pool, account_id, key_hash, prefix, name, policy)

    async def get(self, key_hash: str) -> KeyRecord | None:
        row = await self._pool.fetchrow(f"SELECT {KEY_COLUMNS} FROM api_keys WHERE hash = $1", key_hash)
        return KeyRecord(*row) if row else None

    async def with_prefix(self, prefix: str) -> list[KeyRecord]:
        rows = await self._pool.fetch(f"SELECT {KEY_COLUMNS} FROM api_keys WHERE starts_with(prefix, $1) "
                                      "ORDER BY id", prefix)
        return [KeyRecord(*r) for r in rows]

    async def list(self, account_id: int) -> list[KeyRecord]:
        rows = await self._pool.fetch(f"SELECT {KEY_COLUMNS} FROM api_keys WHERE account_id = $1 ORDER BY id",
                                      account_id)
        return [KeyRecord(*r) for r in rows]

    async def revoke(self, key_id: int) -> bool:
        return _changed(await self._pool.execute("UPDATE api_keys SET revoked_at = $1 WHERE id = $2 AND "
                                                 "revoked_at IS NULL", now(), key_id)) == 1


class PostgresUsage:
    def __init__(self, pool: asyncpg.Pool):
        self._pool = pool

    async def record(self, row: UsageRow) -> None:
        await _write_usage(self._pool, row)

    async def recent(self, account_id: int, limit: int = 50) -> list[UsageRow]:
        rows = await self._pool.fetch(f"SELECT {', '.join(USAGE_FIELDS)} FROM usage WHERE account_id = $1 "
                                      "ORDER BY id DESC LIMIT $2", account_id, limit)
        return [UsageRow(*r) for r in rows]


class PostgresAgents:
    def __init__(self, pool: asyncpg.Pool):
        self._pool = pool

    async def register(self, account_id: int, key_id: int, name: str) -> AgentRegistration:
        async with self._pool.acquire() as c, c.transaction():
            agent_id = await c.fetchval("INSERT INTO agents (account_id, name, created_at) VALUES ($1,$2,$3) "
                                        "ON CONFLICT (account_id, name) DO NOTHING RETURNING id",
                                        account_id, name, now())
            created = agent_id is not None
            if not created:
                agent_id = await c.fetchval("SELECT id FROM agents WHERE account_id = $1 AND name = $2",
                                            account_id, name)
            await c.execute("UPDATE api_keys SET agent_id = $1 WHERE id = $2 AND agent_id IS NULL", agent_id, key_id)
            current = await c.fetchval("SELECT agent_id FROM api_keys WHERE id = $1", key_id)
            return AgentRegistration(agent_id, created, current == agent_id)


class PostgresAllowance:
    def __init__(self, pool: asyncpg.Pool):
        self._pool = pool

    async def used(self, account_id: int, day: str) -> int:
        return await self._pool.fetchval("SELECT used_micro FROM free_usage WHERE account_id = $1 AND day = $2",
                                         account_id, day) or 0


async def _finish_payment(c, claim_key: str, status: str, tx: str | None, reason: str | None, amount: int | None,
                          usd_micro: int | None, *, unfinished_only: bool = False):
    """Record how a payment ended; -> the payment as `PAID_CALL_COLUMNS`, None if
    `unfinished_only` and it was finished already."""
    gate = " AND status IN ('claimed', 'settling')" if unfinished_only else ""
    return await c.fetchrow(f"UPDATE x402_payments SET status = $1, tx = $2, reason = $3, settled_at = $4, "
                            f"amount = COALESCE($5, amount), usd_micro = COALESCE($6, usd_micro) "
                            f"WHERE claim_key = $7{gate} RETURNING {PAID_CALL_COLUMNS}",
                            status, tx, reason, now(), None if amount is None else str(amount), usd_micro, claim_key)


class PostgresPayments:
    def __init__(self, pool: asyncpg.Pool, instance_id: str, lease_seconds: int):
        self._pool, self._owner, self._lease = pool, instance_id, lease_seconds

    async def is_claimed(self, claim_key: str) -> bool:
        return await self._pool.fetchval("SELECT 1 FROM x402_payments WHERE claim_key = $1", claim_key) is not None

    async def claim(self, c: PaymentClaim) -> bool:
        return _changed(await self._pool.execute(
            "INSERT INTO x402_payments (claim_key, network, asset, payer, amount, usd_micro, ref, status, created_at, "
            "scheme, settle_with, deadline, owner, lease_until, endpoint, requested_model, model) VALUES ($1,$2,$3,$4,"
            "$5,$6,$7,'claimed',$8,$9,$10,$11,$12,$13,$14,$15,$16) ON CONFLICT (claim_key) DO NOTHING", c.claim_key,
            c.network, c.asset, c.payer, c.amount, c.usd_micro, c.ref, now(), c.scheme, c.settle_with, c.deadline,
            self._owner, now() + self._lease, c.endpoint, c.requested_model, c.model)) == 1

    async def owe(self, claim_key: str, amount: int, usd_micro: int) -> None:
        await self._pool.execute("UPDATE x402_payments SET status = 'settling', due = $1, usd_micro = $2 "
                                 "WHERE claim_key = $3 AND status = 'claimed'", str(amount), usd_micro, claim_key)

    async def record(self, claim_key: str, status: str, tx: str | None = None, reason: str | None = None, *,
                     amount: int | None = None, usd_micro: int | None = None) -> None:
        await _finish_payment(self._pool, claim_key, status, tx, reason, amount, usd_micro)

    async def finish_crashed(self, claim_key: str, status: str, tx: str | None = None, reason: str | None = None,
                             *, amount: int | None = None, usd_micro: int | None = None, note: str) -> bool:
        async with self._pool.acquire() as c, c.transaction():
            payment = await _finish_payment(c, claim_key, status, tx, reason, amount, usd_micro, unfinished_only=True)
            if payment is not None:
                await _write_usage(c, crashed_paid_usage(payment, note, now()))
            return payment is not None

    async def renew_leases(self) -> int:
        return _changed(await self._pool.execute(
            "UPDATE x402_payments SET lease_until = $1 WHERE owner = $2 AND status IN ('claimed', 'settling')",
            now() + self._lease, self._owner))

    async def unfinished(self, at: float | None = None) -> list[UnfinishedPayment]:
        at = int(time.time() if at is None else at)
        rows = await self._pool.fetch("SELECT claim_key, ref, scheme, settle_with, deadline, due FROM x402_payments "
                                      "WHERE status IN ('claimed', 'settling') AND settle_with IS NOT NULL "
                                      "AND lease_until < $1", at)
        return [UnfinishedPayment(*r) for r in rows]

    async def adopt(self, claim_key: str, at: float | None = None) -> bool:
        at = int(time.time() if at is None else at)
        return _changed(await self._pool.execute(
            "UPDATE x402_payments SET owner = $1, lease_until = $2 WHERE claim_key = $3 "
            "AND status IN ('claimed', 'settling') AND lease_until < $4", self._owner, at + self._lease, claim_key,
            at)) == 1

    async def note_job(self, call_id: str, job: str | None) -> None:
        await self._pool.execute("UPDATE x402_payments SET upstream_job = $1 WHERE ref = $2", job, call_id)

    async def orphaned_jobs(self, at: float | None = None) -> list[tuple[str, str]]:
        at = int(time.time() if at is None else at)
        rows = await self._pool.fetch("SELECT ref, upstream_job FROM x402_payments WHERE upstream_job IS NOT NULL "
                                      "AND (status NOT IN ('claimed', 'settling') OR lease_until < $1)", at)
        return [(r["ref"], r["upstream_job"]) for r in rows]

    async def take_job(self, call_id: str, job: str) -> bool:
        return _changed(await self._pool.execute(
            "UPDATE x402_payments SET upstream_job = NULL WHERE ref = $1 AND upstream_job = $2", call_id, job)) == 1


class PostgresStorage:
    engine = "postgresql"

    def __init__(self, pool: asyncpg.Pool, instance_id: str, lease_seconds: int):
        self._pool = pool
        self.instance_id, self.lease_seconds = instance_id, lease_seconds
        self.ledger = PostgresLedger(pool, instance_id, lease_seconds)
        self.keys, self.usage, self.agents = PostgresKeys(pool), PostgresUsage(pool), PostgresAgents(pool)
        self.allowance, self.payments = PostgresAllowance(pool), PostgresPayments(pool, instance_id, lease_seconds)

    @classmethod
    async def open(cls, dsn: str, plugin_steps: list[tuple[str, Any]], instance_id: str,
                   lease_seconds: int) -> "PostgresStorage":
        steps = migrations("postgresql") + for_engine(plugin_steps, "postgresql")
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=20, reset=_keep_session)
        try:
            async with pool.acquire() as conn:
                await _migrate(conn, steps)
        except BaseException:
            await pool.close()
            raise
        return cls(pool, instance_id, lease_seconds)

    async def fetchone(self, sql: str, params: tuple = ()):
        return await self._pool.fetchrow(_dollar_params(sql), *params)

    async def fetchall(self, sql: str, params: tuple = ()) -> list:
        return await self._pool.fetch(_dollar_params(sql), *params)

    async def execute(self, sql: str, params: tuple = ()) -> None:
        await self._pool.execute(_dollar_params(sql), *params)

    async def close(self) -> None:
        await self.ledger.drain()
        await self._pool.close()
