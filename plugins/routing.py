"""Routing: which catalog model answers a call.

This built-in resolves catalog ids. Special ids (svc/free, svc/smart) and aliases are
resolved by plugins that run before it; an id nobody resolves is a 400 naming it.
Whether the model can serve today (not retired, its provider has a key) is checked once
the route is chosen, for every route alike (pipeline.check_servable).
"""
from __future__ import annotations

from . import hookimpl
from .appstate import CONFIG, PROVIDERS
from .context import CallContext, Route
from .errors import bad_request


def route_to(ctx: CallContext, model_id: str, requested: str | None = None) -> Route:
    """A Route to catalog model `model_id`; a 400 naming it when there is none."""
    app = ctx.app
    model = app[CONFIG].chat_models.get(model_id)
    if model is None:
        raise bad_request(f"model {model_id!r} is not served here; GET /api/v1/models lists the ids",
                          param="model", code="model_not_found")
    return Route(model=model, provider=app[PROVIDERS][model.provider], requested_model=requested or model_id)


@hookimpl(trylast=True)
def gateway_select_route(ctx: CallContext):
    if ctx.chat is None:
        return None
    resolved = ctx.format.resolve_model(ctx.chat.model, ctx.app[CONFIG])
    return route_to(ctx, resolved, requested=ctx.chat.model)
