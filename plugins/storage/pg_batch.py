"""Group commit for PostgreSQL's two writes of every call, the fast reserve and the fast
settle (see postgresql.FAST_RESERVE, FAST_SETTLE): the ones queued in one turn of the
event loop leave together when that turn ends. A batch of one is the single statement;
a batch of more is one call of a PL/pgSQL function (schema.PG_BATCHES) that does each
element as its statement would, in order, in one transaction: one round trip and one
commit for all of them. Every caller is answered after that commit, with its own result.

Should the batch fail (any error: a duplicate call id, a lost connection), each element
runs again alone (`again`: the single statement, in order), so that only a failing one fails.
A connection lost after the batch's COMMIT means its work is done though nobody was told:
`again` then finds an element's own work in place (its hold made, its hold closed with its
charge) and answers as the batch would have, rather than "refused" or "already closed".

Once queued, an element runs even if its caller is cancelled (the caller waits on a future;
the batch does not look at it): a reserve's caller shields that future and undoes the hold
itself, a settle's caller carries its settlement on.
"""
from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

# One batch of a kind on its way at a time, as the SQLite engine: what queues while a batch
# is out leaves as the next batch the moment it is answered, so batches grow with the load and
# the database sees one transaction per round trip per kind and process. More in flight buys
# little latency with one busy account (its batches wait on its row lock in the database
# anyway) and costs commits and gateway CPU: 20 calls at once from one key took ~1.24M
# instructions per call with one in flight, ~1.27M with any number and ~1.28M with two; the
# PostgreSQL CPU per call was lowest with one as well.

Item = tuple                    # the single statement's arguments


class Batcher:
    """The queue of one kind of write. `one(args)` runs an element alone (the single
    statement) -> its raw result; `many(items)` runs a batch of two or more -> one raw
    result per element, in order; `again(args)` (default: `one`) runs an element alone after
    its batch failed. `submit` answers `yes` for a truthy raw result, else `no`.

    One task sends the batches, one after another, while there are any: started by the first
    element queued when none runs, its first step comes after the callbacks of the loop turn
    that queued it, so the batch holds everything that turn queued."""

    def __init__(self, one: Callable[[Item], Awaitable[Any]], many: Callable[[list[Item]], Awaitable[list]],
                 again: Callable[[Item], Awaitable[Any]] | None = None):
        self._one, self._many, self._again = one, many, again or one
        self._pending: list[tuple[Item, asyncio.Future, Any, Any]] = []
        self._sender: asyncio.Task | None = None

    def submit(self, args: Item, yes: Any, no: Any) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append((args, future, yes, no))
        if self._sender is None:
            self._sender = loop.create_task(self._send())
        return future

    async def _send(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    await self._run(batch)
                except BaseException as exc:     # cancelled (the loop is shutting down): nobody is left unanswered
                    for _, future, _, _ in batch:
                        _fail(future, exc if isinstance(exc, Exception) else RuntimeError("the batch was cancelled"))
                    raise
        finally:
            self._sender = None

    async def _run(self, batch: list) -> None:
        if len(batch) == 1:
            await self._each_alone(batch, self._one)
            return
        try:
            results = await self._many([args for args, _, _, _ in batch])
        except Exception:
            await self._each_alone(batch, self._again)
            return
        for (_, future, yes, no), made in zip(batch, results):
            _answer(future, yes if made else no)

    async def _each_alone(self, batch: list, run: Callable[[Item], Awaitable[Any]]) -> None:
        for args, future, yes, no in batch:
            try:
                _answer(future, yes if await run(args) else no)
            except Exception as exc:
                _fail(future, exc)

    async def drain(self) -> None:
        """Wait until every queued element has been answered (before the pool closes)."""
        while self._sender is not None:
            await asyncio.wait([self._sender])      # its failure is its callers' (they were told), not ours


def _answer(future: asyncio.Future, value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
