"""The admin API's writes: credit adjustments (a ledger entry, never an edit), keys for an
existing account, revocation, and the admin keys themselves."""
from __future__ import annotations

import hashlib
import secrets

from plugins.auth import display_prefix, hash_key, new_key as new_account_key
from plugins.store import Store, now

MAX_ADJUST_MICRO = 100_000 * 1_000_000      # one adjustment at most: a typo must not mint a fortune

ADMIN_SCHEMA = """
CREATE TABLE admin_keys (
    id INTEGER PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,          -- sha256 of the whole key; the key itself is never stored
    prefix TEXT NOT NULL,
    name TEXT,
    created_at INTEGER NOT NULL,
    revoked_at INTEGER
);
"""


def _adjust(conn, account_id: int, amount: int, reason: str) -> int | None:
    """A signed ledger entry; a negative one only while the balance covers it."""
    cur = conn.execute("UPDATE accounts SET balance_micro = balance_micro + ? WHERE id = ? AND balance_micro + ? >= 0",
                       (amount, account_id, amount))
    if cur.rowcount != 1:
        return None
    conn.execute("INSERT INTO ledger (account_id, amount_micro, kind, ref, created_at) VALUES (?,?,?,?,?)",
                 (account_id, amount, "adjustment", f"admin: {reason}", now()))
    return conn.execute("SELECT balance_micro FROM accounts WHERE id = ?", (account_id,)).fetchone()[0]


async def adjust(store: Store, account_id: int, amount: int, reason: str) -> int | None:
    """-> the new balance, or None when a negative adjustment exceeds the balance."""
    return await store.transaction(_adjust, account_id, amount, reason)


def _new_key(conn, account_id: int, name: str | None) -> tuple[int, str]:
    key = new_account_key()
    key_id = conn.execute("INSERT INTO api_keys (account_id, hash, prefix, name, created_at) VALUES (?,?,?,?,?)",
                          (account_id, hash_key(key), display_prefix(key), name, now())).lastrowid
    return key_id, key


async def new_key(store: Store, account_id: int, name: str | None) -> tuple[int, str]:
    return await store.transaction(_new_key, account_id, name)


def _revoke(conn, key_id: int) -> int | None:
    row = conn.execute("SELECT revoked_at FROM api_keys WHERE id = ?", (key_id,)).fetchone()
    if row is None:
        return None
    if row[0] is None:
        conn.execute("UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL", (now(), key_id))
    return conn.execute("SELECT revoked_at FROM api_keys WHERE id = ?", (key_id,)).fetchone()[0]


async def revoke(store: Store, key_id: int) -> int | None:
    """-> when the key was revoked (now, or earlier), or None if there is no such key."""
    return await store.transaction(_revoke, key_id)


# ---- admin keys ---------------------------------------------------------------------------

def new_admin_key() -> str:
    return "adm_" + secrets.token_urlsafe(32)


async def create_admin_key(store: Store, name: str | None) -> str:
    key = new_admin_key()
    await store.transaction(lambda conn: conn.execute(
        "INSERT INTO admin_keys (hash, prefix, name, created_at) VALUES (?,?,?,?)",
        (hashlib.sha256(key.encode()).hexdigest(), key[:12], name, now())))
    return key


async def has_admin_keys(store: Store) -> bool:
    return await store.fetchone("SELECT 1 FROM admin_keys WHERE revoked_at IS NULL LIMIT 1") is not None


async def admin_key_valid(store: Store, digest: str) -> bool:
    return await store.fetchone("SELECT 1 FROM admin_keys WHERE hash = ? AND revoked_at IS NULL",
                                (digest,)) is not None

