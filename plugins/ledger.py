"""Money operations on the store, each one atomic transaction, all in integer micro-USD.

Invariant: an account's `balance_micro` equals the sum of its ledger entries. A reserve
is a conditional debit (`WHERE balance_micro >= amount`), so concurrent calls can never
overdraw; a settle refunds the unused part of a hold exactly once.
"""
from __future__ import annotations

import sqlite3

from .store import Store, now


def _entry(conn: sqlite3.Connection, account_id: int, amount: int, kind: str, ref: str | None) -> None:
    conn.execute("INSERT INTO ledger (account_id, amount_micro, kind, ref, created_at) VALUES (?,?,?,?,?)",
                 (account_id, amount, kind, ref, now()))
    conn.execute("UPDATE accounts SET balance_micro = balance_micro + ? WHERE id = ?", (amount, account_id))


def _credit(conn, account_id: int, amount: int, kind: str, ref: str | None) -> int:
    if amount < 0:
        raise ValueError("a credit must not be negative")
    _entry(conn, account_id, amount, kind, ref)
    return conn.execute("SELECT balance_micro FROM accounts WHERE id = ?", (account_id,)).fetchone()[0]


async def credit(store: Store, account_id: int, amount_micro: int, kind: str = "grant",
                 ref: str | None = None) -> int:
    """Add credits; returns the new balance."""
    return await store.transaction(_credit, account_id, amount_micro, kind, ref)


def _reserve(conn, account_id: int, amount: int, call_id: str) -> bool:
    cur = conn.execute("UPDATE accounts SET balance_micro = balance_micro - ? "
                       "WHERE id = ? AND balance_micro >= ?", (amount, account_id, amount))
    if cur.rowcount != 1:
        return False
    conn.execute("INSERT INTO ledger (account_id, amount_micro, kind, ref, created_at) VALUES (?,?,?,?,?)",
                 (account_id, -amount, "hold", call_id, now()))
    conn.execute("INSERT INTO holds (call_id, account_id, amount_micro, status, created_at) "
                 "VALUES (?,?,?,'open',?)", (call_id, account_id, amount, now()))
    return True


async def reserve(store: Store, account_id: int, amount_micro: int, call_id: str) -> bool:
    """Hold `amount_micro` for a call; False (nothing changed) when the balance is short."""
    return await store.transaction(_reserve, account_id, amount_micro, call_id)


def _settle(conn, call_id: str, charge: int) -> int | None:
    row = conn.execute("SELECT account_id, amount_micro FROM holds WHERE call_id = ? AND status = 'open'",
                       (call_id,)).fetchone()
    if row is None:
        return None                     # already settled: settling twice is a no-op
    account_id, held = row
    charge = max(0, min(charge, held))  # never more than was held
    if held > charge:
        _entry(conn, account_id, held - charge, "release", call_id)
    conn.execute("UPDATE holds SET status = 'settled', charge_micro = ?, settled_at = ? WHERE call_id = ?",
                 (charge, now(), call_id))
    return charge


async def settle(store: Store, call_id: str, charge_micro: int) -> int | None:
    """Charge `charge_micro` of a call's hold and refund the rest, once. Returns the charge
    (capped at the hold), or None if the hold was already settled."""
    return await store.transaction(_settle, call_id, charge_micro)


def _release_open(conn) -> int:
    rows = conn.execute("SELECT call_id FROM holds WHERE status = 'open'").fetchall()
    for (call_id,) in rows:
        _settle(conn, call_id, 0)
    return len(rows)


async def release_open_holds(store: Store) -> int:
    """At start: holds a crash left open are refunded in full. Returns how many."""
    return await store.transaction(_release_open)


async def balance(store: Store, account_id: int) -> int:
    row = await store.fetchone("SELECT balance_micro FROM accounts WHERE id = ?", (account_id,))
    return row[0] if row else 0


async def ledger_sum(store: Store, account_id: int) -> int:
    row = await store.fetchone("SELECT COALESCE(SUM(amount_micro), 0) FROM ledger WHERE account_id = ?",
                               (account_id,))
    return row[0]
