"""Configuration: one YAML file (plus the files it includes) -> a typed `Config`.

- `${VAR}` and `${VAR:-default}` expand from the environment inside string values; a
  missing variable without a default is an error naming it and its key path.
- `include: [models.yaml]` loads other files first (paths relative to the including
  file; `builtin:NAME` means the file shipped in this package). The including file
  wins; model lists merge by `id`, mappings merge key by key.
- Every error names the file, the key path and what is wrong; `ConfigError` stops the
  gateway before it serves anything.
- Every section is a typed schema (config/schema.py): the core ones here, each plugin's
  through `gateway_register_settings`, each provider type's on its class; `check()` runs
  them all, then the cross-references, before anything starts.
- Prices become integers (micro-USD per million tokens, micro-USD per unit) here, once,
  from their decimal text: money is never a float inside the gateway (config/money.py).
- Relative paths (the SQLite file, the artifact folder, plugin files) are relative to the
  config file's folder; for the embedded default, to the per-user data folder (`data_dir()`).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .lifecycle import Lifecycle, check_replacements
from .money import MICRO, discounted, format_usd, parse_usd, usd  # noqa: F401 - the money API lives here
from .problems import did_you_mean, parse_yaml, translate
from .schema import (
    ChatModelEntry, ImageModelEntry, MediaEntry, PricingSettings, Section, ServerSettings, VideoModelEntry,
)

BUILTIN_DIR = Path(__file__).resolve().parent
DEFAULT_CONFIG = BUILTIN_DIR / "gateway.yaml"
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_NUMBER = re.compile(r"-?\d+(\.\d+)?")
_SECRET_KEY = re.compile(r"(secret|api_key|password|(?<!max_)token|private_key)", re.I)


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
    typed: Any = None          # the provider type's `Settings`, validated by check()


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
    context_length: int | None = None     # tokens, as the provider documents them
    max_output_tokens: int | None = None
    lifecycle: Lifecycle = Lifecycle()


@dataclass
class Config:
    path: str
    server: ServerSettings
    storage_url: str                  # sqlite:///PATH (made absolute) or postgresql://user:password@host:port/db
    discount: Fraction
    providers: dict[str, ProviderConfig]
    chat_models: dict[str, ChatModel]
    plugins: list[str]
    raw: dict[str, Any]
    base_dir: Path = Path(".")
    media_models: dict[str, MediaEntry] = field(default_factory=dict)
    sections: dict[str, Section] = field(default_factory=dict)   # name -> typed settings (after check())

    def settings(self, name: str):
        """The typed settings of section `name` (registered by the plugin that owns it)."""
        return self.sections[name]

    def plugin_config(self, name: str) -> dict[str, Any]:
        """Settings for a third-party plugin: `plugin_config: {NAME: {...}}`."""
        return (self.raw.get("plugin_config") or {}).get(name) or {}

    def resolve(self, path: str) -> str:
        """A path from the config, relative to the config file's folder (or the data folder)."""
        return str(self.base_dir / path)


def data_dir(env=None) -> Path:
    """Where the embedded default keeps its database and files, whatever the working
    directory: $GATEWAY_HOME, else $XDG_DATA_HOME/gateway, else ~/.local/share/gateway."""
    env = os.environ if env is None else env
    if env.get("GATEWAY_HOME"):
        return Path(env["GATEWAY_HOME"]).expanduser()
    base = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "gateway"


# ---- loading -------------------------------------------------------------------

def load(path: str | os.PathLike | None = None, env: dict[str, str] | None = None) -> Config:
    """Load, expand, merge and validate a config file (default: the embedded demo)."""
    env = os.environ if env is None else env
    file = Path(path) if path else DEFAULT_CONFIG
    raw, unset = _load_tree(file, env, seen=())
    base_dir = data_dir(env) if file.resolve() == DEFAULT_CONFIG else file.resolve().parent
    return _build(str(file), raw, unset, base_dir)


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
        data, duplicates = parse_yaml(text)
        data = data or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([f"{file}: not valid YAML{where}: {problem}"]) from None
    if duplicates:
        raise ConfigError([f"{file}: {d}" for d in duplicates])
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

    value = _VAR.sub(sub, node)
    # `port: "${PORT:-8080}"`: a value that is one variable and reads as a number is that number
    # (typed sections refuse the text "8080"); secrets and addresses stay text.
    if _VAR.fullmatch(node) and _NUMBER.fullmatch(value) and not _SECRET_KEY.search(path.rsplit(".", 1)[-1]):
        return float(value) if "." in value else int(value)
    return value


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


# ---- the core sections ------------------------------------------------------------

CORE_SECTIONS = {"server": ServerSettings, "pricing": PricingSettings}
OTHER_CORE = ("storage", "redis", "providers", "models", "plugins", "include", "plugin_config")   # redis: plugins.redis_link checks it


def _parse(problems: list[str], file: str, model, value, path: str):
    """Validate `value` against `model`; add translated problems; None when invalid."""
    if value is None:
        value = {}
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        problems += [f"{file}: {p}" for p in translate(exc, model, path)]
        return None


def parse_section(cfg: "Config", schema, value, path: str):
    """Validate one block against `schema` now (for blocks typed by a plugin's own registry,
    e.g. an artifact store's type); raises ConfigError with key paths."""
    problems: list[str] = []
    result = _parse(problems, cfg.path, schema, value, path)
    if problems:
        raise ConfigError(problems)
    return result


def _build(file: str, raw: dict, unset: dict[str, str], base_dir: Path) -> Config:
    problems: list[str] = []
    sections = {name: _parse(problems, file, model, raw.get(name), name) or model()
                for name, model in CORE_SECTIONS.items()}
    server: ServerSettings = sections["server"]

    storage_url = raw.get("storage", "sqlite:///gateway.db")
    if not isinstance(storage_url, str) or not storage_url.startswith(("sqlite:///", "postgresql://", "postgres://")):
        problems.append(f"{file}: storage: expected sqlite:///PATH (e.g. sqlite:///gateway.db) or "
                        f"postgresql://user:password@host:port/dbname, got {redact_url(storage_url)!r}")
    elif storage_url.startswith("sqlite:///"):     # a relative file is relative to the config's folder
        storage_url = "sqlite:///" + str(base_dir / (storage_url[len("sqlite:///"):] or "gateway.db"))

    providers: dict[str, ProviderConfig] = {}
    blocks = raw.get("providers") or {}
    if not isinstance(blocks, dict):
        problems.append(f"{file}: providers: expected a mapping of name -> {{type: ..., settings}}")
        blocks = {}
    for name, block in blocks.items():
        path = f"providers.{name}"
        if not isinstance(block, dict) or not isinstance(block.get("type"), str) or not block["type"]:
            problems.append(f"{file}: {path}.type: required (the provider plugin, e.g. openai)"
                            if isinstance(block, dict) else f"{file}: {path}: expected a mapping")
            continue
        prefix = f"{path}."
        providers[name] = ProviderConfig(
            name=name, type=block["type"], settings={k: v for k, v in block.items() if k != "type"},
            unset_env={k[len(prefix):]: v for k, v in unset.items() if k.startswith(prefix)})

    models = _parse(problems, file, ModelsSection, raw.get("models"), "models") or ModelsSection()
    discount = sections["pricing"].discount
    chat_models: dict[str, ChatModel] = {}
    media: dict[str, MediaEntry] = {}
    for kind, entries in (("chat", models.chat), ("image", models.image), ("video", models.video)):
        for i, entry in enumerate(entries):
            path = f"models.{kind}[{i}]"
            if entry.id in chat_models or entry.id in media:
                problems.append(f"{file}: {path}.id: duplicate model id {entry.id!r}")
            if entry.provider not in providers:
                problems.append(f"{file}: {path}.provider: no provider named {entry.provider!r} under providers "
                                f"(known: {', '.join(sorted(providers)) or 'none'})"
                                f"{did_you_mean(entry.provider, providers)}")
            if kind == "chat":
                chat_models[entry.id] = _chat_model(entry, discount)
            else:
                media[entry.id] = entry
    ids = {kind: [m.id for m in entries] for kind, entries in
           (("chat", models.chat), ("image", models.image), ("video", models.video))}
    for kind in ids:
        for i, entry in enumerate(getattr(models, kind)):
            problems += check_replacements(file, kind, i, entry, ids[kind])

    plugins = raw.get("plugins") or []
    if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
        problems.append(f"{file}: plugins: expected a list of module names or .py files")
        plugins = []
    # A .py entry is a file, relative to the config file that names it.
    plugins = [str((Path(file).parent / p).resolve()) if p.endswith(".py") and not Path(p).is_absolute() else p
               for p in plugins]
    problems += [f"{file}: plugins[{i}]: no file {p} (a .py path is relative to the config file)"
                 for i, p in enumerate(plugins) if p.endswith(".py") and not Path(p).is_file()]
    plugin_config = raw.get("plugin_config") or {}
    if not isinstance(plugin_config, dict) or not all(isinstance(v, dict) for v in plugin_config.values()):
        problems.append(f"{file}: plugin_config: expected a mapping of plugin name -> its settings")

    if problems:
        raise ConfigError(problems)
    return Config(path=file, server=server, storage_url=storage_url, discount=discount,
                  providers=providers, chat_models=chat_models, plugins=plugins, raw=raw,
                  base_dir=base_dir, media_models=media, sections=sections)


class ModelsSection(Section):
    chat: list[ChatModelEntry] = []
    image: list[ImageModelEntry] = []
    video: list[VideoModelEntry] = []


def _chat_model(entry: ChatModelEntry, discount) -> ChatModel:
    li, lo = entry.list_input_usd_per_mtok or 0, entry.list_output_usd_per_mtok or 0
    return ChatModel(
        id=entry.id, label=entry.label or entry.id, provider=entry.provider,
        upstream=entry.upstream or entry.id.split("/", 1)[-1],
        list_input_micro=li, list_output_micro=lo,
        input_micro=entry.input_usd_per_mtok if entry.input_usd_per_mtok is not None else discounted(li, discount),
        output_micro=entry.output_usd_per_mtok if entry.output_usd_per_mtok is not None else discounted(lo, discount),
        pricing=entry.pricing, request_micro=entry.usd_per_request or 0,
        tools=entry.tools, vision=entry.vision, note=entry.note,
        context_length=entry.context_length, max_output_tokens=entry.max_output_tokens,
        lifecycle=Lifecycle.of(entry))


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
