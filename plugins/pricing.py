"""Price arithmetic, pure and exact: integer micro-USD, rounded up once per call.

Each endpoint prices its calls through a pricer object (`ctx.pricer`): what a keyed call
holds, what an x402 call pays, what a finished call is charged, and its billing block.
Credits and x402 plugins only ask the pricer, so chat and media share them unchanged.

Chat prices are integers in micro-USD per million tokens, so a call costs
ceil((input x input_price + output x output_price) / 1,000,000) micro-USD.
"""
from __future__ import annotations

from config import ChatModel, usd
from providers.types import IMAGE_ESTIMATE_CHARS, estimate_tokens

from .context import CallContext

PER_MILLION = 1_000_000


def token_cost(model: ChatModel, input_tokens: int, output_tokens: int, *, list_price: bool = False) -> int:
    if model.pricing == "per_request":
        return model.request_micro
    pin = model.list_input_micro if list_price else model.input_micro
    pout = model.list_output_micro if list_price else model.output_micro
    return -(-(input_tokens * pin + output_tokens * pout) // PER_MILLION)


def input_estimate(ctx: CallContext) -> int:
    """The service's estimate of input tokens: ~4 characters a token, images at a flat rate."""
    return estimate_tokens(ctx.input_chars + ctx.input_images * IMAGE_ESTIMATE_CHARS)


def quote(ctx: CallContext) -> tuple[int, int, int]:
    """-> (reserve micro-USD, input tokens estimated, output cap) for a routed chat call."""
    tokens_in = input_estimate(ctx)
    cap = ctx.chat.max_tokens
    return token_cost(ctx.route.model, tokens_in, cap), tokens_in, cap


def billed_output(ctx: CallContext) -> int:
    """Output tokens to bill: as the upstream reported, else estimated from what was relayed."""
    if ctx.usage is not None and ctx.usage.output_tokens:
        out = ctx.usage.output_tokens
    else:
        out = estimate_tokens(ctx.output_chars)
    return min(out, ctx.hold.output_cap) if ctx.hold else out


def with_route_notes(ctx: CallContext, note: str) -> str:
    """The billing note, followed by how the call was routed (svc/free, svc/smart)."""
    notes = ctx.route.notes if ctx.route else []
    return "; ".join([note, *notes])


def billing_block(ctx: CallContext, charged_micro: int, usage_micro: int, note: str) -> dict:
    """The `billing` object of a chat response (SPEC section 2)."""
    model = ctx.route.model
    hold = ctx.hold
    out = billed_output(ctx)
    block = {
        "model": model.id,
        "list_usd": usd(token_cost(model, hold.input_tokens, out, list_price=True)),
        "ceiling_usd": usd(hold.amount_micro),
        "input_tokens_billed": hold.input_tokens,
        "output_tokens_billed": out,
        "usd": usd(charged_micro),
        "usage_usd": usd(usage_micro),
        "quote_usd": usd(hold.amount_micro),
        "note": with_route_notes(ctx, note),
    }
    if ctx.route.is_alias:
        block["requested_model"] = ctx.route.requested_model
    block.update(ctx.route.extra)
    return block


class ChatPricer:
    """Chat: hold input estimate + max_tokens; x402 pays that same quote; charge tokens."""

    def reserve(self, ctx: CallContext) -> tuple[int, int, int]:
        return quote(ctx)

    def x402_price(self, ctx: CallContext) -> tuple[int, str]:
        amount, _, cap = quote(ctx)
        return amount, f"{ctx.route.model.id}, up to {cap} output tokens"

    def shortfall(self, ctx: CallContext, amount: int) -> str:
        return (f"this call's reserve ${usd(amount):.6f} (~{input_estimate(ctx)} input tokens + max_tokens "
                f"{ctx.chat.max_tokens} on {ctx.route.model.id})")

    def charge(self, ctx: CallContext) -> tuple[int, int]:
        """-> (charge, usage cost) of a finished call, never more than its hold."""
        cost = token_cost(ctx.route.model, ctx.hold.input_tokens, billed_output(ctx))
        return min(cost, ctx.hold.amount_micro), cost

    def billing(self, ctx: CallContext, charged: int, usage: int, note: str) -> dict:
        return billing_block(ctx, charged, usage, note)


CHAT = ChatPricer()
