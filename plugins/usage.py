"""Usage records: one row per call that reached the upstream stage, billed or not."""
from __future__ import annotations

import time

import orjson

from . import hookimpl
from .appstate import STORE
from .context import CallContext
from .store import now

SCHEMA = """
CREATE TABLE usage (
    id INTEGER PRIMARY KEY,
    call_id TEXT NOT NULL UNIQUE,
    account_id INTEGER,
    key_id INTEGER,
    agent_id INTEGER,
    endpoint TEXT NOT NULL,
    requested_model TEXT,
    model TEXT,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    usd_micro INTEGER NOT NULL DEFAULT 0,
    status INTEGER,
    outcome TEXT,
    latency_ms INTEGER,
    billing TEXT,
    created_at INTEGER NOT NULL
);
CREATE INDEX usage_by_account ON usage(account_id, id);
"""


@hookimpl
def gateway_register_migrations(register):
    register("0100_usage", SCHEMA)


INSERT = ("INSERT OR IGNORE INTO usage (call_id, account_id, key_id, agent_id, endpoint, requested_model, model, "
          "input_tokens, output_tokens, usd_micro, status, outcome, latency_ms, billing, created_at) "
          "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)")


def row(ctx: CallContext) -> tuple:
    p, b = ctx.principal, ctx.billing
    return (ctx.call_id, p.account_id if p else None, p.key_id if p else None, p.agent_id if p else None,
            ctx.endpoint, ctx.route.requested_model if ctx.route else None,
            ctx.route.model.id if ctx.route else None, b.get("input_tokens_billed", 0),
            b.get("output_tokens_billed", 0), ctx.charge_micro, ctx.status, ctx.outcome,
            int((time.monotonic() - ctx.started) * 1000), orjson.dumps(b).decode(), now())


def write(conn, ctx: CallContext) -> None:
    """Insert the call's usage row on the store's thread, inside the caller's transaction
    (billing writes it with the settle, so a crash cannot keep one without the other)."""
    conn.execute(INSERT, row(ctx))
    ctx.usage_written = True


@hookimpl(trylast=True)
async def gateway_record_usage(ctx: CallContext):
    if ctx.usage_written:
        return
    await ctx.request.app[STORE].transaction(write, ctx)
