"""The SQLite store: one aiosqlite connection (WAL), numbered migrations that plugins add
to, and transactions as functions run on the connection's own thread, with group commit.

Why functions and not statements: aiosqlite hops to its worker thread once per
statement. A reserve or settle is several statements; running it as one function costs
one hop, and because the worker runs one function at a time, each is atomic against
every other without an asyncio lock.

Group commit: every `transaction(fn)` joins the next batch. One hop runs the whole batch
inside BEGIN ... COMMIT, each function in its own savepoint (so one failing function is
rolled back alone), and every caller is answered after that commit: as durable as one
transaction each, at a fraction of the cost under load.
"""
from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

import aiosqlite

from . import hookimpl

T = TypeVar("T")


def now() -> int:
    return int(time.time())


CORE_SCHEMA = """
CREATE TABLE accounts (
    id INTEGER PRIMARY KEY,
    name TEXT,
    balance_micro INTEGER NOT NULL DEFAULT 0 CHECK (balance_micro >= 0),
    created_at INTEGER NOT NULL
);
CREATE TABLE api_keys (
    id INTEGER PRIMARY KEY,
    account_id INTEGER NOT NULL REFERENCES accounts(id),
    hash TEXT NOT NULL UNIQUE,          -- sha256 of the whole key; the key itself is never stored
    prefix TEXT NOT NULL,               -- first characters, for display only
    name TEXT,
    agent_id INTEGER,
    created_at INTEGER NOT NULL,
    revoked_at INTEGER
);
-- Append-only: the balance is the sum of an account's entries (cached in accounts).
CREATE TABLE ledger (
    id INTEGER PRIMARY KEY,
    account_id INTEGER NOT NULL REFERENCES accounts(id),
    amount_micro INTEGER NOT NULL,
    kind TEXT NOT NULL,                 -- grant | purchase | bonus | hold | release
    ref TEXT,                           -- call id, order id, ...
    created_at INTEGER NOT NULL
);
CREATE INDEX ledger_by_account ON ledger(account_id);
CREATE INDEX ledger_by_ref ON ledger(ref);
CREATE TABLE holds (
    call_id TEXT PRIMARY KEY,
    account_id INTEGER NOT NULL REFERENCES accounts(id),
    amount_micro INTEGER NOT NULL,
    charge_micro INTEGER,
    status TEXT NOT NULL,               -- open | settled
    created_at INTEGER NOT NULL,
    settled_at INTEGER
);
CREATE INDEX holds_open ON holds(status) WHERE status = 'open';
"""


FREE_SCHEMA = """
CREATE TABLE free_usage (
    account_id INTEGER NOT NULL REFERENCES accounts(id),
    day TEXT NOT NULL,                  -- UTC date
    used_micro INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (account_id, day)
);
ALTER TABLE holds ADD COLUMN free_micro INTEGER NOT NULL DEFAULT 0;
ALTER TABLE holds ADD COLUMN free_day TEXT;
"""


@hookimpl
def gateway_register_migrations(register):
    register("0001_core", CORE_SCHEMA)
    register("0002_free_allowance", FREE_SCHEMA)


class Store:
    def __init__(self, conn: aiosqlite.Connection):
        self._conn = conn
        self._pending: list[tuple[Callable, tuple, asyncio.Future]] = []
        self._flushing: asyncio.Task | None = None

    @classmethod
    async def open(cls, path: str, migrations: list[tuple[str, str]]) -> "Store":
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        conn = await aiosqlite.connect(path, isolation_level=None, check_same_thread=False)
        store = cls(conn)
        await store.call(_setup, migrations)
        return store

    async def close(self) -> None:
        if self._flushing is not None:          # let the last batch commit first
            await self._flushing
        await self._conn.close()

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(sqlite3.Connection, *args)` on the connection's thread, no transaction."""
        # aiosqlite's queue-a-function primitive; the one place we rely on it.
        return await self._conn._execute(fn, self._conn._conn, *args)

    async def transaction(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(conn, *args)` atomically in the next committed batch (rolled back alone if
        it raises). Once queued it runs even if the caller is cancelled."""
        future = asyncio.get_running_loop().create_future()
        self._pending.append((fn, args, future))
        if self._flushing is None:
            self._flushing = asyncio.get_running_loop().create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    results = await self._conn._execute(_run_batch, self._conn._conn, [(f, a) for f, a, _ in batch])
                except BaseException as exc:      # the COMMIT itself failed: nobody's work stuck
                    results = [(False, exc)] * len(batch)
                for (_, _, future), (ok, value) in zip(batch, results):
                    if not future.done():
                        future.set_result(value) if ok else future.set_exception(value)
        finally:
            self._flushing = None

    async def fetchone(self, sql: str, params: tuple = ()) -> sqlite3.Row | None:
        return await self.call(lambda c: c.execute(sql, params).fetchone())

    async def fetchall(self, sql: str, params: tuple = ()) -> list[sqlite3.Row]:
        return await self.call(lambda c: c.execute(sql, params).fetchall())


def _run_batch(conn: sqlite3.Connection, ops: list[tuple[Callable, tuple]]) -> list[tuple[bool, Any]]:
    conn.execute("BEGIN IMMEDIATE")
    results: list[tuple[bool, Any]] = []
    try:
        for fn, args in ops:
            conn.execute("SAVEPOINT op")
            try:
                results.append((True, fn(conn, *args)))
                conn.execute("RELEASE op")
            except Exception as exc:
                conn.execute("ROLLBACK TO op")
                conn.execute("RELEASE op")
                results.append((False, exc))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return results


def _setup(conn: sqlite3.Connection, migrations: list[tuple[str, str]]) -> None:
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")   # WAL: durable across process crashes
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("PRAGMA busy_timeout=5000")    # the CLI may write while the server runs
    conn.execute("CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at INTEGER)")
    done = {r[0] for r in conn.execute("SELECT name FROM _migrations")}
    for name, sql in sorted(migrations):
        if name in done:
            continue
        conn.execute("BEGIN IMMEDIATE")
        if conn.execute("SELECT 1 FROM _migrations WHERE name = ?", (name,)).fetchone():
            conn.execute("COMMIT")            # another process sharing the file applied it meanwhile
            continue
        try:
            for statement in _statements(sql):
                conn.execute(statement)
            conn.execute("INSERT INTO _migrations VALUES (?, ?)", (name, now()))
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")


def _statements(sql: str) -> list[str]:
    lines = [line.split("--", 1)[0] for line in sql.splitlines()]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def collect_migrations(pm) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    pm.hook.gateway_register_migrations(register=lambda name, sql: found.append((name, sql)))
    names = [n for n, _ in found]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise ValueError(f"migration names registered twice: {sorted(dupes)}")
    return found
