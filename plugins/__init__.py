"""The plugin system: pluggy for specs, discovery, ordering and validation; our own
awaiting helpers because pluggy cannot await (STYLE.md section 4).

Plugins load in this order: DEFAULT_PLUGINS (built-ins), the `gateway` entry-point group
(skipped under tests; `GATEWAY_LOAD_PLUGINS=a,b` allow-lists names), modules or .py files
listed under `plugins:` in the YAML, then `*.py` files of `--plugins-dir`. pluggy calls later
registrations first, so user plugins win over built-ins.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Iterable

import pluggy

from config import Config, ConfigError
from config import load as load_config
from config.problems import did_you_mean

from . import hookspecs

hookimpl = pluggy.HookimplMarker("gateway")

DEFAULT_PLUGINS = (
    "providers",
    "plugins.redis_link",
    "plugins.formats.chat_completions",
    "plugins.formats.messages",
    "plugins.formats.responses",
    "plugins.auth",
    "plugins.keypolicy",
    "plugins.admission",
    "plugins.ratelimit",
    "plugins.moderation",
    "plugins.routing",
    "plugins.router",
    "plugins.router_eval",
    "plugins.router_train",
    "plugins.billing",
    "plugins.allowance",
    "plugins.x402",
    "plugins.x402.chains",
    "plugins.credits",
    "plugins.agents",
    "plugins.keyless",
    "plugins.usage",
    "plugins.accounts",
    "plugins.account_keys",
    "plugins.listings",
    "plugins.catalog",
    "plugins.media",
    "plugins.media.artifacts",
    "plugins.cors",
    "plugins.admin",
    "plugins.admin.cli",
    "plugins.dashboard",
    "plugins.openapi",
    "plugins.health",
    "plugins.metrics",
    "plugins.tracing",
)

# Hooks called per request through first_for / each_for / acall_all: never wrappers.
PIPELINE_HOOKS = (
    "gateway_startup",
    "gateway_authenticate",
    "gateway_admit",
    "gateway_moderate",
    "gateway_select_route",
    "gateway_reserve",
    "gateway_settle",
    "gateway_record_usage",
    "gateway_call_refused",
    "gateway_request_wrapper",
    "gateway_account_info",
)


def get_plugin_manager(extra_modules: Iterable[str] = (), plugins_dir: str | None = None,
                       *, load_entrypoints: bool | None = None) -> pluggy.PluginManager:
    """A fresh plugin manager (one per app, never a module global)."""
    pm = pluggy.PluginManager("gateway")
    pm.add_hookspecs(hookspecs)
    for name in DEFAULT_PLUGINS:
        pm.register(importlib.import_module(name), name)
    if load_entrypoints is None:
        load_entrypoints = not getattr(sys, "_called_from_test", False)
    if load_entrypoints:
        _load_entrypoints(pm)
    for name in extra_modules:
        if pm.get_plugin(name) is None:
            pm.register(_load_module(name), name)
    if plugins_dir:
        if not Path(plugins_dir).is_dir():
            raise ConfigError([f"--plugins-dir: {plugins_dir} is not a folder"])
        for path in sorted(Path(plugins_dir).glob("*.py")):
            pm.register(_load_module(str(path)), f"plugins-dir:{path.name}")
    if os.environ.get("GATEWAY_TRACE_PLUGINS"):
        pm.add_hookcall_monitoring(_trace_before, _trace_after)
    try:
        check_async_safe(pm)
    except pluggy.PluginValidationError as exc:
        raise ConfigError([_hook_problem(pm, exc)]) from None
    return pm


def load_checked(path: str | None, plugins_dir: str | None = None) -> tuple[Config, pluggy.PluginManager]:
    """The config at `path`, every section checked against its schema, and its plugins: what
    the CLI commands use so they refuse exactly what `gateway run` refuses."""
    from config.check import check
    cfg = load_config(path)
    pm = get_plugin_manager(cfg.plugins, plugins_dir)
    types: dict[str, type] = {}
    pm.hook.gateway_register_providers(register=lambda cls: types.setdefault(cls.type_name, cls))
    check(cfg, pm, types)
    return cfg, pm


def _load_module(name: str):
    """A plugin by module name or .py path; a ConfigError (one line) when it cannot load."""
    try:
        if name.endswith(".py"):
            if not Path(name).is_file():
                raise ConfigError([f"plugins: no plugin file {name} (a .py path is relative to the config file)"])
            return _module_from_path(Path(name))
        return importlib.import_module(name)
    except ImportError as exc:
        raise ConfigError([f"plugins: cannot import {name!r}: {exc}"]) from None
    except SyntaxError as exc:
        raise ConfigError([f"plugins: {exc.filename}, line {exc.lineno}: {exc.msg}"]) from None


def _hook_problem(pm: pluggy.PluginManager, exc: pluggy.PluginValidationError) -> str:
    """pluggy's complaint about a plugin -> one line naming the plugin and the fix."""
    known = [name for name in dir(hookspecs) if name.startswith("gateway_")]
    for name in dir(exc.plugin):
        if name.startswith("gateway_") and name not in known:
            return f"plugin {pm.get_name(exc.plugin)}: {name} is not a hook{did_you_mean(name, known)}"
    return f"plugin {pm.get_name(exc.plugin) or exc.plugin}: {exc}"


def _load_entrypoints(pm: pluggy.PluginManager) -> None:
    allow = os.environ.get("GATEWAY_LOAD_PLUGINS")
    if allow is None:
        pm.load_setuptools_entrypoints("gateway")
        return
    for name in filter(None, (n.strip() for n in allow.split(","))):
        pm.load_setuptools_entrypoints("gateway", name=name)


def _module_from_path(path: Path):
    spec = importlib.util.spec_from_file_location(f"gateway_plugin_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _trace_before(hook_name, impls, kwargs):
    print(f"hook {hook_name} -> {[i.plugin_name for i in impls]}", file=sys.stderr)


def _trace_after(outcome, hook_name, impls, kwargs):
    pass


def check_async_safe(pm: pluggy.PluginManager) -> None:
    """Refuse misspelled hooks and wrappers on hooks that may be async."""
    pm.check_pending()
    for name in PIPELINE_HOOKS:
        for impl in getattr(pm.hook, name).get_hookimpls():
            if impl.wrapper or impl.hookwrapper:
                raise pluggy.PluginValidationError(
                    impl.plugin, f"{impl.plugin_name}: wrappers cannot await; not allowed on {name}")


def _impls(hook) -> list:
    """pluggy's call order (tryfirst, then the latest registered, then trylast), as
    (function, its one argument's name or None, argument names) triples; cached until the
    registered impls change."""
    current = hook._hookimpls              # pluggy's own list: read, never copied, on the hot path
    cached = _ORDER.get(hook)
    if cached is None or cached[0] != len(current):
        cached = _ORDER[hook] = (len(current), [
            (i.function, i.argnames[0] if len(i.argnames) == 1 else None, tuple(i.argnames)) for i in reversed(current)])
    return cached[1]


_ORDER: dict = {}      # hook caller -> (impl count, ordered impls as _impls gives them); plugins register at start


# An impl may be a plain function or a coroutine function: its result is awaited only when
# it is awaitable, inline (no wrapper coroutine per impl: this runs a few dozen times a call).
# Most impls take one argument (ctx): that one is passed without building an argument list.

async def acall_all(hook, **kw) -> list:
    """Await every impl in order (sequentially, so impls may build on each other's changes
    to ctx); return the non-None results."""
    results = []
    for function, one, argnames in _impls(hook):
        res = function(kw[one]) if one is not None else function(*[kw[a] for a in argnames])
        if res is not None and hasattr(res, "__await__"):
            res = await res
        if res is not None:
            results.append(res)
    return results


# The pipeline's hooks take the call alone (`ctx`), so their impls take it or nothing: these
# two pass it without an argument dict per dispatch (about ten dispatches a call).

async def first_for(hook, ctx):
    """Await impls in pluggy order, each given the call; return the first non-None result
    (a real short-circuit: later impls never run)."""
    for function, one, _ in _impls(hook):
        res = function(ctx) if one is not None else function()
        if res is not None and hasattr(res, "__await__"):
            res = await res
        if res is not None:
            return res
    return None


async def each_for(hook, ctx) -> None:
    """`acall_all(hook, ctx=ctx)` for a hook whose one argument is the call, when nobody
    reads the results."""
    for function, one, _ in _impls(hook):
        res = function(ctx) if one is not None else function()
        if res is not None and hasattr(res, "__await__"):
            await res


def has_impls(hook) -> bool:
    return bool(hook.get_hookimpls())


_NOTHING_AROUND = contextlib.nullcontext()


def around(pm: pluggy.PluginManager, ctx):
    """Enter every `gateway_request_wrapper` context manager; replaces `wrapper=True`.
    Without any (the usual case) a shared no-op context manager."""
    if not _impls(pm.hook.gateway_request_wrapper):
        return _NOTHING_AROUND
    return _around(pm, ctx)


@contextlib.asynccontextmanager
async def _around(pm: pluggy.PluginManager, ctx):
    async with contextlib.AsyncExitStack() as stack:
        for cm in await acall_all(pm.hook.gateway_request_wrapper, ctx=ctx):
            await stack.enter_async_context(cm)
        yield
