"""`check()`: every section against its schema, then the cross-references, before the
gateway starts. Plugins own their sections through `gateway_register_settings`."""
from __future__ import annotations

from typing import Callable

from . import CORE_SECTIONS, OTHER_CORE, Config, ConfigError, _parse
from .problems import did_you_mean, join
from .schema import Known, Section


def registered_sections(pm) -> dict[str, type[Section]]:
    """Section name -> schema, from every plugin's `gateway_register_settings`."""
    out: dict[str, type[Section]] = {}

    def register(name: str, schema: type[Section]) -> None:
        if name in out or name in CORE_SECTIONS or name in OTHER_CORE:
            raise ValueError(f"two plugins declare the settings section {name!r}")
        out[name] = schema

    pm.hook.gateway_register_settings(register=register)
    return out


def check(cfg: Config, pm, provider_types: dict[str, type]) -> None:
    """Validate every section and provider block; fill `cfg.sections` and each provider's
    `typed`. Raises ConfigError with every problem found."""
    file, problems = cfg.path, []
    schemas = registered_sections(pm)
    names = [*CORE_SECTIONS, *OTHER_CORE, *schemas]
    problems += [f"{file}: {key}: unknown section{did_you_mean(key, names)}" for key in cfg.raw if key not in names]
    for name, schema in schemas.items():
        cfg.sections[name] = _parse(problems, file, schema, cfg.raw.get(name), name)
    for p in cfg.providers.values():
        cls = provider_types.get(p.type)
        if cls is None:
            near = did_you_mean(p.type, provider_types) or f" (known: {', '.join(sorted(provider_types))})"
            problems.append(f"{file}: providers.{p.name}.type: no provider type {p.type!r}{near}")
        else:
            p.typed = _parse(problems, file, cls.Settings, p.settings, f"providers.{p.name}")
    if problems:
        raise ConfigError(problems)
    known = Known(set(cfg.providers), set(cfg.chat_models), cfg.media_models)
    for name, section in cfg.sections.items():
        problems += [f"{file}: {join(name, path)}: {what}" for path, what in section.references(known)]
    if problems:
        raise ConfigError(problems)


