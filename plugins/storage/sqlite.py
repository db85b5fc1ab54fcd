"""The SQLite backend: one connection (WAL) on one thread of its own, and group commit.

Every write is a function run on that thread, so an operation of several statements costs
one thread hop, and because the thread runs one function at a time, each is atomic
against every other without a lock. Group commit: every write joins the next batch; one
hop runs the whole batch inside BEGIN ... COMMIT, and every caller is answered after that
commit: as durable as one transaction each, at a fraction of the cost under load. Should
a function of the batch fail, the batch is rolled back and run again with each function in
its own savepoint, so that only the failing one is undone. The WAL is checkpointed by a
second connection on a thread of its own (checkpoint.py): a commit waits for a checkpoint
only once in 10,000 WAL pages, when the writer's own bounds the WAL's size.
"""
from __future__ import annotations

import asyncio
import json
import queue
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, TypeVar

from . import for_engine, now, statements
from .checkpoint import WRITER_CHECKPOINT_PAGES, Checkpointer
from .records import (
    PAID_CALL_COLUMNS, USAGE_FIELDS, AgentRegistration, CreditPurchase, HoldRequest, KeyLimit, KeyPolicy, KeyRecord,
    KeySpendLimitReached, PaymentClaim, Reserved, Settlement, UnfinishedPayment, UsageRow, crashed_paid_usage,
    crashed_usage,
)
from .schema import migrations

T = TypeVar("T")
USAGE_INSERT = (f"INSERT OR IGNORE INTO usage ({', '.join(USAGE_FIELDS)}) "
                f"VALUES ({', '.join('?' * len(USAGE_FIELDS))})")
# A None parameter (agent_id, free_day, ...) is not one of the types the sqlite3 module binds
# without asking for an adapter, and asking without one registered costs two failed attribute
# lookups, each formatting an error message (3k instructions). Registered: NULL, as before.
sqlite3.register_adapter(type(None), lambda none: none)
KEY_COLUMNS = ("id, account_id, prefix, name, agent_id, created_at, revoked_at, expires_at, spend_limit_micro, "
               "spend_period, models")


class Engine:
    """The connection, its thread, and the batch of writes waiting for the next commit.

    The thread takes jobs from a queue and answers each through the event loop with one
    callback (no executor futures): a hop costs a queue put and a loop wake-up."""

    def __init__(self, path: str):
        self._path = path
        self._conn: sqlite3.Connection | None = None
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="sqlite", daemon=True)
        self._thread.start()
        self._pending: list[tuple[Callable, tuple, asyncio.Future]] = []
        self._batching = False           # a batch is due to be sent or is on the thread
        self._drained: asyncio.Future | None = None
        self._closed = False
        self._checkpoints: Checkpointer | None = None     # a file's WAL, checkpointed off the writer's thread

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(conn, *args)` on the connection's thread, outside any transaction (reads)."""
        if self._closed:
            raise RuntimeError("the database is closed")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._jobs.put((fn, args, loop, _resolve, future))
        return await future

    async def transaction(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(conn, *args)` atomically in the next committed batch. Once queued it runs
        even if the caller is cancelled."""
        return await self.submit(fn, *args)

    def submit(self, fn: Callable[..., T], *args: Any) -> "asyncio.Future[T]":
        """As `transaction`, queued now: -> the future of its result. A caller that must
        not cancel the write (a reserve) shields this future and needs no task of its own."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if self._closed:
            future.set_exception(RuntimeError("the database is closed"))
            return future
        self._pending.append((fn, args, future))
        if not self._batching:           # the batch leaves once this turn of the loop has added to it
            self._batching = True
            loop.call_soon(self._send_batch)
        return future

    def _send_batch(self) -> None:
        batch, self._pending = self._pending, []
        if self._closed:                 # queued while the database was closing: nobody will run it
            self._batch_done(batch, False, RuntimeError("the database is closed"))
            return
        self._jobs.put((_run_batch, ([(f, a) for f, a, _ in batch],), asyncio.get_running_loop(),
                        self._batch_done, batch))

    def _batch_done(self, batch: list, ok: bool, value: Any) -> None:
        results = value if ok else [(False, value)] * len(batch)   # the COMMIT itself failed: nobody's work stuck
        if ok and self._checkpoints is not None:
            self._checkpoints.committed()
        for (_, _, future), (fine, result) in zip(batch, results):
            _resolve(future, fine, result)
        if self._pending:
            self._send_batch()
        else:
            self._batching = False
            if self._drained is not None and not self._drained.done():
                self._drained.set_result(None)

    def _serve(self) -> None:
        """The connection's thread: run each job, hand its outcome to the loop."""
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, args, loop, answer, target = job
            try:
                value, ok = fn(self._conn, *args), True
            except BaseException as exc:
                value, ok = exc, False
            try:
                loop.call_soon_threadsafe(answer, target, ok, value)
            except RuntimeError:         # the loop has closed: nobody is waiting
                pass
            del job, fn, args, target, value     # hold nothing while idle

    async def open(self, migrations: list[tuple[str, str]]) -> None:
        def connect(_):
            self._conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        await self.run(connect)
        await self.run(_setup, migrations)
        if self._path != ":memory:":
            self._checkpoints = Checkpointer(self._path)

    async def close(self) -> None:
        if self._batching:                       # let the last batch commit first
            self._drained = asyncio.get_running_loop().create_future()
            await self._drained
        if self._closed:
            return
        await self.run(_close, self._checkpoints)
        self._closed = True
        self._jobs.put(None)
        self._thread.join()


def _close(conn: sqlite3.Connection, checkpoints: Checkpointer | None) -> None:
    if checkpoints is not None:          # on the connection's thread: the event loop never waits on the join
        checkpoints.close()
    conn.close()


def _resolve(future: asyncio.Future, ok: bool, value: Any) -> None:
    if not future.done():
        future.set_result(value) if ok else future.set_exception(value)


def _run_batch(conn: sqlite3.Connection, ops: list[tuple[Callable, tuple]]) -> list[tuple[bool, Any]]:
    """The functions get one cursor for the whole batch, not the connection: `conn.execute`
    makes a cursor per statement, which costs about as much as binding the statement. They
    only execute and fetch through it (each fetch before its next statement)."""
    cur = conn.cursor()
    if len(ops) == 1:                   # alone in its batch: its transaction is its savepoint
        return [_run_one(conn, cur, *ops[0])]
    cur.execute("BEGIN IMMEDIATE")
    try:
        try:                            # the usual case: every function succeeds, no savepoints needed
            results = [(True, fn(cur, *args)) for fn, args in ops]
        except Exception:
            # One failed: undo the batch and run it again, each function in its own savepoint so
            # that only a failing one is rolled back. The functions do database work only, so
            # the others do the same again.
            cur.execute("ROLLBACK")
            cur.execute("BEGIN IMMEDIATE")
            results = _each_in_savepoint(cur, ops)
        cur.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            cur.execute("ROLLBACK")
        raise
    return results


def _each_in_savepoint(cur: sqlite3.Cursor, ops: list[tuple[Callable, tuple]]) -> list[tuple[bool, Any]]:
    results: list[tuple[bool, Any]] = []
    for fn, args in ops:
        cur.execute("SAVEPOINT op")
        try:
            results.append((True, fn(cur, *args)))
            cur.execute("RELEASE op")
        except Exception as exc:
            cur.execute("ROLLBACK TO op")
            cur.execute("RELEASE op")
            results.append((False, exc))
    return results


def _run_one(conn: sqlite3.Connection, cur: sqlite3.Cursor, fn: Callable, args: tuple) -> tuple[bool, Any]:
    cur.execute("BEGIN IMMEDIATE")
    try:
        value = fn(cur, *args)
    except Exception as exc:            # the function failed: nothing of it stays
        cur.execute("ROLLBACK")
        return False, exc
    except BaseException:
        cur.execute("ROLLBACK")
        raise
    try:
        cur.execute("COMMIT")
    except BaseException:               # the commit failed: the caller learns it, the connection stays usable
        if conn.in_transaction:
            cur.execute("ROLLBACK")
        raise
    return True, value


def _setup(conn: sqlite3.Connection, migrations: list[tuple[str, str]]) -> None:
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")   # WAL: durable across process crashes
    conn.execute(f"PRAGMA wal_autocheckpoint={WRITER_CHECKPOINT_PAGES}")   # see checkpoint.py
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("PRAGMA busy_timeout=5000")    # the CLI and other workers may write at once
    conn.execute("CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at INTEGER)")
    conn.execute("BEGIN IMMEDIATE")             # one process migrates; the others wait, then skip
    try:
        done = {r[0] for r in conn.execute("SELECT name FROM _migrations")}
        for name, sql in sorted(migrations):
            if name not in done:
                for statement in statements(sql):
                    conn.execute(statement)
                conn.execute("INSERT INTO _migrations VALUES (?, ?)", (name, now()))
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


# ---- the ledger ------------------------------------------------------------------

def _entry(conn, account_id: int, amount: int, kind: str, ref: str | None) -> None:
    conn.execute("INSERT INTO ledger (account_id, amount_micro, kind, ref, created_at) VALUES (?,?,?,?,?)",
                 (account_id, amount, kind, ref, now()))
    conn.execute("UPDATE accounts SET balance_micro = balance_micro + ? WHERE id = ?", (amount, account_id))


def _credit(conn, account_id: int, amount: int, kind: str, ref: str | None) -> int:
    if amount < 0:
        raise ValueError("a credit must not be negative")
    if conn.execute("SELECT 1 FROM accounts WHERE id = ?", (account_id,)).fetchone() is None:
        raise LookupError(f"no account {account_id}")
    _entry(conn, account_id, amount, kind, ref)
    return conn.execute("SELECT balance_micro FROM accounts WHERE id = ?", (account_id,)).fetchone()[0]


def _adjust(conn, account_id: int, amount: int, reason: str) -> int | None:
    """A signed ledger entry by the operator; a negative one only while the balance covers it."""
    cur = conn.execute("UPDATE accounts SET balance_micro = balance_micro + ? WHERE id = ? AND balance_micro + ? >= 0",
                       (amount, account_id, amount))
    if cur.rowcount != 1:
        return None
    conn.execute("INSERT INTO ledger (account_id, amount_micro, kind, ref, created_at) VALUES (?,?,?,?,?)",
                 (account_id, amount, "adjustment", reason, now()))
    return conn.execute("SELECT balance_micro FROM accounts WHERE id = ?", (account_id,)).fetchone()[0]


def _check_key_limit(conn, key_id: int, limit: KeyLimit, credit: int) -> None:
    """Charged since the period began plus holds in flight plus this one, within the limit
    (one writer at a time: nothing can slip in between the sum and the hold)."""
    spent = conn.execute("SELECT COALESCE(SUM(usd_micro), 0) FROM usage WHERE key_id = ? AND created_at >= ?",
                         (key_id, limit.since)).fetchone()[0]
    held = conn.execute("SELECT COALESCE(SUM(amount_micro), 0) FROM holds WHERE key_id = ? AND status = 'open'",
                        (key_id,)).fetchone()[0]
    if spent + held + credit > limit.limit_micro:
        raise KeySpendLimitReached(limit, spent + held)


def _reserve(conn, h: HoldRequest, owner: str, lease_until: int) -> Reserved | None:
    taken, free = 0, h.free
    if free is not None and free.want > 0:
        conn.execute("INSERT OR IGNORE INTO free_usage (account_id, day, used_micro) VALUES (?, ?, 0)",
                     (h.account_id, free.day))
        used = conn.execute("SELECT used_micro FROM free_usage WHERE account_id = ? AND day = ?",
                            (h.account_id, free.day)).fetchone()[0]
        taken = max(0, min(free.want, free.daily - used, h.amount_micro))
    credit = h.amount_micro - taken
    if h.key_limit is not None:
        _check_key_limit(conn, h.key_id, h.key_limit, credit)
    cur = conn.execute("UPDATE accounts SET balance_micro = balance_micro - ? WHERE id = ? AND balance_micro >= ?",
                       (credit, h.account_id, credit))
    if cur.rowcount != 1:
        return None
    if taken:
        conn.execute("UPDATE free_usage SET used_micro = used_micro + ? WHERE account_id = ? AND day = ?",
                     (taken, h.account_id, free.day))
    if credit:
        conn.execute("INSERT INTO ledger (account_id, amount_micro, kind, ref, created_at) VALUES (?,?,?,?,?)",
                     (h.account_id, -credit, "hold", h.call_id, now()))
    day = free.day if free else None
    conn.execute("INSERT INTO holds (call_id, account_id, amount_micro, free_micro, free_day, status, created_at, "
                 "owner, lease_until, key_id, agent_id, endpoint, requested_model, model) "
                 "VALUES (?,?,?,?,?,'open',?,?,?,?,?,?,?,?)",
                 (h.call_id, h.account_id, credit, taken, day, now(), owner, lease_until, h.key_id, h.agent_id,
                  h.endpoint, h.requested_model, h.model))
    return Reserved(h.call_id, h.account_id, credit, taken, day)


def _close_hold(conn, held: Reserved, charge: int, free_use: int, status: str, usage: UsageRow | None) -> bool:
    """Close an open hold: charge, refund the rest of both parts, write the usage row."""
    cur = conn.execute("UPDATE holds SET status = ?, charge_micro = ?, free_micro = ?, settled_at = ? "
                       "WHERE call_id = ? AND status = 'open'", (status, charge, free_use, now(), held.call_id))
    if cur.rowcount != 1:
        return False                    # settled or released already: a second close is a no-op
    if held.free_micro > free_use:
        conn.execute("UPDATE free_usage SET used_micro = used_micro - ? WHERE account_id = ? AND day = ?",
                     (held.free_micro - free_use, held.account_id, held.free_day))
    if held.credit_micro > charge:
        _entry(conn, held.account_id, held.credit_micro - charge, "release", held.call_id)
    if usage is not None:
        _write_usage(conn, usage)
    return True


def _settle(conn, s: Settlement) -> bool:
    return _close_hold(conn, s.held, s.charge_micro, s.free_micro, "settled", s.usage)


def _held(row) -> Reserved:
    return Reserved(row["call_id"], row["account_id"], row["amount_micro"], row["free_micro"], row["free_day"])


def _release(conn, call_id: str) -> bool:
    row = conn.execute("SELECT * FROM holds WHERE call_id = ? AND status = 'open'", (call_id,)).fetchone()
    return row is not None and _close_hold(conn, _held(row), 0, 0, "released", None)


def _release_expired(conn, at: int) -> int:
    rows = conn.execute("SELECT * FROM holds WHERE status = 'open' AND lease_until < ?", (at,)).fetchall()
    for row in rows:
        _close_hold(conn, _held(row), 0, 0, "released", crashed_usage(row, at))
    return len(rows)


def _write_usage(conn, usage: UsageRow) -> None:
    conn.execute(USAGE_INSERT, [getattr(usage, f) for f in USAGE_FIELDS])


def _finish_payment(conn, claim_key: str, status: str, tx: str | None, reason: str | None, amount: int | None,
                    usd_micro: int | None, *, unfinished_only: bool = False):
    """Record how a payment ended; -> the payment as `PAID_CALL_COLUMNS`, None if
    `unfinished_only` and it was finished already."""
    gate = " AND status IN ('claimed', 'settling')" if unfinished_only else ""
    rows = conn.execute(f"UPDATE x402_payments SET status = ?, tx = ?, reason = ?, settled_at = ?, "
                        f"amount = COALESCE(?, amount), usd_micro = COALESCE(?, usd_micro) WHERE claim_key = ?{gate} "
                        f"RETURNING {PAID_CALL_COLUMNS}",
                        (status, tx, reason, now(), None if amount is None else str(amount), usd_micro,
                         claim_key)).fetchall()          # all: the statement completes before the savepoint ends
    return rows[0] if rows else None


def _finish_crashed(conn, claim_key: str, status: str, tx: str | None, reason: str | None, amount: int | None,
                    usd_micro: int | None, note: str) -> bool:
    payment = _finish_payment(conn, claim_key, status, tx, reason, amount, usd_micro, unfinished_only=True)
    if payment is not None:
        _write_usage(conn, crashed_paid_usage(payment, note, now()))
    return payment is not None


def _purchase(conn, o: CreditPurchase) -> tuple[int, int]:
    done = conn.execute("SELECT bonus_micro FROM credit_orders WHERE claim_key = ?", (o.claim_key,)).fetchone()
    if done is not None:                 # credited before (a retry after a crash): never twice
        return done[0], conn.execute("SELECT balance_micro FROM accounts WHERE id = ?", (o.account_id,)).fetchone()[0]
    first = conn.execute("SELECT 1 FROM credit_orders WHERE account_id = ? LIMIT 1", (o.account_id,)).fetchone() is None
    bonus = o.bonus_first_micro if first else o.bonus_micro
    conn.execute("INSERT INTO credit_orders (id, account_id, usd_micro, bonus_micro, claim_key, tx, created_at) "
                 "VALUES (?,?,?,?,?,?,?)", (o.order_id, o.account_id, o.usd_micro, bonus, o.claim_key, o.tx, now()))
    conn.execute("UPDATE x402_payments SET status = 'settled', tx = ?, reason = NULL, settled_at = ? "
                 "WHERE claim_key = ?", (o.tx, now(), o.claim_key))
    balance = _credit(conn, o.account_id, o.usd_micro, "purchase", o.order_id)
    if bonus:
        balance = _credit(conn, o.account_id, bonus, "bonus", o.order_id)
    return bonus, balance


class SQLiteLedger:
    def __init__(self, engine: Engine, owner: str, lease_seconds: int):
        self._db, self._owner, self._lease = engine, owner, lease_seconds

    async def credit(self, account_id: int, amount_micro: int, kind: str = "grant", ref: str | None = None) -> int:
        return await self._db.transaction(_credit, account_id, amount_micro, kind, ref)

    async def adjust(self, account_id: int, amount_micro: int, reason: str) -> int | None:
        return await self._db.transaction(_adjust, account_id, amount_micro, reason)

    # The two writes of every call return the engine's future, queued at once (awaited the same
    # way): no coroutine to step through, and no task when billing shields the reserve.
    def reserve(self, hold: HoldRequest) -> Awaitable[Reserved | None]:
        return self._db.submit(_reserve, hold, self._owner, now() + self._lease)

    def settle(self, settlement: Settlement) -> Awaitable[bool]:
        return self._db.submit(_settle, settlement)

    async def release(self, call_id: str) -> bool:
        return await self._db.transaction(_release, call_id)

    async def balance(self, account_id: int) -> int:
        row = await self._db.run(_one, "SELECT balance_micro FROM accounts WHERE id = ?", (account_id,))
        return row[0] if row else 0

    async def entries_sum(self, account_id: int) -> int:
        row = await self._db.run(_one, "SELECT COALESCE(SUM(amount_micro), 0) FROM ledger WHERE account_id = ?",
                                 (account_id,))
        return row[0]

    async def purchase(self, order: CreditPurchase) -> tuple[int, int]:
        return await self._db.transaction(_purchase, order)

    async def renew_leases(self) -> int:
        return await self._db.transaction(_rowcount, "UPDATE holds SET lease_until = ? WHERE status = 'open' "
                                                     "AND owner = ?", (now() + self._lease, self._owner))

    async def release_expired(self, at: float | None = None) -> int:
        return await self._db.transaction(_release_expired, int(time.time() if at is None else at))

    async def note_job(self, call_id: str, job: str | None) -> None:
        await self._db.transaction(_rowcount, "UPDATE holds SET upstream_job = ? WHERE call_id = ?", (job, call_id))

    async def orphaned_jobs(self) -> list[tuple[str, str]]:
        return [tuple(r) for r in await self._db.run(
            _all, "SELECT call_id, upstream_job FROM holds WHERE upstream_job IS NOT NULL AND status <> 'open'")]

    async def take_job(self, call_id: str, job: str) -> bool:
        return await self._db.transaction(_rowcount, "UPDATE holds SET upstream_job = NULL WHERE call_id = ? "
                                                     "AND upstream_job = ?", (call_id, job)) == 1


# ---- keys, usage, agents, allowance, payments -------------------------------------

def _one(conn, sql: str, params: tuple = ()):
    return conn.execute(sql, params).fetchone()


def _all(conn, sql: str, params: tuple = ()):
    return conn.execute(sql, params).fetchall()


def _rowcount(conn, sql: str, params: tuple = ()) -> int:
    return conn.execute(sql, params).rowcount


def _create_key(conn, account_id: int, key_hash: str, prefix: str, name: str | None,
                policy: KeyPolicy | None = None) -> int:
    p = policy or KeyPolicy()
    return conn.execute("INSERT INTO api_keys (account_id, hash, prefix, name, created_at, expires_at, "
                        "spend_limit_micro, spend_period, models) VALUES (?,?,?,?,?,?,?,?,?)",
                        (account_id, key_hash, prefix, name, now(), p.expires_at, p.spend_limit_micro, p.spend_period,
                         None if p.models is None else json.dumps(list(p.models)))).lastrowid


def _create_account(conn, name: str | None, key_hash: str, prefix: str, credits: int) -> int:
    account_id = conn.execute("INSERT INTO accounts (name, balance_micro, created_at) VALUES (?, 0, ?)",
                              (name, now())).lastrowid
    _create_key(conn, account_id, key_hash, prefix, name)
    if credits:
        _credit(conn, account_id, credits, "grant", "cli")
    return account_id


def _key(row) -> KeyRecord:
    return KeyRecord(*row)


class SQLiteKeys:
    def __init__(self, engine: Engine):
        self._db = engine

    async def create_account(self, name: str | None, key_hash: str, prefix: str, credits_micro: int = 0) -> int:
        return await self._db.transaction(_create_account, name, key_hash, prefix, credits_micro)

    async def create(self, account_id: int, key_hash: str, prefix: str, name: str | None = None,
                     policy: KeyPolicy | None = None) -> int:
        return await self._db.transaction(_create_key, account_id, key_hash, prefix, name, policy)

    async def get(self, key_hash: str) -> KeyRecord | None:
        row = await self._db.run(_one, f"SELECT {KEY_COLUMNS} FROM api_keys WHERE hash = ?", (key_hash,))
        return _key(row) if row else None

    async def with_prefix(self, prefix: str) -> list[KeyRecord]:
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = await self._db.run(_all, f"SELECT {KEY_COLUMNS} FROM api_keys WHERE prefix LIKE ? ESCAPE '\\' "
                                        "ORDER BY id", (escaped + "%",))
        return [_key(r) for r in rows]

    async def list(self, account_id: int) -> list[KeyRecord]:
        rows = await self._db.run(_all, f"SELECT {KEY_COLUMNS} FROM api_keys WHERE account_id = ? ORDER BY id",
                                  (account_id,))
        return [_key(r) for r in rows]

    async def revoke(self, key_id: int) -> bool:
        return await self._db.transaction(_rowcount, "UPDATE api_keys SET revoked_at = ? WHERE id = ? AND "
                                                     "revoked_at IS NULL", (now(), key_id)) == 1


class SQLiteUsage:
    def __init__(self, engine: Engine):
        self._db = engine

    async def record(self, row: UsageRow) -> None:
        await self._db.transaction(_write_usage, row)

    async def recent(self, account_id: int, limit: int = 50) -> list[UsageRow]:
        rows = await self._db.run(_all, f"SELECT {', '.join(USAGE_FIELDS)} FROM usage WHERE account_id = ? "
                                        "ORDER BY id DESC LIMIT ?", (account_id, limit))
        return [UsageRow(*r) for r in rows]


def _register_agent(conn, account_id: int, key_id: int, name: str) -> AgentRegistration:
    row = conn.execute("SELECT id FROM agents WHERE account_id = ? AND name = ?", (account_id, name)).fetchone()
    created = row is None
    agent_id = conn.execute("INSERT INTO agents (account_id, name, created_at) VALUES (?,?,?)",
                            (account_id, name, now())).lastrowid if created else row[0]
    conn.execute("UPDATE api_keys SET agent_id = ? WHERE id = ? AND agent_id IS NULL", (agent_id, key_id))
    current = conn.execute("SELECT agent_id FROM api_keys WHERE id = ?", (key_id,)).fetchone()[0]
    return AgentRegistration(agent_id, created, current == agent_id)


class SQLiteAgents:
    def __init__(self, engine: Engine):
        self._db = engine

    async def register(self, account_id: int, key_id: int, name: str) -> AgentRegistration:
        return await self._db.transaction(_register_agent, account_id, key_id, name)


class SQLiteAllowance:
    def __init__(self, engine: Engine):
        self._db = engine

    async def used(self, account_id: int, day: str) -> int:
        row = await self._db.run(_one, "SELECT used_micro FROM free_usage WHERE account_id = ? AND day = ?",
                                 (account_id, day))
        return row[0] if row else 0


class SQLitePayments:
    def __init__(self, engine: Engine, instance_id: str, lease_seconds: int):
        self._db, self._owner, self._lease = engine, instance_id, lease_seconds

    async def is_claimed(self, claim_key: str) -> bool:
        return await self._db.run(_one, "SELECT 1 FROM x402_payments WHERE claim_key = ?", (claim_key,)) is not None

    async def claim(self, c: PaymentClaim) -> bool:
        return await self._db.transaction(
            _rowcount, "INSERT OR IGNORE INTO x402_payments (claim_key, network, asset, payer, amount, usd_micro, "
                       "ref, status, created_at, scheme, settle_with, deadline, owner, lease_until, endpoint, "
                       "requested_model, model) VALUES (?,?,?,?,?,?,?,'claimed',?,?,?,?,?,?,?,?,?)",
            (c.claim_key, c.network, c.asset, c.payer, c.amount, c.usd_micro, c.ref, now(), c.scheme, c.settle_with,
             c.deadline, self._owner, now() + self._lease, c.endpoint, c.requested_model, c.model)) == 1

    async def owe(self, claim_key: str, amount: int, usd_micro: int) -> None:
        await self._db.transaction(_rowcount, "UPDATE x402_payments SET status = 'settling', due = ?, usd_micro = ? "
                                              "WHERE claim_key = ? AND status = 'claimed'",
                                   (str(amount), usd_micro, claim_key))

    async def record(self, claim_key: str, status: str, tx: str | None = None, reason: str | None = None, *,
                     amount: int | None = None, usd_micro: int | None = None) -> None:
        await self._db.transaction(_finish_payment, claim_key, status, tx, reason, amount, usd_micro)

    async def finish_crashed(self, claim_key: str, status: str, tx: str | None = None, reason: str | None = None,
                             *, amount: int | None = None, usd_micro: int | None = None, note: str) -> bool:
        return await self._db.transaction(_finish_crashed, claim_key, status, tx, reason, amount, usd_micro, note)

    async def renew_leases(self) -> int:
        return await self._db.transaction(
            _rowcount, "UPDATE x402_payments SET lease_until = ? WHERE owner = ? AND status IN ('claimed', 'settling')",
            (now() + self._lease, self._owner))

    async def unfinished(self, at: float | None = None) -> list[UnfinishedPayment]:
        at = int(time.time() if at is None else at)
        rows = await self._db.run(_all, "SELECT claim_key, ref, scheme, settle_with, deadline, due FROM x402_payments "
                                        "WHERE status IN ('claimed', 'settling') AND settle_with IS NOT NULL "
                                        "AND lease_until < ?", (at,))
        return [UnfinishedPayment(*r) for r in rows]

    async def adopt(self, claim_key: str, at: float | None = None) -> bool:
        at = int(time.time() if at is None else at)
        return await self._db.transaction(
            _rowcount, "UPDATE x402_payments SET owner = ?, lease_until = ? WHERE claim_key = ? "
                       "AND status IN ('claimed', 'settling') AND lease_until < ?",
            (self._owner, at + self._lease, claim_key, at)) == 1

    async def note_job(self, call_id: str, job: str | None) -> None:
        await self._db.transaction(_rowcount, "UPDATE x402_payments SET upstream_job = ? WHERE ref = ?", (job, call_id))

    async def orphaned_jobs(self, at: float | None = None) -> list[tuple[str, str]]:
        at = int(time.time() if at is None else at)
        return [tuple(r) for r in await self._db.run(
            _all, "SELECT ref, upstream_job FROM x402_payments WHERE upstream_job IS NOT NULL "
                  "AND (status NOT IN ('claimed', 'settling') OR lease_until < ?)", (at,))]

    async def take_job(self, call_id: str, job: str) -> bool:
        return await self._db.transaction(_rowcount, "UPDATE x402_payments SET upstream_job = NULL WHERE ref = ? "
                                                     "AND upstream_job = ?", (call_id, job)) == 1


class SQLiteStorage:
    engine = "sqlite"

    def __init__(self, db: Engine, instance_id: str, lease_seconds: int):
        self._db = db
        self.instance_id, self.lease_seconds = instance_id, lease_seconds
        self.ledger = SQLiteLedger(db, instance_id, lease_seconds)
        self.keys, self.usage, self.agents = SQLiteKeys(db), SQLiteUsage(db), SQLiteAgents(db)
        self.allowance, self.payments = SQLiteAllowance(db), SQLitePayments(db, instance_id, lease_seconds)

    @classmethod
    async def open(cls, path: str, plugin_steps: list[tuple[str, Any]], instance_id: str,
                   lease_seconds: int) -> "SQLiteStorage":
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        db = Engine(path)
        await db.open(migrations("sqlite") + for_engine(plugin_steps, "sqlite"))
        return cls(db, instance_id, lease_seconds)

    async def fetchone(self, sql: str, params: tuple = ()):
        return await self._db.run(_one, sql, params)

    async def fetchall(self, sql: str, params: tuple = ()) -> list:
        return await self._db.run(_all, sql, params)

    async def execute(self, sql: str, params: tuple = ()) -> None:
        await self._db.transaction(_rowcount, sql, params)

    async def close(self) -> None:
        await self._db.close()
