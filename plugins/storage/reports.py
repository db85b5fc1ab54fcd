"""What the admin API and the dashboard read: accounts, keys, usage and the ledger, with
filters, paging and aggregates. Read-only SQL written once for every engine (`?`
placeholders and standard SQL, run through `Storage.fetchall`); every write goes through
the engine's own ledger and keys code."""
from __future__ import annotations

import time
from typing import Any

from .records import Page, UsageFilter, period_start

PREFIX_LENGTH = 12          # what plugins.auth.display_prefix keeps


def _where(f: UsageFilter, table: str = "usage") -> tuple[str, list[Any]]:
    clauses, params = [], []
    for column, value in (("account_id", f.account_id), ("key_id", f.key_id), ("model", f.model),
                          ("endpoint", f.endpoint)):
        if value is not None and (table == "usage" or column == "account_id"):
            clauses.append(f"{column} = ?")
            params.append(value)
    if f.since is not None:
        clauses.append("created_at >= ?")
        params.append(f.since)
    if f.until is not None:
        clauses.append("created_at < ?")
        params.append(f.until)
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


async def accounts(store, q: str, page: Page) -> tuple[list[Any], int]:
    """Accounts matching `q` (a name fragment or an id), newest first, with their key count."""
    where, params = "", []
    if q:
        where = " WHERE a.name LIKE ? OR CAST(a.id AS TEXT) = ?"
        params = [f"%{q}%", q]
    total = (await store.fetchone(f"SELECT COUNT(*) FROM accounts a{where}", tuple(params)))[0]
    rows = await store.fetchall(
        "SELECT a.id, a.name, a.balance_micro, a.created_at, "
        "(SELECT COUNT(*) FROM api_keys k WHERE k.account_id = a.id AND k.revoked_at IS NULL) AS keys "
        f"FROM accounts a{where} ORDER BY a.id DESC LIMIT ? OFFSET ?", (*params, page.limit, page.offset))
    return rows, total


async def account(store, account_id: int):
    return await store.fetchone("SELECT id, name, balance_micro, created_at FROM accounts WHERE id = ?",
                                (account_id,))


async def spend_since(store, account_id: int, since: int) -> int:
    row = await store.fetchone("SELECT COALESCE(SUM(usd_micro), 0) FROM usage WHERE account_id = ? AND created_at >= ?",
                               (account_id, since))
    return int(row[0])


async def spend_today_and_month(store, account_id: int) -> tuple[int, int]:
    now = int(time.time())
    return (await spend_since(store, account_id, period_start("day", now)),
            await spend_since(store, account_id, period_start("month", now)))


async def keys(store, account_id: int | None = None) -> list[Any]:
    """Keys with their spend and last use, both read from the usage log (no write per call)."""
    where, params = ("WHERE k.account_id = ?", (account_id,)) if account_id is not None else ("", ())
    return await store.fetchall(
        "SELECT k.id, k.account_id, k.prefix, k.name, k.agent_id, k.created_at, k.revoked_at, k.expires_at, "
        "k.spend_limit_micro, k.spend_period, k.models, "
        "(SELECT MAX(u.created_at) FROM usage u WHERE u.key_id = k.id) AS last_used_at, "
        "(SELECT COALESCE(SUM(u.usd_micro), 0) FROM usage u WHERE u.key_id = k.id) AS spend_micro "
        f"FROM api_keys k {where} ORDER BY k.id", params)


async def key(store, key_id: int):
    return await store.fetchone("SELECT id, prefix, account_id, revoked_at FROM api_keys WHERE id = ?", (key_id,))


async def keys_matching(store, text: str, key_hash: str) -> list[Any]:
    """Keys named by a whole key (`key_hash`, its hash) or by the start of the prefix `keys list` shows."""
    if len(text) > PREFIX_LENGTH:
        return await store.fetchall("SELECT id, prefix, account_id, hash FROM api_keys WHERE hash = ?", (key_hash,))
    return await store.fetchall("SELECT id, prefix, account_id, hash FROM api_keys WHERE substr(prefix, 1, ?) = ? "
                                "ORDER BY id", (len(text), text))


async def agents(store, account_id: int) -> list[Any]:
    return await store.fetchall(
        "SELECT g.id, g.name, g.created_at, (SELECT COUNT(*) FROM api_keys k WHERE k.agent_id = g.id) AS keys "
        "FROM agents g WHERE g.account_id = ? ORDER BY g.id", (account_id,))


USAGE_COLUMNS = ("id, call_id, account_id, key_id, agent_id, endpoint, requested_model, model, input_tokens, "
                 "output_tokens, usd_micro, status, outcome, latency_ms, billing, created_at")


async def usage(store, f: UsageFilter, page: Page) -> list[Any]:
    where, params = _where(f)
    return await store.fetchall(f"SELECT {USAGE_COLUMNS} FROM usage{where} ORDER BY id DESC LIMIT ? OFFSET ?",
                                (*params, page.limit, page.offset))


async def usage_summary(store, f: UsageFilter) -> dict[str, list[Any]]:
    """Spend and calls by UTC day, by model and by endpoint."""
    where, params = _where(f)
    by_day = await store.fetchall(
        f"SELECT created_at - created_at % 86400 AS day, COUNT(*) AS calls, COALESCE(SUM(usd_micro), 0) AS usd_micro "
        f"FROM usage{where} GROUP BY created_at - created_at % 86400 ORDER BY 1", tuple(params))
    by_model = await store.fetchall(
        f"SELECT model, COUNT(*) AS calls, COALESCE(SUM(usd_micro), 0) AS usd_micro FROM usage{where} "
        "GROUP BY model ORDER BY 3 DESC, 2 DESC", tuple(params))
    by_endpoint = await store.fetchall(
        f"SELECT endpoint, COUNT(*) AS calls, COALESCE(SUM(usd_micro), 0) AS usd_micro FROM usage{where} "
        "GROUP BY endpoint ORDER BY 3 DESC, 2 DESC", tuple(params))
    return {"by_day": by_day, "by_model": by_model, "by_endpoint": by_endpoint}


async def ledger(store, f: UsageFilter, page: Page) -> list[Any]:
    where, params = _where(f, "ledger")
    return await store.fetchall(
        f"SELECT id, account_id, amount_micro, kind, ref, created_at FROM ledger{where} ORDER BY id DESC "
        "LIMIT ? OFFSET ?", (*params, page.limit, page.offset))
