"""Every hook the gateway calls. One docstring each: when it fires, what it returns,
whether the first answer wins or all are collected, and whether it may be async.

Two kinds:
- registration hooks: sync, called once at start-up, llm-style `register` callbacks;
- pipeline hooks: called per request through `first_for` / `each_for` (those taking `ctx`
  alone) or `acall_all` (see plugins/__init__.py), so they MAY be `async def`, or plain
  functions that return an awaitable only when they have one to wait on. pluggy cannot
  await, so none of them uses `firstresult=True` or wrappers; `check_async_safe` enforces that.

Pipeline hooks take one `ctx` (a `plugins.context.CallContext`) and signal refusal by
raising `plugins.errors.GatewayError`.
"""
import pluggy

hookspec = pluggy.HookspecMarker("gateway")


# ---- registration (sync, once) --------------------------------------------------

@hookspec
def gateway_register_providers(register):
    """Startup. Call `register(ProviderClass)` for each provider type this plugin adds;
    the class's `type_name` is what `providers.<name>.type` names in YAML."""


@hookspec
def gateway_register_formats(register):
    """Startup. Call `register(fmt)` for each client wire format: an object with `name`,
    `path` (the POST route), `endpoint`, `key_required`, `max_input_chars`, `parse`,
    `render`, `stream_writer` and `error_response` (see plugins/formats/base.py)."""


@hookspec
def gateway_register_routes(register, config):
    """Startup. Call `register(method, path, handler)` for each HTTP route; the handler
    is `async def handler(request) -> web.StreamResponse`."""


@hookspec
def gateway_register_commands(subparsers):
    """CLI start. Add argparse sub-commands: `p = subparsers.add_parser(...)` and
    `p.set_defaults(func=callable(args) -> int)`."""


@hookspec
def gateway_register_payment_methods(register):
    """Startup. Call `register(ChainClass)` for each x402 payment chain type; the class's
    `type_name` is what `payments.x402.chains[].type` names in YAML."""


@hookspec
def gateway_register_artifact_stores(register):
    """Startup. Call `register(StoreClass)` for each place rendered media can be kept; the
    class's `type_name` is what `media.artifacts.type` names in YAML (default: local)."""


@hookspec
def gateway_register_settings(register):
    """Startup, before anything is configured. Call `register(section, Schema)` for each
    top-level YAML section this plugin owns; `Schema` derives from `config.schema.Section`
    (a pydantic model: unknown keys and wrong types are refused with their key path).
    `gateway check` and `gateway run` validate every section, then call each schema's
    `references(known)` to check names of models and providers. Read the result in
    `gateway_configure` as `config.settings(section)`."""


@hookspec
def gateway_configure(app, config):
    """App creation, after the core is set up and every section is validated. Read your
    typed settings (`config.settings(name)`) and keep what you need on the app; raise
    config.ConfigError with key paths for what a schema cannot express."""


@hookspec
def gateway_register_migrations(register):
    """Startup. Call `register(name, sql)` for each schema step this plugin's own tables
    need; names sort into order (e.g. "5000_notes") and each runs once per database. `sql`
    is one string for every engine, or {"sqlite": ..., "postgresql": ...} where they differ.
    The built-in tables are the storage backends' own (plugins.storage)."""


@hookspec
def gateway_register_readiness_checks(app, register):
    """App creation, after `gateway_configure`. Call `register(name, check)` for each store
    or service the gateway cannot serve without; `check(app)` is async and raises (or
    times out) when it is not answering. `GET /readyz` runs them all, each with a short
    deadline, and answers 503 naming the failing ones."""


@hookspec
def gateway_client_trace_configs(app):
    """App start, when the shared upstream ClientSession and the chat calls' connection pool
    are made. Return a list of `aiohttp.TraceConfig` to attach to both (e.g. spans per
    upstream request: the pool sends their request start, end and exception signals), or
    None. All run."""


@hookspec
def gateway_startup(app):
    """After the database and HTTP session are open, before serving. May be async.
    All implementations run (e.g. release holds a crash left behind)."""


# ---- pipeline (per request, may be async) ---------------------------------------

@hookspec
def gateway_authenticate(ctx):
    """First stage. Return a `Principal` for the credential on the request, or None when
    this plugin does not recognise it. First non-None wins. Raise GatewayError(401) for
    a credential that is recognised but invalid."""


@hookspec
def gateway_admit(ctx):
    """After authentication. Refuse a request the service will not take (400 policy such
    as streaming without a key, 413 size, 429 rate) by raising GatewayError. All run."""


@hookspec
def gateway_moderate(ctx):
    """After admission, before any upstream call. Raise GatewayError(422) for content the
    service refuses. All run."""


@hookspec
def gateway_select_route(ctx):
    """Pick the model that serves the call: return a `Route`, or None to let another
    plugin decide. First non-None wins. Raise GatewayError(400) for an unknown model."""


@hookspec
def gateway_reserve(ctx):
    """Before the upstream call. Secure payment for the worst case (a hold on credits,
    or a verified x402 payment) and return a `Hold`; raise GatewayError(402) when the
    caller cannot pay. First non-None wins."""


@hookspec
def gateway_settle(ctx):
    """After the call ends however it ended (`ctx.outcome`): charge what was produced and
    release the rest of the hold, exactly once. All run. Must not raise for a client
    that went away; runs even when the request task was cancelled."""


@hookspec
def gateway_record_usage(ctx):
    """After settlement: record the call (usage rows, metrics, logs). All run."""


@hookspec
def gateway_call_refused(ctx, error):
    """A call was refused before its upstream stage (a stage raised `error`, a GatewayError:
    401, 402 challenge, 422, 429, ...); it has no settlement and no usage row. Observe it
    (metrics, logs); must not raise. All run; may be async."""


@hookspec
def gateway_account_info(app, principal):
    """`GET /api/v1/account`: return a dict of extra fields for the caller's account
    (e.g. `free_allowance_left_usd`), or None. All run; may be async."""


@hookspec
def gateway_request_wrapper(ctx):
    """Around the whole pipeline: return an async context manager (or None). Entered in
    call order, exited in reverse, even on errors."""
