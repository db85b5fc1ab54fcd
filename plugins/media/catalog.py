"""The media catalog: `models.image` and `models.video` (typed in config/schema.py, prices
already integer micro-USD, multipliers exact fractions) as the models the endpoints use."""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from config import Config, ConfigError, discounted
from config.lifecycle import Lifecycle
from config.schema import DurationOption, MediaEntry, Tiered as TieredSettings
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
    lifecycle: Lifecycle = Lifecycle()

    @property
    def operations(self) -> list[str]:
        return list(self.upstream)


def load_media(cfg: Config) -> dict[str, MediaModel]:
    """The typed `models.image` / `models.video` entries -> the catalog the endpoints use."""
    problems: list[str] = []
    out: dict[str, MediaModel] = {}
    index = {"image": 0, "video": 0}
    for entry in cfg.media_models.values():
        path = f"models.{entry.kind}[{index[entry.kind]}]"
        index[entry.kind] += 1
        model = _model(entry, path, cfg, problems)
        if model is not None:
            out[model.id] = model
    if problems:
        raise ConfigError([f"{cfg.path}: {p}" for p in problems])
    return out


def _tiered(raw: TieredSettings | None) -> Tiered | None:
    if raw is None:
        return None
    return Tiered(list(raw.values), raw.default, dict(raw.price_multiplier))


def _duration(raw: DurationOption | None, path: str, problems: list[str]) -> Duration | None:
    if raw is None:
        return None
    d = Duration(minimum=raw.min, maximum=raw.max, step=raw.step, values=list(raw.values))
    d.default = raw.default if raw.default is not None else (d.values[0] if d.values else d.minimum or 5)
    if not d.values and (d.minimum is None or d.maximum is None):
        problems.append(f"{path}: give min and max, or values")
    elif not d.allows(d.default):
        problems.append(f"{path}.default: {d.default:g} is not an allowed duration")
    return d


def _model(entry: MediaEntry, path: str, cfg: Config, problems: list[str]) -> MediaModel | None:
    before = len(problems)
    kind, operations = entry.kind, entry.offered()
    upstream = dict(entry.upstream) if isinstance(entry.upstream, dict) else \
        {op: entry.upstream or entry.id.split("/", 1)[-1] for op in operations}
    per = "image" if kind == "image" else "second" if entry.list_usd_per_second is not None else "video"
    list_micro = getattr(entry, f"list_usd_per_{per}")
    service = getattr(entry, f"usd_per_{per}")
    options = entry.options
    audio = options.audio
    model = MediaModel(
        id=entry.id, label=entry.label or entry.id, provider=entry.provider, kind=kind, upstream=upstream,
        max_references=entry.max_references if entry.max_references is not None else int("edit" in upstream),
        list_micro=list_micro, per=per,
        service_micro=service if service is not None else discounted(list_micro, cfg.discount),
        aspect_ratios=list(options.aspect_ratio),
        quality=_tiered(options.quality), resolution=_tiered(options.resolution),
        duration=_duration(options.duration_seconds, f"{path}.options.duration_seconds", problems),
        audio_default=audio.default if audio else None,
        audio_off_multiplier=audio.audio_off_price_multiplier if audio else None,
        reference_max_seconds=options.video_reference.max_seconds if options.video_reference else None,
        timeout_seconds=entry.timeout_seconds or (300 if kind == "video" else 600),
        upstream_input=dict(entry.upstream_input), upstream_fields=dict(entry.upstream_fields),
        upstream_values={k: dict(v) for k, v in entry.upstream_values.items()},
        free_tier=entry.free_tier.model_dump(exclude_none=True) if entry.free_tier else None,
        options_listing=options.model_dump(exclude_unset=True, mode="json"),
        note=entry.note, lifecycle=Lifecycle.of(entry))
    if kind == "video" and model.duration is None:
        model.duration = Duration(values=[5.0], default=5.0)
    if model.resolution:
        unknown = [r for r in model.resolution.values if r not in RESOLUTIONS]
        if unknown:
            problems.append(f"{path}.options.resolution: unknown values {unknown} (known: {', '.join(RESOLUTIONS)})")
    return model if len(problems) == before else None
