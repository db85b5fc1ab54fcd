"""Configuration: one YAML file (plus the files it includes) -> a typed `Config`.

- `${VAR}` and `${VAR:-default}` expand from the environment inside string values; a
  missing variable without a default is an error naming it and its key path.
- `include: [models.yaml]` loads other files first (paths relative to the including
  file; `builtin:NAME` means the file shipped in this package). The including file
  wins; model lists merge by `id`, mappings merge key by key.
- Every error names the file, the key path and what is wrong; `ConfigError` stops the
  gateway before it serves anything.
- Prices become integers (micro-USD per million tokens, micro-USD per unit) here, once,
  from their decimal text: money is never a float inside the gateway.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import yaml

BUILTIN_DIR = Path(__file__).resolve().parent
DEFAULT_CONFIG = BUILTIN_DIR / "gateway.yaml"
MICRO = 1_000_000
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_SECRET_KEY = re.compile(r"(secret|api_key|password|token|private_key)", re.I)


class ConfigError(Exception):
    """Raised with every problem found, each as `file: key.path: what is wrong`."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid configuration:\n  " + "\n  ".join(problems))


@dataclass(slots=True)
class ProviderConfig:
    name: str
    type: str
    settings: dict[str, Any]
    unset_env: dict[str, str] = field(default_factory=dict)   # setting -> env var left empty


@dataclass(slots=True)
class ChatModel:
    id: str
    label: str
    provider: str
    upstream: str
    list_input_micro: int          # micro-USD per million input tokens (list price)
    list_output_micro: int
    input_micro: int               # service price
    output_micro: int
    pricing: str = "per_token"     # per_token | per_request
    request_micro: int = 0         # per_request models
    tools: bool = False
    vision: bool = False
    note: str | None = None


@dataclass(slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    public_url: str = ""
    request_timeout_seconds: float = 30.0    # a request body must arrive within this (408)
    keepalive_seconds: float = 10.0          # idle connections, and request headers, within this
    max_connections: int = 10_000            # one more is refused with a 503


@dataclass
class Config:
    path: str
    server: ServerConfig
    storage_url: str                  # sqlite:///PATH or postgresql://user:password@host:port/db
    discount: Decimal
    providers: dict[str, ProviderConfig]
    chat_models: dict[str, ChatModel]
    plugins: list[str]
    raw: dict[str, Any]

    def section(self, name: str) -> dict[str, Any]:
        """A top-level mapping (e.g. `free`, `limits`) for the plugin that owns it."""
        value = self.raw.get(name)
        return value if isinstance(value, dict) else {}

    def plugin_config(self, name: str) -> dict[str, Any]:
        """Settings for a third-party plugin: `plugin_config: {NAME: {...}}`."""
        return self.section("plugin_config").get(name) or {}


# ---- loading -------------------------------------------------------------------

def load(path: str | os.PathLike | None = None, env: dict[str, str] | None = None) -> Config:
    """Load, expand, merge and validate a config file (default: the embedded demo)."""
    env = os.environ if env is None else env
    file = Path(path) if path else DEFAULT_CONFIG
    raw, unset = _load_tree(file, env, seen=())
    return _build(str(file), raw, unset)


def _resolve_include(name: str, base: Path) -> Path:
    if name.startswith("builtin:"):
        return BUILTIN_DIR / name[len("builtin:"):]
    p = Path(name)
    return p if p.is_absolute() else base.parent / p


def _load_tree(file: Path, env, seen: tuple) -> tuple[dict, dict[str, str]]:
    if file in seen:
        raise ConfigError([f"{file}: include loop through {' -> '.join(map(str, seen))}"])
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{file}: cannot read: {exc.strerror or exc}"]) from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([f"{file}: not valid YAML{where}: {problem}"]) from None
    if not isinstance(data, dict):
        raise ConfigError([f"{file}: the top level must be a mapping of sections"])
    problems: list[str] = []
    unset: dict[str, str] = {}
    data = _expand(data, env, str(file), "", problems, unset)
    if problems:
        raise ConfigError(problems)
    includes = data.pop("include", []) or []
    if isinstance(includes, str):
        includes = [includes]
    if not isinstance(includes, list):
        raise ConfigError([f"{file}: include: expected a list of file names"])
    merged: dict = {}
    for name in includes:
        sub, sub_unset = _load_tree(_resolve_include(str(name), file), env, seen + (file,))
        merged = _merge(merged, sub)
        unset.update(sub_unset)
    return _merge(merged, data), unset


def _expand(node, env, file: str, path: str, problems: list[str], unset: dict[str, str]):
    if isinstance(node, dict):
        return {k: _expand(v, env, file, f"{path}.{k}" if path else str(k), problems, unset)
                for k, v in node.items()}
    if isinstance(node, list):
        return [_expand(v, env, file, f"{path}[{i}]", problems, unset) for i, v in enumerate(node)]
    if not isinstance(node, str) or "${" not in node:
        return node

    def sub(m: re.Match) -> str:
        name, default = m.group(1), m.group(2)
        if name in env and env[name] != "":
            return env[name]
        if default is None:
            problems.append(f"{file}: {path}: environment variable {name} is not set (write "
                            f"${{{name}:-default}} to make it optional)")
            return ""
        if default == "":
            unset[path] = name
        return default

    return _VAR.sub(sub, node)


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        old = out.get(key)
        if isinstance(old, dict) and isinstance(value, dict):
            out[key] = _merge(old, value)
        elif key in ("chat", "image", "video") and isinstance(old, list) and isinstance(value, list):
            out[key] = _merge_by_id(old, value)
        else:
            out[key] = value
    return out


def _merge_by_id(base: list, top: list) -> list:
    index = {m.get("id"): i for i, m in enumerate(base) if isinstance(m, dict)}
    out = list(base)
    for entry in top:
        i = index.get(entry.get("id")) if isinstance(entry, dict) else None
        if i is None:
            out.append(entry)
        else:
            out[i] = {**out[i], **entry}
    return out


# ---- validation ----------------------------------------------------------------

class _Checker:
    """Collects problems with key paths instead of stopping at the first."""

    def __init__(self, file: str):
        self.file = file
        self.problems: list[str] = []

    def fail(self, path: str, what: str) -> None:
        self.problems.append(f"{self.file}: {path}: {what}")

    def mapping(self, value, path: str) -> dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.fail(path, f"expected a mapping, got {_kind(value)}")
            return {}
        return value

    def string(self, d: dict, key: str, path: str, default: str | None = None) -> str | None:
        value = d.get(key, default)
        if value is None:
            self.fail(f"{path}.{key}", "required")
        elif not isinstance(value, str) or not value:
            self.fail(f"{path}.{key}", f"expected a non-empty string, got {_kind(value)}")
            return None
        return value

    def micro(self, value, path: str, *, scale: int = MICRO) -> int | None:
        """A USD amount as text -> integer micro-USD; refuse floats' noise."""
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            self.fail(path, f"expected a number, got {_kind(value)}")
            return None
        try:
            amount = Decimal(str(value)) * scale
        except InvalidOperation:
            self.fail(path, f"expected a number, got {value!r}")
            return None
        if amount < 0:
            self.fail(path, "must not be negative")
            return None
        if amount != amount.to_integral_value():
            self.fail(path, "more precision than one micro-USD (at most 6 decimals)")
            return None
        return int(amount)


def _kind(value) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "true/false",
            type(None): "nothing"}.get(type(value), type(value).__name__)


def _build(file: str, raw: dict, unset: dict[str, str]) -> Config:
    c = _Checker(file)
    server_raw = c.mapping(raw.get("server"), "server")
    server = ServerConfig(host=str(server_raw.get("host", "127.0.0.1")))
    port = server_raw.get("port", 8080)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        c.fail("server.port", f"expected a port number 0-65535, got {port!r}")
    else:
        server.port = port
    server.public_url = str(server_raw.get("public_url") or f"http://{server.host}:{server.port}").rstrip("/")
    for name in ("request_timeout_seconds", "keepalive_seconds", "max_connections"):
        value = server_raw.get(name, getattr(server, name))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            c.fail(f"server.{name}", f"expected a positive number, got {value!r}")
        else:
            setattr(server, name, int(value) if name == "max_connections" else float(value))

    storage_url = raw.get("storage", "sqlite:///gateway.db")
    if not isinstance(storage_url, str) or not storage_url.startswith(("sqlite:///", "postgresql://", "postgres://")):
        c.fail("storage", "expected sqlite:///PATH (e.g. sqlite:///gateway.db) or "
                          f"postgresql://user:password@host:port/dbname, got {redact_url(storage_url)!r}")

    pricing = c.mapping(raw.get("pricing"), "pricing")
    discount = Decimal("0.5")
    if "discount" in pricing:
        try:
            discount = Decimal(str(pricing["discount"]))
            if not Decimal(0) < discount <= Decimal(1):
                raise InvalidOperation
        except InvalidOperation:
            c.fail("pricing.discount", f"expected a number in (0, 1], got {pricing['discount']!r}")

    providers: dict[str, ProviderConfig] = {}
    for name, block in c.mapping(raw.get("providers"), "providers").items():
        path = f"providers.{name}"
        block = c.mapping(block, path)
        ptype = c.string(block, "type", path)
        if ptype:
            prefix = f"{path}."
            providers[name] = ProviderConfig(
                name=name, type=ptype, settings={k: v for k, v in block.items() if k != "type"},
                unset_env={k[len(prefix):]: v for k, v in unset.items() if k.startswith(prefix)})

    models_raw = c.mapping(raw.get("models"), "models")
    chat_models: dict[str, ChatModel] = {}
    chat_list = models_raw.get("chat") or []
    if not isinstance(chat_list, list):
        c.fail("models.chat", "expected a list of models")
        chat_list = []
    for i, entry in enumerate(chat_list):
        model = _chat_model(c, entry, f"models.chat[{i}]", discount, providers)
        if model is None:
            continue
        if model.id in chat_models:
            c.fail(f"models.chat[{i}].id", f"duplicate model id {model.id!r}")
        chat_models[model.id] = model

    plugins = raw.get("plugins") or []
    if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
        c.fail("plugins", "expected a list of module names or .py files")
        plugins = []
    # A .py entry is a file, relative to the config file that names it.
    plugins = [str((Path(file).parent / p).resolve()) if p.endswith(".py") and not Path(p).is_absolute() else p
               for p in plugins]

    if c.problems:
        raise ConfigError(c.problems)
    return Config(path=file, server=server, storage_url=storage_url, discount=discount,
                  providers=providers, chat_models=chat_models, plugins=plugins, raw=raw)


def _chat_model(c: _Checker, entry, path: str, discount: Decimal,
                providers: dict[str, ProviderConfig]) -> ChatModel | None:
    entry = c.mapping(entry, path)
    if not entry:
        return None
    before = len(c.problems)
    mid = c.string(entry, "id", path)
    provider = c.string(entry, "provider", path)
    if provider and provider not in providers:
        c.fail(f"{path}.provider", f"no provider named {provider!r} under providers "
                                   f"(known: {', '.join(sorted(providers)) or 'none'})")
    pricing = entry.get("pricing", "per_token")
    if pricing not in ("per_token", "per_request"):
        c.fail(f"{path}.pricing", f"expected per_token or per_request, got {pricing!r}")
    prices = {}
    for key in ("list_input_usd_per_mtok", "list_output_usd_per_mtok"):
        if key not in entry and pricing == "per_token":
            c.fail(f"{path}.{key}", "required")
        prices[key] = c.micro(entry.get(key, 0), f"{path}.{key}")
    request_micro = 0
    if pricing == "per_request":
        request_micro = c.micro(entry.get("usd_per_request"), f"{path}.usd_per_request") or 0
    own = {k: c.micro(entry[k], f"{path}.{k}") for k in ("input_usd_per_mtok", "output_usd_per_mtok")
           if k in entry}
    if len(c.problems) > before:
        return None

    def service(list_micro: int, own_key: str) -> int:
        if own_key in own:
            return own[own_key]
        return int((Decimal(list_micro) * discount).to_integral_value(ROUND_HALF_UP))

    li, lo = prices["list_input_usd_per_mtok"], prices["list_output_usd_per_mtok"]
    return ChatModel(
        id=mid, label=str(entry.get("label") or mid), provider=provider,
        upstream=str(entry.get("upstream") or mid.split("/", 1)[-1]),
        list_input_micro=li, list_output_micro=lo,
        input_micro=service(li, "input_usd_per_mtok"), output_micro=service(lo, "output_usd_per_mtok"),
        pricing=pricing, request_micro=request_micro,
        tools=bool(entry.get("tools", False)), vision=bool(entry.get("vision", False)),
        note=entry.get("note"))


def redact(node):
    """A copy safe to log: values under secret-looking keys become '***'."""
    if isinstance(node, dict):
        return {k: ("***" if _SECRET_KEY.search(str(k)) and v else redact(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [redact(v) for v in node]
    return node


def redact_url(url):
    """A URL safe to log: its password becomes '***'."""
    if not isinstance(url, str):
        return url
    return re.sub(r"^([a-z]+://[^:/@]*:).*@", r"\1***@", url)


def usd(micro: int) -> float:
    """micro-USD -> a USD number for JSON output (the only place money becomes a float)."""
    return micro / MICRO
