"""When catalog models end: `deprecated`, `retires` and `replacement` on a chat or media
entry, read in one place by the call pipeline (410 from `retires` on), `gateway run`'s
start-up warnings, the listings and `gateway catalog check`.

Dates are UTC calendar days; a model is retired from the first moment of its `retires` day.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any, Iterator

WARN_DAYS = 30          # start-up warnings and `gateway catalog check` look this far ahead


def parse_day(value: Any) -> date:
    """A calendar day: YAML's unquoted 2027-01-14, or the same as text (quoted, or typed on
    the command line)."""
    if isinstance(value, date) and not isinstance(value, datetime):
        return value
    if isinstance(value, str):
        try:
            return date.fromisoformat(value)
        except ValueError:
            pass
    raise ValueError(f"expected a date YYYY-MM-DD, got {value!r}")


@dataclass(frozen=True, slots=True)
class Lifecycle:
    deprecated: date | None = None
    retires: date | None = None
    replacement: str | None = None

    @classmethod
    def of(cls, entry) -> "Lifecycle":
        """From a typed catalog entry (config/schema.py LifecycleFields)."""
        return cls(entry.deprecated, entry.retires, entry.replacement)

    def retired(self, today: date) -> bool:
        return self.retires is not None and today >= self.retires

    def retires_soon(self, today: date, days: int = WARN_DAYS) -> bool:
        """Still served today, and retiring within `days`."""
        return self.retires is not None and today < self.retires <= today + timedelta(days=days)

    def listing(self) -> dict:
        """The listing fields: `deprecation_date` (the end, else the announcement) and
        `replacement`, each only where set."""
        out = {}
        when = self.retires or self.deprecated
        if when:
            out["deprecation_date"] = when.isoformat()
        if self.replacement:
            out["replacement"] = self.replacement
        return out

    def instead(self) -> str:
        return f"; use {self.replacement!r} instead" if self.replacement else ""


def retired_message(model_id: str, lifecycle: Lifecycle) -> str:
    return f"model {model_id!r} was retired on {lifecycle.retires}{lifecycle.instead()}"


@dataclass(frozen=True, slots=True)
class Ending:
    """A catalog model that is retired or retires soon, as of some day."""
    kind: str                  # chat | image | video
    model_id: str
    lifecycle: Lifecycle
    days_left: int             # 0 or less: retired

    @property
    def retired(self) -> bool:
        return self.days_left <= 0

    def describe(self) -> str:
        lc = self.lifecycle
        when = f"retired on {lc.retires}" if self.retired else \
            f"retires on {lc.retires} (in {self.days_left} day{'s' if self.days_left != 1 else ''})"
        return f"{self.kind} model {self.model_id} {when}{lc.instead()}"


def endings(cfg, today: date, days: int = WARN_DAYS) -> Iterator[Ending]:
    """Every chat and media model of `cfg` that is retired, or retires within `days`."""
    models = [("chat", m.id, m.lifecycle) for m in cfg.chat_models.values()]
    models += [(e.kind, e.id, Lifecycle.of(e)) for e in cfg.media_models.values()]
    for kind, model_id, lc in models:
        if lc.retired(today) or lc.retires_soon(today, days):
            yield Ending(kind, model_id, lc, (lc.retires - today).days)


def check_replacements(file: str, kind: str, index: int, entry, same_kind) -> list[str]:
    """A `replacement` must name another model of the same kind in the catalog."""
    target = entry.replacement
    if target is None:
        return []
    path = f"{file}: models.{kind}[{index}].replacement"
    if target == entry.id:
        return [f"{path}: a model cannot replace itself"]
    if target not in same_kind:
        from .problems import did_you_mean
        return [f"{path}: {target!r} is not a{'n' if kind == 'image' else ''} {kind} model in the catalog"
                f"{did_you_mean(target, same_kind, cutoff=0.8)}"]
    return []
