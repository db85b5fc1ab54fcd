"""The plain data the storage interfaces take and return. Everything a write needs is
computed before it (priced, split, rendered), so a backend only applies it."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, fields

CRASHED = "crashed"             # usage outcome of a call whose process died before settling it


@dataclass(slots=True, frozen=True)
class FreeAsk:
    """What a reserve asks of the free allowance: up to `want` micro-USD on `day` (UTC),
    out of `daily` per account."""
    day: str
    want: int
    daily: int


@dataclass(slots=True, frozen=True)
class KeyPolicy:
    """What an operator may restrict on one key; None everywhere means no restriction."""
    expires_at: int | None = None
    spend_limit_micro: int | None = None
    spend_period: str | None = None
    models: tuple[str, ...] | None = None


@dataclass(slots=True, frozen=True)
class KeyLimit:
    """A key's spend limit for the current period: at most `limit_micro` charged to
    credits since `since` (the start of this UTC day or month), holds in flight included."""
    limit_micro: int
    period: str             # day | month
    since: int


class KeySpendLimitReached(Exception):
    """A reserve that would take a key past its spend limit (nothing was changed)."""

    def __init__(self, limit: KeyLimit, spent_micro: int):
        super().__init__(f"key spend limit reached: {limit.limit_micro} micro-USD a {limit.period}")
        self.limit, self.spent_micro = limit, spent_micro


@dataclass(slots=True)
class HoldRequest:
    """Money to set aside for one call, and what a usage row needs if its process dies."""
    call_id: str
    account_id: int
    amount_micro: int
    free: FreeAsk | None = None
    key_id: int | None = None
    agent_id: int | None = None
    endpoint: str = ""
    requested_model: str | None = None
    model: str | None = None
    key_limit: KeyLimit | None = None


@dataclass(slots=True, frozen=True)
class Reserved:
    """What a reserve took: `credit_micro` from the balance, `free_micro` from the day's
    allowance (`free_day`)."""
    call_id: str
    account_id: int
    credit_micro: int
    free_micro: int = 0
    free_day: str | None = None


@dataclass(slots=True)
class UsageRow:
    """One call as the usage log keeps it (`billing` is the client's billing block, JSON)."""
    call_id: str
    account_id: int | None
    key_id: int | None
    agent_id: int | None
    endpoint: str
    requested_model: str | None
    model: str | None
    input_tokens: int = 0
    output_tokens: int = 0
    usd_micro: int = 0
    status: int | None = None
    outcome: str | None = None
    latency_ms: int | None = None
    billing: str | None = None
    created_at: int = 0


USAGE_FIELDS = tuple(f.name for f in fields(UsageRow))


HOLD_RELEASED = ("the gateway process serving this call stopped before it finished; its hold was released, "
                 "nothing was charged")

# A call's x402 payment row read with the names a usage row needs (the payment has no hold):
# `RETURNING` this from the update that finishes the payment of a call whose process died.
PAID_CALL_COLUMNS = ("ref AS call_id, NULL AS account_id, NULL AS key_id, NULL AS agent_id, endpoint, "
                     "requested_model, model, payer, status, usd_micro")


def crashed_usage(call, at: int, *, usd_micro: int = 0, note: str = HOLD_RELEASED, paid_with: str = "credits",
                  **billing) -> UsageRow:
    """The usage row of a call whose process died before settling it: what its hold (or
    its x402 payment) knew, outcome `crashed`, charged `usd_micro` (nothing, unless the
    payment was settled afterwards). `call` is a row with the holds table's columns, from
    either engine, or a payment row read as `PAID_CALL_COLUMNS`."""
    block = {"model": call["model"], "usd": usd_micro / 1_000_000, "payment": paid_with, "note": note, **billing}
    return UsageRow(call_id=call["call_id"], account_id=call["account_id"], key_id=call["key_id"],
                    agent_id=call["agent_id"], endpoint=call["endpoint"] or "unknown",
                    requested_model=call["requested_model"], model=call["model"], usd_micro=usd_micro,
                    outcome=CRASHED, billing=json.dumps(block), created_at=at)


def crashed_paid_usage(payment, note: str, at: int) -> UsageRow:
    """The usage row of an x402 call whose process died, once recovery finished its
    payment (`payment` read as `PAID_CALL_COLUMNS`, after the update): charged what was
    settled, else nothing."""
    charged = payment["usd_micro"] if payment["status"] == "settled" else 0
    return crashed_usage(payment, at, usd_micro=charged, note=note, paid_with="x402", payer=payment["payer"])


@dataclass(slots=True)
class Settlement:
    """A priced call: charge `charge_micro` to credits and `free_micro` to the allowance
    out of what `held` reserved, refund the rest, and write `usage`."""
    held: Reserved
    charge_micro: int
    free_micro: int
    usage: UsageRow | None = None

    def __post_init__(self):
        if not (0 <= self.charge_micro <= self.held.credit_micro and 0 <= self.free_micro <= self.held.free_micro):
            raise ValueError(f"settlement {self.charge_micro}+{self.free_micro} outside its hold {self.held}")


def split_charge(held: Reserved, charge: int, free_eligible: int = 0) -> tuple[int, int]:
    """Split a call's price between credits and the allowance: -> (from credits, from the
    allowance). Never more than the hold. The allowance pays the eligible part first, and
    always whatever the credit hold cannot cover, so no rounding can drop part of a charge."""
    charge = max(0, min(charge, held.credit_micro + held.free_micro))
    free_use = min(held.free_micro, charge, max(free_eligible, charge - held.credit_micro))
    return charge - free_use, free_use


@dataclass(slots=True, frozen=True)
class KeyRecord:
    id: int
    account_id: int
    prefix: str
    name: str | None
    agent_id: int | None
    created_at: int
    revoked_at: int | None
    expires_at: int | None = None
    spend_limit_micro: int | None = None
    spend_period: str | None = None          # day | month, with spend_limit_micro
    models: str | None = None                # JSON list of the model ids it may call; None: any

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


@dataclass(slots=True, frozen=True)
class AgentRegistration:
    agent_id: int
    created: bool           # a new name in this account
    attached: bool          # the calling key now belongs to this agent


@dataclass(slots=True, frozen=True)
class PaymentClaim:
    claim_key: str          # (network, asset, payer, nonce) or the tx hash
    network: str
    asset: str
    payer: str | None
    amount: str             # atomic units, as paid (upto: the signed maximum)
    usd_micro: int
    ref: str                # call id or order id
    scheme: str = "exact"
    settle_with: str | None = None   # a call's payment: what a restarted process needs to settle it (JSON)
    deadline: int | None = None      # Unix time after which it can no longer be settled
    endpoint: str | None = None      # a call's payment: what its usage row needs if its process dies
    requested_model: str | None = None
    model: str | None = None


@dataclass(slots=True, frozen=True)
class UnfinishedPayment:
    """A call's payment whose process died before it was settled or released: `due` is
    None while the call was still running (settle nothing), else the atomic units it owes."""
    claim_key: str
    ref: str
    scheme: str
    settle_with: str
    deadline: int
    due: str | None


@dataclass(slots=True, frozen=True)
class CreditPurchase:
    """A settled x402 credit purchase. The bonus depends on whether it is the account's
    first order, which only the transaction can know, so both are given."""
    order_id: str
    account_id: int
    usd_micro: int
    claim_key: str
    tx: str | None
    bonus_first_micro: int
    bonus_micro: int


@dataclass(slots=True)
class Page:
    limit: int = 50
    offset: int = 0


@dataclass(slots=True)
class UsageFilter:
    """Which usage rows (or ledger entries) to read; None means any."""
    account_id: int | None = None
    key_id: int | None = None
    model: str | None = None
    endpoint: str | None = None
    since: int | None = None          # Unix seconds, inclusive
    until: int | None = None          # Unix seconds, exclusive


def period_start(period: str, at: float) -> int:
    """The start (Unix seconds) of the UTC day or month that `at` falls in."""
    ts = int(at)
    day = ts - ts % 86400
    if period == "day":
        return day
    return day - (time.gmtime(ts).tm_mday - 1) * 86400
