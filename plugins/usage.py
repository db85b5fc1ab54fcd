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
    p, b, route = ctx.principal, ctx.billing, ctx.route
    # Positional, in UsageRow's field order (call_id, account_id, key_id, agent_id, endpoint, requested_model,
    # model, input_tokens, output_tokens, usd_micro, status, outcome, latency_ms, billing, created_at):
    # a class called with keywords builds a dict per call.
    return UsageRow(ctx.call_id, p.account_id if p else None, p.key_id if p else None, p.agent_id if p else None,
                    ctx.endpoint, route.requested_model if route else None, route.model.id if route else None,
                    b.get("input_tokens_billed", 0), b.get("output_tokens_billed", 0), ctx.charge_micro, ctx.status,
                    ctx.outcome, int((time.monotonic() - ctx.started) * 1000), orjson.dumps(b).decode(), now())


LABELS = ("endpoint", "requested_model", "model")


def label_values(ctx: CallContext) -> tuple[str, str | None, str | None]:
    """What a usage row says about a call before it ran: its `LABELS` (endpoint, requested
    and served model), recorded with its hold or x402 payment so a `crashed` row can be
    written if its process dies."""
    route = ctx.route
    return ctx.format.endpoint, route.requested_model if route else ctx.model_id, route.model.id if route else None


def labels(ctx: CallContext) -> dict[str, str | None]:
    """`label_values` by name."""
    return dict(zip(LABELS, label_values(ctx)))


def mark_written(ctx: CallContext) -> None:
    """The row went out with the call's settlement: don't write it again."""
    ctx.usage_written = True


@hookimpl(trylast=True)
def gateway_record_usage(ctx: CallContext):
    """The row, unless it went out with the settlement (then None, without a coroutine)."""
    if ctx.usage_written:
        return None
    return _record(ctx)


async def _record(ctx: CallContext) -> None:
    await ctx.app[STORE].usage.record(row(ctx))
    mark_written(ctx)
