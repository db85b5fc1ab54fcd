"""The media catalog: `models.image` and `models.video` from the YAML, validated with key
paths, prices as integers (micro-USD) and multipliers as exact fractions."""
from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation, ROUND_HALF_UP
from fractions import Fraction
from typing import Any

from config import Config, ConfigError

MICRO = 1_000_000
IMAGE_OPERATIONS = ("generate", "edit")
VIDEO_OPERATIONS = ("text_to_video", "image_to_video", "reference_to_video")
RESOLUTIONS = ("480p", "720p", "768p", "1080p", "1440p", "2160p", "2K", "4K", "1K")


@dataclass(slots=True)
class Tiered:
    """An option with named values, a default, and price multipliers away from it."""
    values: list[str]
    default: str | None
    multipliers: dict[str, Fraction]

    def multiplier(self, value: str | None) -> Fraction:
        return self.multipliers.get(value or self.default or "", Fraction(1))


@dataclass(slots=True)
class Duration:
    minimum: float | None = None
    maximum: float | None = None
    step: float | None = None
    values: list[float] = field(default_factory=list)
    default: float = 5

    def allows(self, seconds: float) -> bool:
        if self.values:
            return seconds in self.values
        if self.minimum is not None and seconds < self.minimum or self.maximum is not None and seconds > self.maximum:
            return False
        if self.step:
            start = self.minimum or 0
            return abs((seconds - start) / self.step - round((seconds - start) / self.step)) < 1e-9
        return True

    def describe(self) -> str:
        if self.values:
            return "one of " + ", ".join(f"{v:g}" for v in self.values)
        step = f" in steps of {self.step:g}" if self.step else ""
        return f"{self.minimum:g} to {self.maximum:g} seconds{step}"


@dataclass(slots=True)
class MediaModel:
    id: str
    label: str
    provider: str
    kind: str                              # image | video
    upstream: dict[str, str]               # operation -> upstream model id
    max_references: int
    list_micro: int                        # per image, per second, or per video at the default duration
    service_micro: int
    per: str                               # image | second | video
    aspect_ratios: list[str] = field(default_factory=list)
    quality: Tiered | None = None
    resolution: Tiered | None = None
    duration: Duration | None = None
    audio_default: bool | None = None      # None: the model renders no sound
    audio_off_multiplier: Fraction | None = None
    reference_max_seconds: float | None = None
    timeout_seconds: float = 300
    upstream_input: dict[str, Any] = field(default_factory=dict)   # fixed extra input fields
    upstream_fields: dict[str, str | None] = field(default_factory=dict)  # canonical name -> model's (None: drop)
    upstream_values: dict[str, dict[str, Any]] = field(default_factory=dict)  # canonical value -> model's
    free_tier: dict[str, Any] | None = None
    options_listing: dict[str, Any] = field(default_factory=dict)
    note: str | None = None

    @property
    def operations(self) -> list[str]:
        return list(self.upstream)


def load_media(cfg: Config) -> dict[str, MediaModel]:
    models = cfg.section("models")
    problems: list[str] = []
    out: dict[str, MediaModel] = {}
    for kind in ("image", "video"):
        entries = models.get(kind) or []
        if not isinstance(entries, list):
            problems.append(f"models.{kind}: expected a list of models")
            continue
        for i, entry in enumerate(entries):
            model = _model(entry, kind, f"models.{kind}[{i}]", cfg, problems)
            if model is None:
                continue
            if model.id in out or model.id in cfg.chat_models:
                problems.append(f"models.{kind}[{i}].id: duplicate model id {model.id!r}")
            out[model.id] = model
    if problems:
        raise ConfigError([f"{cfg.path}: {p}" for p in problems])
    return out


def _money(value, path: str, problems: list[str]) -> int | None:
    try:
        amount = Decimal(str(value)) * MICRO
    except InvalidOperation:
        problems.append(f"{path}: expected a number, got {value!r}")
        return None
    if amount < 0 or isinstance(value, bool):
        problems.append(f"{path}: expected a price >= 0, got {value!r}")
        return None
    return int(amount.to_integral_value(ROUND_HALF_UP))


def _fraction(value, path: str, problems: list[str]) -> Fraction:
    try:
        f = Fraction(Decimal(str(value)))
    except (InvalidOperation, ValueError):
        problems.append(f"{path}: expected a number, got {value!r}")
        return Fraction(1)
    if f <= 0:
        problems.append(f"{path}: must be > 0")
    return f


def _tiered(raw, path: str, problems: list[str]) -> Tiered | None:
    if raw is None:
        return None
    if isinstance(raw, list):
        raw = {"values": raw}
    if not isinstance(raw, dict) or not isinstance(raw.get("values"), list) or not raw["values"]:
        problems.append(f"{path}: expected {{values: [...], default, price_multiplier: {{...}}}}")
        return None
    values = [str(v) for v in raw["values"]]
    default = str(raw["default"]) if raw.get("default") is not None else values[0]
    if default not in values:
        problems.append(f"{path}.default: {default!r} is not one of values")
    mults = {str(k): _fraction(v, f"{path}.price_multiplier.{k}", problems)
             for k, v in (raw.get("price_multiplier") or {}).items()}
    unknown = set(mults) - set(values)
    if unknown:
        problems.append(f"{path}.price_multiplier: {sorted(unknown)} not in values")
    return Tiered(values, default, mults)


def _duration(raw, path: str, problems: list[str]) -> Duration | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        problems.append(f"{path}: expected {{min, max, step, default}} or {{values, default}}")
        return None
    try:
        d = Duration(minimum=float(raw["min"]) if "min" in raw else None,
                     maximum=float(raw["max"]) if "max" in raw else None,
                     step=float(raw["step"]) if raw.get("step") else None,
                     values=[float(v) for v in raw.get("values") or []])
        d.default = float(raw.get("default", d.values[0] if d.values else d.minimum or 5))
    except (TypeError, ValueError):
        problems.append(f"{path}: durations must be numbers of seconds")
        return None
    if not d.values and (d.minimum is None or d.maximum is None):
        problems.append(f"{path}: give min and max, or values")
    elif not d.allows(d.default):
        problems.append(f"{path}.default: {d.default:g} is not an allowed duration")
    return d


def _model(entry, kind: str, path: str, cfg: Config, problems: list[str]) -> MediaModel | None:
    if not isinstance(entry, dict):
        problems.append(f"{path}: expected a mapping")
        return None
    before = len(problems)
    mid, provider = entry.get("id"), entry.get("provider")
    if not isinstance(mid, str) or not mid:
        problems.append(f"{path}.id: required")
    if provider not in cfg.providers:
        problems.append(f"{path}.provider: no provider named {provider!r} under providers")
    ops = IMAGE_OPERATIONS if kind == "image" else VIDEO_OPERATIONS
    upstream = entry.get("upstream")
    if isinstance(upstream, str) or upstream is None:
        operations = entry.get("operations") or ["generate" if kind == "image" else "text_to_video"]
        upstream = {op: upstream or str(mid).split("/", 1)[-1] for op in operations}
    if not isinstance(upstream, dict) or not upstream:
        problems.append(f"{path}.upstream: expected a model id or a map per operation")
        return None
    bad = [op for op in upstream if op not in ops]
    if bad:
        problems.append(f"{path}.upstream: unknown operations {bad} (known: {', '.join(ops)})")
    price_keys = ("list_usd_per_image",) if kind == "image" else ("list_usd_per_second", "list_usd_per_video")
    given = [k for k in price_keys if k in entry]
    if len(given) != 1:
        problems.append(f"{path}: give exactly one of {', '.join(price_keys)}")
        return None
    per = given[0].rsplit("_", 1)[-1]
    list_micro = _money(entry[given[0]], f"{path}.{given[0]}", problems)
    own_key = given[0].replace("list_", "")
    service = _money(entry[own_key], f"{path}.{own_key}", problems) if own_key in entry else None
    options = entry.get("options") or {}
    if not isinstance(options, dict):
        problems.append(f"{path}.options: expected a mapping")
        options = {}
    audio = options.get("audio")
    model = MediaModel(
        id=str(mid), label=str(entry.get("label") or mid), provider=str(provider), kind=kind,
        upstream={str(k): str(v) for k, v in upstream.items()},
        max_references=int(entry.get("max_references", 1 if "edit" in upstream else 0)),
        list_micro=list_micro or 0, per=per,
        service_micro=service if service is not None else
        int((Decimal(list_micro or 0) * cfg.discount).to_integral_value(ROUND_HALF_UP)),
        aspect_ratios=[str(a) for a in options.get("aspect_ratio") or []],
        quality=_tiered(options.get("quality"), f"{path}.options.quality", problems),
        resolution=_tiered(options.get("resolution"), f"{path}.options.resolution", problems),
        duration=_duration(options.get("duration_seconds"), f"{path}.options.duration_seconds", problems),
        audio_default=bool(audio.get("default", True)) if isinstance(audio, dict) else None,
        audio_off_multiplier=_fraction(audio["audio_off_price_multiplier"],
                                       f"{path}.options.audio.audio_off_price_multiplier", problems)
        if isinstance(audio, dict) and "audio_off_price_multiplier" in audio else None,
        reference_max_seconds=float((options.get("video_reference") or {}).get("max_seconds", 0)) or None,
        timeout_seconds=float(entry.get("timeout_seconds", 300 if kind == "video" else 600)),
        upstream_input=dict(entry.get("upstream_input") or {}),
        upstream_fields={str(k): (None if v is None else str(v)) for k, v in (entry.get("upstream_fields") or {}).items()},
        upstream_values={str(k): {str(a): b for a, b in (v or {}).items()}
                         for k, v in (entry.get("upstream_values") or {}).items()},
        free_tier=entry.get("free_tier"),
        options_listing=options, note=entry.get("note"))
    if kind == "video" and model.duration is None:
        model.duration = Duration(values=[5.0], default=5.0)
    if model.resolution:
        unknown = [r for r in model.resolution.values if r not in RESOLUTIONS]
        if unknown:
            problems.append(f"{path}.options.resolution: unknown values {unknown} (known: {', '.join(RESOLUTIONS)})")
    return model if len(problems) == before else None
