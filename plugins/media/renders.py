"""Renders in flight across a crash.

While a media call waits on an upstream render, its record says how to cancel that job
(provider, method, URL): the hold of a keyed call, the x402 payment of a call paid per
request (`Hold.jobs`). The record is cleared when the render ends. If the process dies,
its hold is released when the lease expires (plugins/storage/leases.py), its payment is
finished unsettled (plugins/x402/recovery.py), but the job would keep running, and
costing, upstream: every process looks for such leftovers in both at start and then every
third of a lease. Each is taken (its record cleared by one conditional update, so that of
several processes finding it exactly one goes on) and then cancelled: at most once, as a
process dying between the two leaves that job running.
"""
from __future__ import annotations

import asyncio
import contextlib

import orjson
import structlog

from plugins.appstate import PROVIDERS, STORE
from providers.media_base import RENDER_TRACKER

log = structlog.get_logger("media")


@contextlib.contextmanager
def tracked(ctx):
    """Around a provider's render: its upstream job is recorded with the call's hold (or
    its payment)."""
    book = (ctx.hold and ctx.hold.jobs) or ctx.app[STORE].ledger

    async def track(job: dict | None) -> None:
        await book.note_job(ctx.call_id, orjson.dumps(job).decode() if job else None)

    token = RENDER_TRACKER.set(track)
    try:
        yield
    finally:
        RENDER_TRACKER.reset(token)


async def cancel_orphans(app) -> int:
    """Cancel the upstream jobs of calls whose process died (keyed or paid per request);
    -> how many."""
    storage, providers = app[STORE], app[PROVIDERS]
    done = 0
    for book in (storage.ledger, storage.payments):
        for call_id, raw in await book.orphaned_jobs():
            if not await book.take_job(call_id, raw):        # another process is cancelling it
                continue
            job = orjson.loads(raw)
            provider = providers.get(job.get("provider"))
            if provider is not None and hasattr(provider, "cancel_job"):
                await provider.cancel_job(job["method"], job["url"])
                log.warning("orphaned_render_cancelled", call=call_id, provider=job["provider"])
            done += 1
    return done


async def keep_cancelling(app) -> None:
    interval = max(app[STORE].lease_seconds / 3, 0.2)
    while True:
        try:
            await cancel_orphans(app)
        except Exception as exc:          # the database or upstream briefly away: next round
            log.error("orphaned_render_round_failed", error=repr(exc))
        await asyncio.sleep(interval)
