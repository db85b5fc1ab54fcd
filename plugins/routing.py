"""Routing: which catalog model answers a call.

This built-in resolves catalog ids. Special ids (svc/free, svc/smart) and aliases are
resolved by plugins that run before it; an id nobody resolves is a 400 naming it.
A model whose provider cannot serve (no API key yet) is a 503 that says what to set.
"""
from __future__ import annotations

from . import hookimpl
from .appstate import CONFIG, PROVIDERS
from .context import CallContext, Route
from .errors import GatewayError, bad_request


def route_to(ctx: CallContext, model_id: str, requested: str | None = None) -> Route:
    """A Route to catalog model `model_id`; raises if it cannot serve now."""
    app = ctx.request.app
    model = app[CONFIG].chat_models.get(model_id)
    if model is None:
        raise bad_request(f"model {model_id!r} is not served here; GET /api/v1/models lists the ids",
                          param="model", code="model_not_found")
    provider = app[PROVIDERS][model.provider]
    reason = provider.unavailable_reason()
    if reason:
        raise GatewayError(503, f"model {model_id!r} is not available right now: {reason}",
                           code="provider_unavailable")
    return Route(model=model, provider=provider, requested_model=requested or model_id)


@hookimpl(trylast=True)
def gateway_select_route(ctx: CallContext):
    if ctx.chat is None:
        return None
    resolved = ctx.format.resolve_model(ctx.chat.model, ctx.request.app[CONFIG])
    return route_to(ctx, resolved, requested=ctx.chat.model)
