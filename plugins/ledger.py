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


def _reserve(conn, account_id: int, amount: int, call_id: str, free=None) -> int | None:
    """Hold `amount` for a call, taking up to `free.want` of it from the day's free allowance
    first. -> micro taken from the allowance, or None (nothing changed) if credits are short."""
    taken = 0
    if free is not None and free.want > 0:
        conn.execute("INSERT OR IGNORE INTO free_usage (account_id, day, used_micro) VALUES (?, ?, 0)",
                     (account_id, free.day))
        used = conn.execute("SELECT used_micro FROM free_usage WHERE account_id = ? AND day = ?",
                            (account_id, free.day)).fetchone()[0]
        taken = max(0, min(free.want, free.daily - used, amount))
    credit = amount - taken
    cur = conn.execute("UPDATE accounts SET balance_micro = balance_micro - ? "
                       "WHERE id = ? AND balance_micro >= ?", (credit, account_id, credit))
    if cur.rowcount != 1:
        return None
    if taken:
        conn.execute("UPDATE free_usage SET used_micro = used_micro + ? WHERE account_id = ? AND day = ?",
                     (taken, account_id, free.day))
    if credit:
        conn.execute("INSERT INTO ledger (account_id, amount_micro, kind, ref, created_at) VALUES (?,?,?,?,?)",
                     (account_id, -credit, "hold", call_id, now()))
    conn.execute("INSERT INTO holds (call_id, account_id, amount_micro, free_micro, free_day, status, created_at) "
                 "VALUES (?,?,?,?,?,'open',?)", (call_id, account_id, credit, taken, free.day if free else None,
                                                 now()))
    return taken


async def reserve(store: Store, account_id: int, amount_micro: int, call_id: str, free=None) -> int | None:
    """Hold `amount_micro` for a call (the allowance part first, see `_reserve`)."""
    return await store.transaction(_reserve, account_id, amount_micro, call_id, free)


def _settle(conn, call_id: str, charge: int, free_eligible: int = 0, after=None) -> tuple[int, int] | None:
    row = conn.execute("SELECT account_id, amount_micro, free_micro, free_day FROM holds "
                       "WHERE call_id = ? AND status = 'open'", (call_id,)).fetchone()
    if row is None:
        return None                     # already settled: settling twice is a no-op
    account_id, held, free_held, day = row
    charge = max(0, min(charge, held + free_held))
    # The allowance pays the eligible part first, and always whatever the credit hold
    # cannot cover, so no rounding can drop part of a charge.
    free_use = min(free_held, charge, max(free_eligible, charge - held))
    charge -= free_use
    if free_held > free_use:            # give back the allowance the call did not use
        conn.execute("UPDATE free_usage SET used_micro = used_micro - ? WHERE account_id = ? AND day = ?",
                     (free_held - free_use, account_id, day))
    if held > charge:
        _entry(conn, account_id, held - charge, "release", call_id)
    conn.execute("UPDATE holds SET status = 'settled', charge_micro = ?, free_micro = ?, settled_at = ? "
                 "WHERE call_id = ?", (charge, free_use, now(), call_id))
    if after is not None:               # e.g. the usage row, in the same transaction
        after(conn, charge, free_use)
    return charge, free_use


async def settle(store: Store, call_id: str, charge_micro: int, free_eligible_micro: int = 0,
                 after=None) -> tuple[int, int] | None:
    """Settle a call once: `charge_micro` in all, of which up to `free_eligible_micro` (and
    never less than the credit hold cannot cover) comes from the allowance hold; refund
    the rest of both. -> (charged to credits, used from the allowance), or None if already
    settled."""
    return await store.transaction(_settle, call_id, charge_micro, free_eligible_micro, after)


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
