"""Usage records: one row per call that reached the upstream stage, billed or not.
Billing writes the row with its settlement (one transaction); calls it did not settle
(x402, failures before a hold) are written here."""
from __future__ import annotations

import time

import orjson

from . import hookimpl
from .appstate import STORE
from .context import CallContext
from .storage import UsageRow, now


def row(ctx: CallContext) -> UsageRow:
    p, b = ctx.principal, ctx.billing
    return UsageRow(call_id=ctx.call_id, account_id=p.account_id if p else None, key_id=p.key_id if p else None,
                    agent_id=p.agent_id if p else None, endpoint=ctx.endpoint,
                    requested_model=ctx.route.requested_model if ctx.route else None,
                    model=ctx.route.model.id if ctx.route else None,
                    input_tokens=b.get("input_tokens_billed", 0), output_tokens=b.get("output_tokens_billed", 0),
                    usd_micro=ctx.charge_micro, status=ctx.status, outcome=ctx.outcome,
                    latency_ms=int((time.monotonic() - ctx.started) * 1000), billing=orjson.dumps(b).decode(),
                    created_at=now())


def labels(ctx: CallContext) -> dict[str, str | None]:
    """What a usage row says about a call before it ran (endpoint, requested and served
    model), recorded with its hold or x402 payment so a `crashed` row can be written if its
    process dies."""
    route = ctx.route
    return {"endpoint": ctx.endpoint, "requested_model": route.requested_model if route else ctx.model_id,
            "model": route.model.id if route else None}


def mark_written(ctx: CallContext) -> None:
    """The row went out with the call's settlement: don't write it again."""
    ctx.usage_written = True


@hookimpl(trylast=True)
async def gateway_record_usage(ctx: CallContext):
    if ctx.usage_written:
        return
    await ctx.request.app[STORE].usage.record(row(ctx))
    mark_written(ctx)
