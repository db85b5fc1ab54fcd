"""The gateway core: app factory, cleanup contexts, its middleware, the chat pipeline, the
SSE relay and the CLI. Everything a user could want to swap is a plugin (plugins/).

Pipeline of one chat call (each stage a hook, awaited in pluggy order):
    parse (format) -> authenticate -> admit -> moderate -> route -> reserve
    -> provider (JSON or stream relay) -> settle -> record usage
Settlement always runs exactly once, and completes even if the client leaves.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

import aiohttp
import orjson
import structlog
from aiohttp import web

import config as config_mod
from config.check import check as check_config
from plugins import acall_all, get_plugin_manager, logs, workers
from plugins.appstate import (
    BACKGROUND, CONFIG, FORMATS, HTTP, NO_SPANS, OPTIONS_ANSWERS, PM, PROVIDER_TYPES, PROVIDERS, REQUEST_ID, SPANS,
    STORE,
)
from plugins.context import CLIENT_GONE, FAILED, OK, CallContext, new_id
from plugins.errors import NOT_RETRYABLE, GatewayError, StartupError
from plugins.pipeline import finish, run_call, succeeded
from plugins.pricing import CHAT as CHAT_PRICER
from plugins.formats.base import SSE_HEADERS, ClientFormat, json_response, openai_error_body
from plugins.redis_link import redis_url
from plugins.serving import serve
from plugins.storage import collect_migrations, leases, open_storage
from providers.base import HTTPProvider, UpstreamError
from providers.http1 import Pool
from providers.types import (
    Flush, ReasoningDelta, StreamEnd, TextDelta, TextRun, ToolCallDelta, Usage, estimate_tokens, measure_input,
)

log = structlog.get_logger("gateway")

MAX_BODY_BYTES = 32 * 1024 * 1024


# ---- app factory ---------------------------------------------------------------

def create_app(cfg: config_mod.Config, *, plugins_dir: str | None = None, pm=None) -> web.Application:
    pm = pm or get_plugin_manager(cfg.plugins, plugins_dir)
    app = web.Application(middlewares=[gateway_layer], client_max_size=MAX_BODY_BYTES)
    app[CONFIG], app[PM], app[BACKGROUND], app[SPANS] = cfg, pm, set(), NO_SPANS
    app[OPTIONS_ANSWERS] = []

    types: dict[str, type] = {}
    pm.hook.gateway_register_providers(register=lambda cls: types.setdefault(cls.type_name, cls))
    check_config(cfg, pm, types)         # every section typed; cross-references; else ConfigError
    app[PROVIDER_TYPES] = types

    formats: dict[str, ClientFormat] = {}
    pm.hook.gateway_register_formats(register=lambda fmt: formats.setdefault(fmt.name, fmt))
    app[FORMATS] = formats
    for fmt in formats.values():
        app.router.add_post(fmt.path, _chat_handler(fmt))
    pm.hook.gateway_register_routes(register=lambda method, path, handler: app.router.add_route(method, path, handler),
                                    config=cfg)

    pm.hook.gateway_configure(app=app, config=cfg)
    app.cleanup_ctx.extend([_database, _http_session, _background_tasks])
    app.on_response_prepare.append(_add_request_id)
    return app


async def _database(app: web.Application):
    cfg = app[CONFIG]
    store = await open_storage(cfg.storage_url, collect_migrations(app[PM]))
    app[STORE] = store
    await leases.release_expired(store)       # holds of processes that died (never a live one's)
    keeper = asyncio.get_running_loop().create_task(leases.keep_leases(store))
    yield
    keeper.cancel()
    await store.close()


async def _http_session(app: web.Application):
    # Chat calls go through one lean pool of kept-alive connections (providers/http1.py);
    # every other upstream call through one session. Per-provider timeouts are set per request.
    connector = aiohttp.TCPConnector(limit=1000, limit_per_host=500, ttl_dns_cache=300)
    traces = [tc for found in app[PM].hook.gateway_client_trace_configs(app=app) for tc in found or ()]
    session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                                    json_serialize=lambda o: orjson.dumps(o).decode(), auto_decompress=True,
                                    trace_configs=traces or None)
    pool = Pool(limit_per_origin=500, keepalive=15.0, trace_configs=traces)
    app[HTTP] = session
    app[PROVIDERS] = {p.name: app[PROVIDER_TYPES][p.type](p, session) for p in app[CONFIG].providers.values()}
    for provider in app[PROVIDERS].values():
        if isinstance(provider, HTTPProvider):
            provider.pool = pool
    missing = {name: p.config.unset_env.get("api_key") or f"providers.{name}.api_key"
               for name, p in app[PROVIDERS].items() if p.unavailable_reason()}
    log.info("providers", ready=[name for name in app[PROVIDERS] if name not in missing])
    if missing:        # their models are unlisted and refused until the operator sets what is named
        log.warning("providers_without_keys", set=missing)
    yield
    await pool.close()
    await session.close()


async def _background_tasks(app: web.Application):
    await acall_all(app[PM].hook.gateway_startup, app=app)
    yield
    # Cleanups run in reverse: settlement tasks drain before the session and database close.
    if app[BACKGROUND]:
        await asyncio.gather(*app[BACKGROUND], return_exceptions=True)


# ---- the gateway's own layer ------------------------------------------------------

@web.middleware
async def gateway_layer(request: web.Request, handler):
    """The core's one middleware around every request: its id and log context, the answer
    to an OPTIONS request a plugin gives (a CORS preflight), and errors as JSON. One frame,
    not one per concern: a call's handler is resumed several times, and every resume passes
    through each frame above it. Each concern is a plain function."""
    begin_request(request)
    try:
        response = options_answer(request) if request.method == "OPTIONS" else None
        if response is None:
            response = await handler(request)
    except Exception as exc:
        response = error_answer(request, exc)
        if response is None:
            raise
    return response


def options_answer(request: web.Request) -> web.StreamResponse | None:
    """The first answer a plugin gives to an OPTIONS request (a CORS preflight), if any."""
    for answer in request.app[OPTIONS_ANSWERS]:
        response = answer(request)
        if response is not None:
            return response
    return None


def begin_request(request: web.Request) -> None:
    """Every request gets the gateway's own id: the `X-Request-Id` answered, the logs'
    `request_id` and, for a call, its usage row's id (unique, so never the client's). An id
    the client sent (`X-Request-Id` or `X-Client-Request-Id`) is logged beside it."""
    request_id = new_id()
    request[REQUEST_ID] = request_id
    client_id = request.headers.get("X-Client-Request-Id") or request.headers.get("X-Request-Id")
    if client_id:
        logs.REQUEST_FIELDS.set({"request_id": request_id, "path": request.path, "client_request_id": client_id[:128]})
    else:
        logs.REQUEST_FIELDS.set({"request_id": request_id, "path": request.path})


def error_answer(request: web.Request, exc: Exception) -> web.Response | None:
    """Outside the chat pipeline (which renders its own format's errors): every error is
    OpenAI-shaped JSON, and nothing ever leaks a traceback. None: not an error answer (a
    redirect, a client that left), raised on as it is."""
    if isinstance(exc, GatewayError):
        body = exc.body if exc.body is not None else openai_error_body(exc)
        return json_response(body, exc.status, exc.headers)
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            return None
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(exc.status)
        message = {404: f"no route {request.method} {request.path}",
                   405: f"{request.method} is not allowed on {request.path}",
                   413: f"request body is larger than {MAX_BODY_BYTES // (1024 * 1024)} MB"}.get(exc.status, exc.reason)
        return json_response(openai_error_body(GatewayError(exc.status, message, code=code)), exc.status)
    if isinstance(exc, ConnectionResetError):
        return None
    log.exception("unhandled_error")
    err = GatewayError(500, "internal error; the operator can find it in the logs by request id",
                       type="api_error", code="internal_error")
    return json_response(openai_error_body(err), 500)


async def _add_request_id(request: web.Request, response: web.StreamResponse) -> None:
    if REQUEST_ID in request:
        response.headers["X-Request-Id"] = request[REQUEST_ID]
    if response.status in NOT_RETRYABLE:       # SDKs and agent CLIs stop retrying at once
        response.headers["x-should-retry"] = "false"


# ---- the chat pipeline ---------------------------------------------------------

def _chat_handler(fmt: ClientFormat):
    async def handler(request: web.Request) -> web.StreamResponse:
        return await run_call(request, fmt, prepare_chat, serve_chat)
    handler.__name__ = f"chat_{fmt.name}"
    return handler


def prepare_chat(ctx: CallContext, body) -> None:
    """Parse a chat body in the endpoint's format into the canonical request."""
    fmt, request = ctx.format, ctx.request
    ctx.chat = fmt.parse(body)
    ctx.chat.headers = {h: request.headers[h] for h in fmt.pass_headers if h in request.headers}
    ctx.model_id, ctx.streaming, ctx.pricer = ctx.chat.model, ctx.chat.stream, CHAT_PRICER
    ctx.input_chars, ctx.input_images = measure_input(ctx.chat)


async def serve_chat(ctx: CallContext) -> web.StreamResponse:
    if ctx.chat.stream:
        return await relay_stream(ctx.request, ctx, ctx.format)
    answer = await ctx.route.provider.complete(ctx.chat, ctx.route.model)
    ctx.usage = answer.usage
    ctx.output_chars = len(answer.text()) + sum(len(c.arguments) for c in answer.tool_calls())
    await succeeded(ctx)
    return json_response(ctx.format.render(answer, ctx), headers=ctx.response_headers)


async def relay_stream(request: web.Request, ctx: CallContext, fmt: ClientFormat) -> web.StreamResponse:
    """Relay a provider stream chunk by chunk. Errors before the first event are plain
    JSON errors with their status; after it, they become the format's in-band error."""
    events = ctx.route.provider.stream(ctx.chat, ctx.route.model).__aiter__()
    try:
        first = await events.__anext__()        # upstream errors surface here, before any byte
    except StopAsyncIteration:
        raise UpstreamError(502, f"{ctx.route.provider.name} sent an empty stream") from None
    ctx.first_token_seconds = time.monotonic() - ctx.started
    writer = fmt.stream_writer(ctx)
    resp = web.StreamResponse(headers={**SSE_HEADERS, **ctx.response_headers})
    await resp.prepare(request)
    ctx.status = 200
    gather = ctx.route.provider.emits_flush    # else write every event at once
    pending: list[bytes] = []

    async def send() -> None:
        await resp.write(b"".join(pending))
        pending.clear()

    item = first
    try:
        while True:
            for ev in item if item.__class__ is list else (item,):   # a list: what one read brought
                if ev.__class__ is TextRun:         # most text: checked first, by class alone
                    ctx.output_chars += sum(map(len, ev.texts))
                    pending.append(writer.texts(ev))
                    if not gather:
                        await send()
                    continue
                if ev.__class__ is TextDelta:
                    ctx.output_chars += len(ev.text)
                elif isinstance(ev, Flush):         # what the read brought is all here
                    if pending:
                        await send()
                    continue
                elif isinstance(ev, StreamEnd):
                    ctx.usage = ev.usage or Usage(ctx.hold.input_tokens, estimate_tokens(ctx.output_chars))
                    ev.usage = ctx.usage
                    ctx.outcome = OK
                    await finish(ctx)               # the last chunk carries the billing
                elif isinstance(ev, ToolCallDelta):
                    ctx.output_chars += len(ev.arguments)
                elif isinstance(ev, (TextDelta, ReasoningDelta)):
                    ctx.output_chars += len(ev.text)
                chunk = writer.event(ev)
                if chunk:
                    pending.append(chunk)
                # The end goes at once when events come one at a time (the upstream may be slow to
                # close); a read's end waits for the response's end, which follows it at once.
                if pending and (not gather or (isinstance(ev, StreamEnd) and item.__class__ is not list)):
                    await send()
            if pending and item.__class__ is list and ctx.outcome != OK:   # a read's events leave together
                await resp.write(b"".join(pending))
                pending.clear()
            try:
                item = await events.__anext__()
            except StopAsyncIteration:
                if ctx.outcome != OK:
                    raise UpstreamError(502, f"{ctx.route.provider.name} ended the stream early") from None
                break
        # What is left (a read's events that ended the stream, a same-format upstream's last
        # frame) goes with the response's end, in one write.
        await resp.write_eof(b"".join(pending))
    except GatewayError as err:                 # upstream failed mid-stream: never charged
        ctx.outcome = FAILED
        ctx.note_error(err)
        await finish(ctx)
        log.warning("stream_failed", error=err.message)
        try:
            await resp.write_eof(b"".join(pending) + writer.error(err))
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            pass
    except (ConnectionResetError, asyncio.CancelledError):
        if ctx.outcome != OK:
            ctx.outcome = CLIENT_GONE           # charge what was produced, release the rest
        log.info("client_disconnected", output_chars=ctx.output_chars)
        raise
    finally:
        await events.aclose()
    return resp


# ---- logging -------------------------------------------------------------------

def configure_logging(level: str = "info", json_logs: bool | None = None) -> None:
    logs.configure(level, json_logs)


# ---- CLI -----------------------------------------------------------------------

def cmd_run(args) -> int:
    cfg = config_mod.load(args.config)
    cfg.server.listen(args.host, args.port)        # links (public_url) follow unless it is set
    configure_logging(args.log_level)
    app = create_app(cfg, plugins_dir=args.plugins_dir)
    host, port = cfg.server.host, cfg.server.port
    if args.workers > 1 and not workers.is_worker():
        return workers.supervise(_child_argv(args), args.workers, host, port)
    try:
        import uvloop              # a faster event loop, where installed
        uvloop.install()
    except ImportError:
        pass
    if workers.is_worker():
        app.cleanup_ctx.append(workers.parent_watch)
    redis = redis_url(cfg)
    log.info("starting", host=host, port=port, public_url=cfg.server.public_url, config=cfg.path,
             database=config_mod.redact_url(cfg.storage_url), redis=config_mod.redact_url(redis) if redis else None,
             chat_models=len(cfg.chat_models),
             providers=config_mod.redact({p.name: {"type": p.type, **p.settings} for p in cfg.providers.values()}))
    try:
        try:
            asyncio.run(serve(app, host, port, cfg.server, reuse_port=workers.is_worker()))
        finally:
            logs.flush()                    # every line of the run is out before anything else is said
    except StartupError as err:
        print(f"gateway: {err}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"gateway: cannot listen on {host}:{port}: {exc.strerror or exc}; stop what uses it or "
              "choose another port with --port", file=sys.stderr)
        return 2
    return 0


def _child_argv(args) -> list[str]:
    """`gateway run` for one worker: the same options, one process."""
    argv = ["run", "--log-level", args.log_level]
    for flag, value in (("--config", args.config), ("--plugins-dir", args.plugins_dir)):
        if value:
            argv += [flag, os.path.abspath(value)]
    return argv


def cmd_check(args) -> int:
    cfg = config_mod.load(args.config)
    create_app(cfg, plugins_dir=args.plugins_dir)
    print(f"{cfg.path}: OK ({len(cfg.providers)} providers, {len(cfg.chat_models)} chat models, "
          f"{len(cfg.media_models)} media models; database {config_mod.redact_url(cfg.storage_url)})")
    return 0


LOG_LEVELS = ("debug", "info", "warning", "error")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def build_parser(pm) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gateway", description="Self-hosted AI gateway.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="serve the gateway")
    run.add_argument("--host")
    run.add_argument("--port", type=int)
    run.add_argument("--log-level", default="info", type=str.lower, choices=LOG_LEVELS)
    run.add_argument("--workers", type=_positive, default=1,
                     help="processes serving the port (SO_REUSEPORT), sharing the configured stores")
    run.set_defaults(func=cmd_run)
    check = sub.add_parser("check", help="validate a config file without starting")
    check.set_defaults(func=cmd_check)
    for p in (run, check):
        p.add_argument("--config", help="YAML config (default: the embedded demo)")
        p.add_argument("--plugins-dir", help="load every *.py in this folder as a plugin")
    pm.hook.gateway_register_commands(subparsers=sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--plugins-dir")
    known, _ = pre.parse_known_args(argv)
    try:
        pm = get_plugin_manager(plugins_dir=known.plugins_dir)
        args = build_parser(pm).parse_args(argv)
        code = int(args.func(args) or 0)
        sys.stdout.flush()                   # a reader that left is noticed here, not at exit
        return code
    except config_mod.ConfigError as err:    # an operator's mistake: say what to fix, no traceback
        print(f"gateway: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:                  # `gateway keys list | head`: the reader left, which is fine
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # no second error at exit's flush
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
