"""Keyless calls. Until a payment plugin (x402) takes them, a call without a key that
reaches the reserve stage is refused with 402 and a message saying what to send."""
from __future__ import annotations

from . import hookimpl
from .context import CallContext
from .errors import GatewayError


@hookimpl(trylast=True)
def gateway_reserve(ctx: CallContext):
    if ctx.principal is None:
        raise GatewayError(402, "payment required: send an API key (Authorization: Bearer chk_...) to pay "
                                "from prepaid credits; this gateway takes no per-call x402 payment here",
                           code="payment_required")
