"""The admin API's writes, all through the storage interfaces: credit adjustments (a
ledger entry, never an edit), keys for an existing account, revocation, and the admin
keys themselves (this plugin's own table)."""
from __future__ import annotations

import hashlib
import secrets

from plugins.auth import display_prefix, hash_key, new_key as new_account_key
from plugins.storage import KeyPolicy, Storage, now

MAX_ADJUST_MICRO = 100_000 * 1_000_000      # one adjustment at most: a typo must not mint a fortune

_ADMIN_KEYS = """
CREATE TABLE admin_keys (
    hash TEXT PRIMARY KEY,              -- sha256 of the whole key; the key itself is never stored
    prefix TEXT NOT NULL,
    name TEXT,
    created_at {int} NOT NULL,
    revoked_at {int}
);
"""
ADMIN_SCHEMA = {"sqlite": _ADMIN_KEYS.format(int="INTEGER"), "postgresql": _ADMIN_KEYS.format(int="BIGINT")}


async def adjust(store: Storage, account_id: int, amount: int, reason: str) -> int | None:
    """-> the new balance, or None when a negative adjustment exceeds the balance."""
    return await store.ledger.adjust(account_id, amount, f"admin: {reason}")


async def new_key(store: Storage, account_id: int, name: str | None,
                  policy: KeyPolicy | None = None) -> tuple[int, str]:
    key = new_account_key()
    return await store.keys.create(account_id, hash_key(key), display_prefix(key), name, policy), key


# ---- admin keys ---------------------------------------------------------------------------

def new_admin_key() -> str:
    return "adm_" + secrets.token_urlsafe(32)


async def create_admin_key(store: Storage, name: str | None) -> str:
    key = new_admin_key()
    await store.execute("INSERT INTO admin_keys (hash, prefix, name, created_at) VALUES (?,?,?,?)",
                        (hashlib.sha256(key.encode()).hexdigest(), key[:12], name, now()))
    return key


async def has_admin_keys(store: Storage) -> bool:
    return await store.fetchone("SELECT 1 FROM admin_keys WHERE revoked_at IS NULL LIMIT 1") is not None


async def admin_key_valid(store: Storage, digest: str) -> bool:
    return await store.fetchone("SELECT 1 FROM admin_keys WHERE hash = ? AND revoked_at IS NULL",
                                (digest,)) is not None
