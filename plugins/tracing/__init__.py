"""OpenTelemetry traces: optional (`pip install 'gateway[otel]'`), off by default, free when off.

On when `telemetry: {traces: true}` is in the YAML, or, without that key, when the standard
OTEL_SERVICE_NAME or OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT variable is set (`traces: false`
keeps it off whatever the environment says). Everything else is the standard OTEL_*
variables (exporter, endpoint, headers, sampler, resource). Off, nothing of OpenTelemetry
is imported and the pipeline's stage spans are one shared no-op.

On: a server span per request, a child span per pipeline stage, a span for the upstream
work of a call with the GenAI semantic-convention attributes, and under it a client span
per upstream HTTP request (an aiohttp TraceConfig given to the shared session and the chat
calls' connection pool through `gateway_client_trace_configs`). See otel.py.
"""
from __future__ import annotations

import os

from config import ConfigError
from config.schema import Section
from plugins import hookimpl
from plugins.appstate import SPANS

ENABLING_VARIABLES = ("OTEL_SERVICE_NAME", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


class TelemetrySection(Section):
    """`telemetry:` in the YAML."""
    traces: bool | None = None       # None: on when an OTEL_* variable above is set


def traces_on(section: TelemetrySection, env=os.environ) -> bool:
    if section.traces is not None:
        return section.traces
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    return any(env.get(name) for name in ENABLING_VARIABLES)


@hookimpl
def gateway_register_settings(register):
    register("telemetry", TelemetrySection)


@hookimpl
def gateway_configure(app, config):
    if not traces_on(config.settings("telemetry")):
        return
    try:
        from . import otel
    except ImportError as exc:
        raise ConfigError([f"{config.path}: telemetry: traces need OpenTelemetry ({exc.name} is not installed): "
                           "pip install 'gateway[otel]'"]) from None
    app[SPANS] = otel.install(app)


@hookimpl
def gateway_client_trace_configs(app):
    return app[SPANS].client_trace_configs() or None
