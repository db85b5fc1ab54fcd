"""`GET /metrics`: Prometheus text format, with the official prometheus-client.

Per-call figures are recorded once, when a call ends: `gateway_record_usage` for calls
that reached the upstream stage, `gateway_call_refused` for calls refused before it.
Domain events are counted where they happen (rate limits, moderation, x402 payments,
credit holds); the metrics themselves are in instruments.py.

`metrics: {token: ...}` in the YAML (e.g. `token: ${METRICS_TOKEN:-}`) makes a scrape
need `Authorization: Bearer <token>`; without it /metrics is open, like /healthz.
"""
from __future__ import annotations

import asyncio
import hmac
import os
import time

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from config.schema import Section
from plugins import hookimpl
from plugins.context import CallContext
from plugins.errors import GatewayError
from plugins.listings import served_model_ids

from . import instruments as m
from .multiproc import DIR_VARIABLE

METRICS = web.AppKey("metrics", object)
REFUSED = "refused"


class MetricsSection(Section):
    """`metrics:` in the YAML."""
    token: str = ""          # when set, a scrape must send Authorization: Bearer <token>


class Metrics:
    """What the handler and the recorders need from the app."""

    def __init__(self, token: str):
        self.token = token.encode()
        self.models: frozenset[str] = frozenset()     # model ids that may be label values

    def model(self, model_id: str) -> str:
        return model_id if model_id in self.models else m.OTHER


@hookimpl
def gateway_register_settings(register):
    register("metrics", MetricsSection)


@hookimpl
def gateway_configure(app, config):
    section: MetricsSection = config.settings("metrics")
    app[METRICS] = Metrics(section.token)

    async def know_models(app):       # every catalog exists once the app starts
        app[METRICS].models = frozenset(served_model_ids(app))
    app.on_startup.append(know_models)


@hookimpl
def gateway_register_routes(register, config):
    register("GET", "/metrics", scrape)


async def scrape(request: web.Request) -> web.Response:
    token = request.app[METRICS].token
    if token and not hmac.compare_digest(request.headers.get("Authorization", "").encode(), b"Bearer " + token):
        raise GatewayError(401, "/metrics needs the metrics token: Authorization: Bearer <metrics.token>",
                           code="invalid_metrics_token", headers={"WWW-Authenticate": "Bearer"})
    m.flush()             # the counts kept since the last scrape, first
    folder = os.environ.get(DIR_VARIABLE)
    if folder:            # several workers: sum every worker's files (file reads: off the event loop)
        body = await asyncio.to_thread(_collect_all, folder)
    else:
        body = generate_latest(REGISTRY)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def _collect_all(folder: str) -> bytes:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=folder)
    return generate_latest(registry)


def _labels(ctx: CallContext) -> tuple[str, str]:
    route = ctx.route
    if route is not None:
        return route.model.id, route.provider.name
    return ctx.app[METRICS].model(ctx.model_id), m.NONE


class CallSeries:
    """Every labelled child one kind of call touches, bound together: a finished call then
    costs one dict lookup, not one per metric."""

    __slots__ = ("requests", "seconds", "upstream", "first_token", "tokens_in", "tokens_out")

    def __init__(self, endpoint: str, model: str, provider: str, status: str, outcome: str):
        self.requests = m.REQUESTS(endpoint, model, provider, status, outcome)
        self.seconds = m.REQUEST_SECONDS(endpoint)
        if outcome != REFUSED:      # a refusal has no upstream or tokens: no empty series for it
            self.upstream = m.UPSTREAM_SECONDS(provider)
            self.first_token = m.FIRST_TOKEN_SECONDS(provider)
            self.tokens_in = m.TOKENS(model, "input")
            self.tokens_out = m.TOKENS(model, "output")


_SERIES: dict[tuple, CallSeries] = {}


def series(ctx: CallContext, status: int, outcome: str) -> CallSeries:
    model, provider = _labels(ctx)
    key = (ctx.endpoint, model, provider, status, outcome)
    found = _SERIES.get(key)
    if found is None:
        found = _SERIES[key] = CallSeries(ctx.endpoint, model, provider, str(status), outcome)
    return found


@hookimpl
def gateway_record_usage(ctx: CallContext):
    """A call that reached the upstream stage ended (settled, usage written)."""
    s = series(ctx, ctx.status, ctx.outcome)
    s.requests.inc()
    s.seconds.observe(time.monotonic() - ctx.started)
    if ctx.upstream_seconds:
        s.upstream.observe(ctx.upstream_seconds)
    if ctx.first_token_seconds:
        s.first_token.observe(ctx.first_token_seconds)
    billing = ctx.billing
    if billing:
        s.tokens_in.inc(billing.get("input_tokens_billed", 0))
        s.tokens_out.inc(billing.get("output_tokens_billed", 0))
    if ctx.charge_micro and ctx.hold is not None and ctx.hold.kind in m.CHARGED:
        m.CHARGED[ctx.hold.kind].inc(ctx.charge_micro)
    if ctx.free_micro:
        m.CHARGED["allowance"].inc(ctx.free_micro)
    if ctx.upstream_error:
        m.UPSTREAM_ERRORS(_labels(ctx)[1], ctx.upstream_error).inc()


@hookimpl
def gateway_call_refused(ctx: CallContext, error: GatewayError):
    """A call refused before any upstream work (4xx, a 402 challenge)."""
    s = series(ctx, error.status, REFUSED)
    s.requests.inc()
    s.seconds.observe(time.monotonic() - ctx.started)
