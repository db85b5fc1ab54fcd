"""Keeping this process's holds alive, and releasing those of processes that died.

While the gateway runs it renews the lease of all its open holds (one statement) every
third of a lease, and releases any hold whose lease expired: its owner stopped renewing
it, so it crashed or was killed. A restarted process gets a new instance id and so never
releases a call another live process is serving."""
from __future__ import annotations

import asyncio

import structlog

log = structlog.get_logger("storage")


async def release_expired(storage) -> int:
    released = await storage.ledger.release_expired()
    if released:
        log.warning("released_expired_holds", count=released)
    return released


async def keep_leases(storage) -> None:
    """Run until cancelled; a failing round (database briefly down) is logged and retried."""
    interval = max(storage.lease_seconds / 3, 0.2)
    while True:
        await asyncio.sleep(interval)
        try:
            await storage.ledger.renew_leases()
            await storage.payments.renew_leases()
            await release_expired(storage)
        except Exception as exc:          # keep renewing: the next round may succeed
            log.error("lease_round_failed", error=repr(exc))
