"""OpenTelemetry traces (the `otel` extra): the span tree of a chat call and of a streamed
call, with the GenAI attributes, read from the SDK's in-memory exporter. Off by default:
then nothing of the gateway's OpenTelemetry side is even imported. Plugins observe refusals and get their
own TraceConfig on the upstream session through hooks."""
import subprocess
import sys

import aiohttp
import openai
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from plugins import get_plugin_manager, hookimpl
from tests.conftest import ROOT, openai_upstream
from tests.fakes import Reply

HI = [{"role": "user", "content": "hi"}]
STAGES = ["gateway.parse", "gateway.authenticate", "gateway.admit", "gateway.moderate", "gateway.route",
          "gateway.reserve"]


@pytest.fixture(scope="module")
def exporter():
    """The SDK provider a collector would get, exporting to memory (installed once per process)."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    trace.set_tracer_provider(provider)
    assert trace.get_tracer_provider() is provider, "another test installed a tracer provider first"
    return memory


@pytest.fixture
async def traced(exporter, start_gateway, fake_openai):
    gw = await start_gateway({**openai_upstream(fake_openai), "telemetry": {"traces": True}})
    exporter.clear()
    return gw, fake_openai, exporter


def tree(spans) -> list:
    """[(name, [children...]), ...] of the finished spans, children in start order."""
    by_parent: dict = {}
    for span in sorted(spans, key=lambda s: s.start_time):
        by_parent.setdefault(span.parent.span_id if span.parent else None, []).append(span)

    def build(parent_id):
        return [(s.name, build(s.context.span_id)) for s in by_parent.get(parent_id, [])]
    return build(None)


def one(spans, name):
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


@pytest.mark.parametrize("stream", [False, True])
async def test_span_tree_of_a_call(traced, stream):
    gw, upstream, exporter = traced
    key, _ = await gw.key(1)
    upstream.enqueue(Reply(text="traced answer", input_tokens=12, output_tokens=7))
    client = gw.openai(key)
    if stream:
        answer = await client.chat.completions.create(model="up/gpt", max_tokens=40, messages=HI, stream=True)
        async for _ in answer:
            pass
        request_id = answer.response.headers["X-Request-Id"]
    else:
        raw = await client.chat.completions.with_raw_response.create(model="up/gpt", max_tokens=40, messages=HI)
        request_id = raw.headers["X-Request-Id"]
    spans = exporter.get_finished_spans()
    assert tree(spans) == [("POST /api/v1/chat/completions", [
        *[(name, []) for name in STAGES],
        ("chat up/gpt", [("POST", []), ("gateway.settle", [])])])]
    server = one(spans, "POST /api/v1/chat/completions")
    assert server.kind == trace.SpanKind.SERVER
    assert server.attributes["http.response.status_code"] == 200
    assert server.attributes["gateway.request_id"] == request_id
    call = one(spans, "chat up/gpt")
    assert call.kind == trace.SpanKind.CLIENT
    assert {k: v for k, v in call.attributes.items() if k.startswith("gen_ai.")} == {
        "gen_ai.operation.name": "chat", "gen_ai.request.model": "up/gpt", "gen_ai.response.model": "gpt-4o-mini",
        "gen_ai.provider.name": "openai", "gen_ai.system": "openai", "gen_ai.request.max_tokens": 40,
        "gen_ai.usage.input_tokens": 12, "gen_ai.usage.output_tokens": 7}
    assert call.attributes["gateway.call_id"] == request_id and call.attributes["gateway.outcome"] == "ok"
    http = one(spans, "POST")
    assert http.attributes["url.full"] == str(upstream.server.make_url("/v1/chat/completions"))
    assert http.attributes["http.response.status_code"] == 200


async def test_a_refused_call_ends_in_its_stage(traced):
    gw, upstream, exporter = traced
    with pytest.raises(openai.AuthenticationError):
        await gw.openai("chk_not-a-key").chat.completions.create(model="up/gpt", messages=HI)
    spans = exporter.get_finished_spans()
    assert tree(spans) == [("POST /api/v1/chat/completions", [("gateway.parse", []),
                                                               ("gateway.authenticate", [])])]
    assert one(spans, "gateway.authenticate").status.status_code == trace.StatusCode.ERROR
    assert one(spans, "POST /api/v1/chat/completions").attributes["http.response.status_code"] == 401


class Observer:
    """A plugin that counts refusals and upstream requests through the hooks."""

    def __init__(self):
        self.refused: list[tuple[str, int]] = []
        self.upstream: list[str] = []

    @hookimpl
    def gateway_call_refused(self, ctx, error):
        self.refused.append((ctx.model_id, error.status))

    @hookimpl
    def gateway_client_trace_configs(self, app):
        config = aiohttp.TraceConfig()

        async def started(session, tctx, params):
            self.upstream.append(str(params.url))
        config.on_request_start.append(started)
        return [config]


async def test_plugins_observe_refusals_and_upstream_requests(start_gateway, fake_openai):
    pm = get_plugin_manager()
    observer = Observer()
    pm.register(observer, "observer")
    gw = await start_gateway(openai_upstream(fake_openai), pm=pm)
    key, _ = await gw.key(1)
    client = gw.openai(key)
    await client.chat.completions.create(model="up/gpt", messages=HI)
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(model="up/none", messages=HI)
    assert observer.refused == [("up/none", 400)]
    assert observer.upstream == [str(fake_openai.server.make_url("/v1/chat/completions"))]


def modules_after_start(env: dict) -> str:
    """Create the demo app in a fresh interpreter; which tracing is on, and is our OpenTelemetry
    side loaded? (redis-py loads parts of OpenTelemetry by itself wherever it is installed.)"""
    code = ("import sys, config, gateway; from plugins.appstate import SPANS; "
            "app = gateway.create_app(config.load(None)); "
            "print(type(app[SPANS]).__name__, 'plugins.tracing.otel' in sys.modules)")
    clean = {k: v for k, v in __import__("os").environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**clean, **env}, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]          # after the start-up log lines


def test_off_by_default_and_on_with_the_standard_variables():
    assert modules_after_start({}) == "Spans False"
    assert modules_after_start({"OTEL_SERVICE_NAME": "gw", "OTEL_TRACES_EXPORTER": "none"}) == "OtelSpans True"
    assert modules_after_start({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
                                "OTEL_SDK_DISABLED": "true"}) == "Spans False"
