"""What the gateway keeps, behind domain interfaces: the ledger, keys, usage, agents, the
free allowance and x402 payment claims. Handlers and plugins call these; all SQL of one
engine lives in that engine's backend module (`sqlite`, `postgresql`).

`open_storage(url, migrations)` picks the backend from the URL. Every write that must be
atomic is one interface method, applied in one transaction by the backend, and takes
plain data (e.g. a `Settlement`), never a callback.

Holds have an owner and a lease: each process has an `instance_id`; a hold records it and
a lease (`lease_until`) the process renews for all its open holds while it runs. Only a
hold whose lease expired is released by someone else (a crash), and then with a usage
row whose outcome is `crashed` and whose charge is zero. A call paid per request with
x402 has no hold: its payment row has the owner and lease, and the usage row is written
when that payment is finished (plugins/x402/recovery.py).
"""
from __future__ import annotations

import os
import re
import secrets
import socket
import time
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlsplit

from .records import (
    CRASHED, AgentRegistration, CreditPurchase, FreeAsk, HoldRequest, KeyLimit, KeyPolicy, KeyRecord,
    KeySpendLimitReached, PaymentClaim, Reserved, Settlement, UnfinishedPayment, UsageRow, split_charge,
)

__all__ = ["AgentRegistration", "CreditPurchase", "FreeAsk", "HoldRequest", "KeyRecord", "PaymentClaim", "Reserved",
           "Settlement", "UnfinishedPayment", "UsageRow", "KeyLimit", "KeyPolicy", "KeySpendLimitReached",
           "split_charge", "Storage", "open_storage", "now", "new_instance_id", "DEFAULT_LEASE_SECONDS", "CRASHED"]

DEFAULT_LEASE_SECONDS = 30
_DOLLAR_TAG = re.compile(r"\$(?:[A-Za-z_][A-Za-z_0-9]*)?\$")     # opens (and closes) a dollar-quoted body
_WORD = re.compile(r"[A-Za-z_0-9$]")                               # ...unless it is inside a name (a$b$c)


def now() -> int:
    return int(time.time())


def new_instance_id() -> str:
    """Names this process as the owner of its holds: host, pid and a random part (a pid
    can be reused after a restart; the random part cannot)."""
    return f"{socket.gethostname()[:40]}:{os.getpid()}:{secrets.token_hex(4)}"


class Ledger(Protocol):
    """Money in integer micro-USD. Invariant: an account's balance equals the sum of its
    ledger entries; a reserve never overdraws; a hold is settled or released once."""

    async def credit(self, account_id: int, amount_micro: int, kind: str = "grant", ref: str | None = None) -> int:
        """Add credits (kind: grant | purchase | bonus); -> the new balance."""

    async def adjust(self, account_id: int, amount_micro: int, reason: str) -> int | None:
        """The operator's signed adjustment, kind `adjustment` with the reason as its ref;
        -> the new balance, or None (nothing changed) if a negative one exceeds the balance."""

    async def reserve(self, hold: HoldRequest) -> Reserved | None:
        """Hold money for a call (the allowance first, then credits, as one conditional
        debit). None (nothing changed) if the credits are short; KeySpendLimitReached
        (nothing changed) if `hold.key_limit` would be exceeded."""

    async def settle(self, settlement: Settlement) -> bool:
        """Charge a call and refund the rest of its hold, writing its usage row, in one
        transaction. False (and nothing changed) if the hold is no longer open."""

    async def release(self, call_id: str) -> bool:
        """Refund a hold in full (the call never ran). False if it is no longer open."""

    async def balance(self, account_id: int) -> int: ...

    async def entries_sum(self, account_id: int) -> int:
        """The sum of the account's ledger entries (equals `balance`, or the books are wrong)."""

    async def purchase(self, order: CreditPurchase) -> tuple[int, int]:
        """Record a paid credit order, mark its payment settled and credit it with its
        bonus, in one transaction; a payment already credited is not credited again.
        -> (bonus, balance)."""

    async def renew_leases(self) -> int:
        """Extend the lease of every open hold this process owns (one statement)."""

    async def release_expired(self, at: float | None = None) -> int:
        """Release open holds whose lease expired (their owner died), each with a
        `crashed` usage row; -> how many."""

    async def note_job(self, call_id: str, job: str | None) -> None:
        """Record (JSON: provider, method, url) how to cancel the upstream render a call
        is waiting on, or None once it ended."""

    async def orphaned_jobs(self) -> list[tuple[str, str]]:
        """(call id, job) of renders whose hold is no longer open: their process died."""

    async def take_job(self, call_id: str, job: str) -> bool:
        """Clear an orphaned render's record if it still says `job`: True for exactly one
        of the processes that found it (the one that cancels it)."""


class Keys(Protocol):
    async def create_account(self, name: str | None, key_hash: str, prefix: str, credits_micro: int = 0) -> int:
        """A new account with its first key and optional credits; -> account id."""

    async def create(self, account_id: int, key_hash: str, prefix: str, name: str | None = None,
                     policy: KeyPolicy | None = None) -> int: ...

    async def get(self, key_hash: str) -> KeyRecord | None:
        """The key with this hash, revoked or not."""

    async def with_prefix(self, prefix: str) -> list[KeyRecord]: ...

    async def list(self, account_id: int) -> list[KeyRecord]: ...

    async def revoke(self, key_id: int) -> bool:
        """-> False if it was already revoked or does not exist."""


class Usage(Protocol):
    async def record(self, row: UsageRow) -> None:
        """Write a call's usage row (once per call id; a second write is ignored)."""

    async def recent(self, account_id: int, limit: int = 50) -> list[UsageRow]: ...


class Agents(Protocol):
    async def register(self, account_id: int, key_id: int, name: str) -> AgentRegistration: ...


class Allowance(Protocol):
    async def used(self, account_id: int, day: str) -> int:
        """Micro-USD of the free allowance used (or held) on this UTC day."""


class Payments(Protocol):
    """x402 payment claims: a payment's one-time key can be claimed once, ever."""

    async def is_claimed(self, claim_key: str) -> bool: ...

    async def claim(self, claim: PaymentClaim) -> bool:
        """-> False if this payment was claimed before (also when sent twice at once)."""

    async def owe(self, claim_key: str, amount: int, usd_micro: int) -> None:
        """A call's payment is priced (`amount` atomic units, worth `usd_micro`) and about
        to be settled: recorded first, so a process that dies now is finished by another."""

    async def record(self, claim_key: str, status: str, tx: str | None = None, reason: str | None = None, *,
                     amount: int | None = None, usd_micro: int | None = None) -> None:
        """Status after the work: settled | settle_failed | unused; an upto settlement also
        records what was actually taken (`amount` atomic units worth `usd_micro`)."""

    async def finish_crashed(self, claim_key: str, status: str, tx: str | None = None, reason: str | None = None,
                             *, amount: int | None = None, usd_micro: int | None = None, note: str) -> bool:
        """Finish the payment of a call whose process died, as `record`, and write the call's
        usage row (outcome `crashed`, charged what was settled, else nothing; `note` says
        what happened) in the same transaction. False, and nothing written, if the payment
        was finished already."""

    async def renew_leases(self) -> int:
        """Extend the lease of this process's unfinished call payments (one statement)."""

    async def unfinished(self, at: float | None = None) -> list[UnfinishedPayment]:
        """Call payments whose owner stopped renewing their lease before finishing them."""

    async def adopt(self, claim_key: str, at: float | None = None) -> bool:
        """Take over an unfinished payment whose lease expired; False if another process
        took it first (or it was finished meanwhile)."""

    async def note_job(self, call_id: str, job: str | None) -> None:
        """As `Ledger.note_job`, for a call paid per request (it has no hold): recorded on
        the payment whose `ref` is the call id."""

    async def orphaned_jobs(self, at: float | None = None) -> list[tuple[str, str]]:
        """(call id, job) of renders whose process died: their payment was finished by
        another process, or its lease expired."""

    async def take_job(self, call_id: str, job: str) -> bool:
        """As `Ledger.take_job`, on the payment whose `ref` is the call id."""


class Storage(Protocol):
    engine: str                 # "sqlite" | "postgresql"
    instance_id: str
    lease_seconds: int
    ledger: Ledger
    keys: Keys
    usage: Usage
    agents: Agents
    allowance: Allowance
    payments: Payments

    async def fetchone(self, sql: str, params: tuple = ()) -> Any:
        """For a plugin's own tables and for tests: `?` placeholders on every engine."""

    async def fetchall(self, sql: str, params: tuple = ()) -> list[Any]: ...

    async def execute(self, sql: str, params: tuple = ()) -> None: ...

    async def close(self) -> None: ...


def parse_url(url: str) -> tuple[str, str, dict[str, str]]:
    """'sqlite:///gateway.db?lease_seconds=10' -> ('sqlite', 'gateway.db', {'lease_seconds': '10'});
    PostgreSQL URLs keep everything but our own options."""
    parts = urlsplit(url)
    options = dict(parse_qsl(parts.query))
    ours = {k: options.pop(k) for k in list(options) if k == "lease_seconds"}
    if parts.scheme == "sqlite":
        return "sqlite", url[len("sqlite:///"):].split("?", 1)[0] or "gateway.db", ours
    if parts.scheme in ("postgresql", "postgres"):
        rest = "&".join(f"{k}={v}" for k, v in options.items())
        return "postgresql", parts._replace(query=rest).geturl(), ours
    raise ValueError(f"unsupported storage URL {url!r}: use sqlite:///PATH or postgresql://user:password@host:port/db")


async def open_storage(url: str, migrations: list[tuple[str, Any]], *, instance_id: str | None = None,
                       lease_seconds: int | None = None) -> Storage:
    """Open the store a URL names and apply pending migrations (built-in and plugins')."""
    engine, target, options = parse_url(url)
    lease = lease_seconds or int(options.get("lease_seconds", DEFAULT_LEASE_SECONDS))
    instance = instance_id or new_instance_id()
    if engine == "sqlite":
        from .sqlite import SQLiteStorage
        return await SQLiteStorage.open(target, migrations, instance, lease)
    from .postgresql import PostgresStorage
    return await PostgresStorage.open(target, migrations, instance, lease)


def collect_migrations(pm) -> list[tuple[str, Any]]:
    """Plugins' schema steps: `register(name, sql)`, where sql is one string for every
    engine or a mapping {"sqlite": ..., "postgresql": ...}."""
    found: list[tuple[str, Any]] = []
    pm.hook.gateway_register_migrations(register=lambda name, sql: found.append((name, sql)))
    names = [n for n, _ in found]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise ValueError(f"migration names registered twice: {sorted(dupes)}")
    return found


def for_engine(migrations: list[tuple[str, Any]], engine: str) -> list[tuple[str, str]]:
    """The SQL each migration runs on `engine`; a plugin step without it is an error."""
    out = []
    for name, sql in migrations:
        if isinstance(sql, dict):
            if engine not in sql:
                raise ValueError(f"migration {name!r} has no SQL for {engine} (give {{'{engine}': ...}})")
            sql = sql[engine]
        out.append((name, sql))
    return out


def statements(sql: str) -> list[str]:
    """Migration SQL -> its statements: split on `;`, `--` comments dropped, except inside a
    quoted string or a dollar-quoted body (`$$ ... $$`, `$tag$ ... $tag$`, as a PL/pgSQL
    function's), which is kept whole."""
    out, part, i = [], [], 0
    while i < len(sql):
        ch = sql[i]
        if ch == "-" and sql.startswith("--", i):
            end = sql.find("\n", i)
            i = len(sql) if end < 0 else end
            continue
        if ch == "'":
            end = sql.find("'", i + 1)
            while end >= 0 and sql.startswith("''", end):      # '' is a quote inside the string
                end = sql.find("'", end + 2)
            end = len(sql) if end < 0 else end + 1
        elif ch == "$" and (i == 0 or not _WORD.match(sql[i - 1])) and (tag := _DOLLAR_TAG.match(sql, i)):
            close = sql.find(tag.group(0), tag.end())
            end = len(sql) if close < 0 else close + len(tag.group(0))
        elif ch == ";":
            out.append("".join(part))
            part, i = [], i + 1
            continue
        else:
            end = i + 1
        part.append(sql[i:end])
        i = end
    out.append("".join(part))
    return [s.strip() for s in out if s.strip()]
