"""The OpenTelemetry side of plugins/tracing, imported only when traces are on.

Span tree of one call:

    SERVER  POST /api/v1/chat/completions         (every request; W3C traceparent honoured)
      gateway.parse, gateway.authenticate, gateway.admit, gateway.moderate,
      gateway.route, gateway.reserve                (one per pipeline stage)
      CLIENT  chat <model>                          (the upstream work; GenAI attributes)
        CLIENT  POST                                (each upstream HTTP request, to its headers)
        gateway.settle                              (settlement and the usage row)

The tracer provider is the one already installed (by a test, or `opentelemetry-instrument`),
else one made here from the standard OTEL_* variables with an OTLP exporter.
"""
from __future__ import annotations

import asyncio
import contextlib
import os

import aiohttp
from aiohttp import web
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from plugins.appstate import REQUEST_ID, Spans
from plugins.context import FAILED, CallContext

SERVICE_NAME = "gateway"


def install(app: web.Application) -> "OtelSpans":
    """Traces on for this app: the server span middleware, the provider, the stage spans."""
    provider, owned = _provider()
    tracer = trace.get_tracer("gateway", tracer_provider=provider)
    app.middlewares.insert(0, _server_span(tracer))      # outermost: it sees the final status
    if owned:
        async def flush(app):
            await asyncio.to_thread(provider.shutdown)     # sends what is still batched
        app.on_cleanup.append(flush)
    return OtelSpans(tracer)


def _provider():
    current = trace.get_tracer_provider()
    if hasattr(current, "add_span_processor"):            # an SDK provider someone installed
        return current, False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    named = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    provider = TracerProvider(resource=Resource.create({} if named else {"service.name": SERVICE_NAME}))
    exporter = _exporter()
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider, True


def _exporter():
    """OTEL_TRACES_EXPORTER (otlp, console or none) and the OTLP protocol (http/protobuf or grpc)."""
    kind = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")[0].strip().lower()
    if kind == "none":
        return None
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter
        return ConsoleSpanExporter()
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    return OTLPSpanExporter()


def _server_span(tracer):
    @web.middleware
    async def server_span(request: web.Request, handler):
        resource = request.match_info.route.resource
        route = getattr(resource, "canonical", None) or "unmatched"     # a template: bounded span names
        with tracer.start_as_current_span(
                f"{request.method} {route}", context=propagate.extract(request.headers), kind=SpanKind.SERVER,
                attributes={"http.request.method": request.method, "http.route": route,
                            "url.path": request.path}) as span:
            response = await handler(request)
            span.set_attribute("http.response.status_code", response.status)
            if REQUEST_ID in request:
                span.set_attribute("gateway.request_id", request[REQUEST_ID])
            if response.status >= 500:
                span.set_status(Status(StatusCode.ERROR))
            return response
    return server_span


class OtelSpans(Spans):
    def __init__(self, tracer):
        self.tracer = tracer

    def stage(self, name: str):
        return self.tracer.start_as_current_span(f"gateway.{name}")

    @contextlib.contextmanager
    def call(self, ctx: CallContext):
        operation = "chat" if ctx.chat is not None else "generate_content"
        with self.tracer.start_as_current_span(
                f"{operation} {ctx.model_id}", kind=SpanKind.CLIENT,
                attributes={"gen_ai.operation.name": operation, "gen_ai.request.model": ctx.model_id,
                            "gateway.call_id": ctx.call_id}) as span:
            try:
                yield span
            finally:
                span.set_attributes(genai_attributes(ctx))
                if ctx.outcome == FAILED and ctx.error:
                    span.set_status(Status(StatusCode.ERROR, ctx.error))

    def client_trace_configs(self) -> list[aiohttp.TraceConfig]:
        """A client span per upstream HTTP request, child of the span current in the caller."""
        tracer = self.tracer

        async def started(session, tctx, params):
            url = params.url
            tctx.span = tracer.start_span(params.method, kind=SpanKind.CLIENT, attributes={
                "http.request.method": params.method, "server.address": url.host or "",
                "server.port": url.port or 0, "url.full": str(url.with_user(None).with_query(None))})

        async def ended(session, tctx, params):
            span = getattr(tctx, "span", None)
            if span is not None:
                span.set_attribute("http.response.status_code", params.response.status)
                if params.response.status >= 400:
                    span.set_status(Status(StatusCode.ERROR))
                span.end()

        async def failed(session, tctx, params):
            span = getattr(tctx, "span", None)
            if span is not None:
                span.record_exception(params.exception)
                span.set_status(Status(StatusCode.ERROR, type(params.exception).__name__))
                span.end()

        config = aiohttp.TraceConfig()
        config.on_request_start.append(started)
        config.on_request_end.append(ended)
        config.on_request_exception.append(failed)
        return [config]


def genai_attributes(ctx: CallContext) -> dict:
    """The GenAI semantic-convention attributes of a call, as it ended."""
    out = {"gateway.outcome": ctx.outcome, "gateway.status": ctx.status, "gateway.usd_micro": ctx.charge_micro}
    route = ctx.route
    if route is not None:
        upstream = route.model.upstream
        out.update({"gen_ai.provider.name": route.provider.type_name, "gen_ai.system": route.provider.type_name,
                    "gen_ai.response.model": upstream if isinstance(upstream, str) else route.model.id,
                    "gateway.model": route.model.id, "gateway.provider": route.provider.name})
    if ctx.chat is not None:
        out["gen_ai.request.max_tokens"] = ctx.chat.max_tokens
    if ctx.usage is not None:
        out["gen_ai.usage.input_tokens"] = ctx.usage.input_tokens
        out["gen_ai.usage.output_tokens"] = ctx.usage.output_tokens
    return out
