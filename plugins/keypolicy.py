"""What an operator may restrict on one key: an expiry (401 after it), a list of models it
may call (403 outside it), and a spend limit per UTC day or month (402 when a call's
reserve would pass it). The limit is checked inside the reserve transaction, with the
calls in flight counted, so concurrent calls cannot overshoot it."""
from __future__ import annotations

import json
import time

from config import usd

from . import hookimpl
from .context import CallContext
from .errors import GatewayError
from .storage import KeyLimit, KeyPolicy, KeyRecord, KeySpendLimitReached
from .storage.records import period_start

PERIODS = ("day", "month")


def policy_of(key: KeyRecord) -> KeyPolicy | None:
    if key.expires_at is None and key.spend_limit_micro is None and key.models is None:
        return None
    return KeyPolicy(key.expires_at, key.spend_limit_micro, key.spend_period,
                     tuple(json.loads(key.models)) if key.models is not None else None)


def limit_for(policy: KeyPolicy | None, at: float | None = None) -> KeyLimit | None:
    if policy is None or policy.spend_limit_micro is None:
        return None
    period = policy.spend_period or "day"
    return KeyLimit(policy.spend_limit_micro, period, period_start(period, time.time() if at is None else at))


def refusal(reached: KeySpendLimitReached) -> GatewayError:
    limit = reached.limit
    return GatewayError(402, f"this key's spend limit of ${usd(limit.limit_micro):.6f} per {limit.period} is reached "
                             f"(${usd(reached.spent_micro):.6f} spent or in flight this {limit.period}); ask the "
                             "operator to raise it, or use another key", code="key_spend_limit")


@hookimpl(tryfirst=True)
def gateway_admit(ctx: CallContext):
    p = ctx.principal
    policy = p.policy if p is not None else None
    if policy is None:
        return
    if policy.expires_at is not None and time.time() >= policy.expires_at:
        raise GatewayError(401, f"this API key expired at {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(policy.expires_at))}; "
                                "ask the operator for a new one", code="expired_api_key")
    if policy.models is not None and ctx.model_id not in policy.models:
        raise GatewayError(403, f"this key may call only {', '.join(policy.models)}; model {ctx.model_id!r} is "
                                "outside its list", code="model_not_allowed", param="model")
