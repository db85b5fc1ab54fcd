"""Typed settings: the base class every section's schema derives from, the value types
they share (USD amounts, exact ratios, positive counts), and the core sections.

A section schema is a pydantic model with `extra="forbid"` (an unknown key is an error,
with a "did you mean") and strict types (the text "5" is not a number). A plugin that
owns a section registers its schema through `gateway_register_settings`; a provider type
declares its block as `Settings` on the provider class. Cross-references (a model named
in another section) are checked by `references()` once every section has parsed.
"""
from __future__ import annotations

from datetime import date
from fractions import Fraction
from typing import Annotated, Any, ClassVar, Iterator, Literal

from pydantic import (
    BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, PlainValidator, model_validator,
)

from .lifecycle import parse_day
from .money import parse_ratio, parse_usd

# ---- value types ------------------------------------------------------------------

USD = Annotated[int, BeforeValidator(parse_usd)]            # an amount of USD -> integer micro-USD
Ratio = Annotated[Fraction, PlainValidator(parse_ratio),     # an exact multiplier or rate
                  PlainSerializer(float, when_used="json")]
Count = Annotated[int, Field(gt=0)]                          # a positive whole number
Seconds = Annotated[float, Field(gt=0)]
Reference = tuple[str, str]                                  # (key path inside the section, problem)


Day = Annotated[date, PlainValidator(parse_day), PlainSerializer(date.isoformat, when_used="json")]


class Known:
    """What a cross-reference may point at, once every section has parsed."""

    def __init__(self, providers: set[str], chat: set[str], media: dict[str, "MediaEntry"]):
        self.providers, self.chat, self.media = providers, chat, media

    def chat_model(self, path: str, model_id: str) -> Iterator[Reference]:
        if model_id not in self.chat:
            yield path, f"{model_id!r} is not a chat model under models.chat{_near(model_id, self.chat)}"

    def media_model(self, path: str, model_id: str, kind: str, operation: str) -> Iterator[Reference]:
        entry = self.media.get(model_id)
        if entry is None or entry.kind != kind:
            yield path, f"{model_id!r} is not a{'n' if kind == 'image' else ''} {kind} model under models.{kind}" \
                        f"{_near(model_id, [m for m, e in self.media.items() if e.kind == kind])}"
        elif operation not in entry.offered():
            yield path, f"{model_id!r} does not offer {operation} (it offers {', '.join(entry.offered())})"


def _near(word: str, choices) -> str:
    from .problems import did_you_mean
    return did_you_mean(word, choices, cutoff=0.8)      # model ids share prefixes: only close misspellings


class Section(BaseModel):
    """Base of every settings schema: unknown keys and loose types are errors."""
    model_config = ConfigDict(extra="forbid", strict=True, arbitrary_types_allowed=True)

    def references(self, known: Known) -> Iterator[Reference]:
        """Override to check names of models or providers; yield (path, problem)."""
        return iter(())


# ---- core sections ------------------------------------------------------------------

class ServerSettings(Section):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    public_url: str = ""                 # the base of links the gateway returns; default http://host:port
    cors_origins: list[str] = ["*"]      # browsers from these origins may call the API
    request_timeout_seconds: Seconds = 30.0   # a request body must arrive within this (408)
    keepalive_seconds: Seconds = 10.0         # idle connections, and request headers, within this
    max_connections: Count = 10_000           # one more is refused with a 503

    def model_post_init(self, _context) -> None:
        self._derived = not self.public_url
        self.public_url = (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")

    def listen(self, host: str | None, port: int | None) -> None:
        """`gateway run --host/--port`: listen there; links follow unless public_url was set."""
        self.host, self.port = host or self.host, self.port if port is None else port
        if self._derived:
            self.public_url = f"http://{self.host}:{self.port}"


class PricingSettings(Section):
    discount: Ratio = Fraction(1, 2)     # service price = list price x discount

    @model_validator(mode="after")
    def _range(self):
        if not 0 < self.discount <= 1:
            raise ValueError(f"discount: expected a number in (0, 1], got {float(self.discount):g}")
        return self


class LifecycleFields(Section):
    """When a catalog model ends, on chat and media entries alike (config/lifecycle.py):
    from `retires` on, calls are refused naming `replacement`, which must be a model of
    the same kind in the catalog (checked once the whole catalog has loaded)."""
    deprecated: Day | None = None          # when the provider announced the end
    retires: Day | None = None             # the first day the provider no longer serves it
    replacement: str | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _order(self):
        if self.deprecated and self.retires and self.retires < self.deprecated:
            raise ValueError(f"retires: {self.retires} is before deprecated ({self.deprecated})")
        return self


class ChatModelEntry(LifecycleFields):
    id: str = Field(min_length=1)
    provider: str
    label: str | None = None
    upstream: str | None = None
    pricing: Literal["per_token", "per_request"] = "per_token"
    list_input_usd_per_mtok: USD | None = None
    list_output_usd_per_mtok: USD | None = None
    input_usd_per_mtok: USD | None = None      # the service price, when not list x discount
    output_usd_per_mtok: USD | None = None
    usd_per_request: USD | None = None
    tools: bool = False
    vision: bool = False
    context_length: Count | None = None        # tokens the model reads at most (listed)
    max_output_tokens: Count | None = None     # tokens it writes at most (listed)
    note: str | None = None

    @model_validator(mode="after")
    def _prices(self):
        need = ("list_input_usd_per_mtok", "list_output_usd_per_mtok") if self.pricing == "per_token" \
            else ("usd_per_request",)
        missing = [k for k in need if getattr(self, k) is None]
        if missing:
            raise ValueError(f"{missing[0]}: required")
        return self


class Tiered(Section):
    """An option with named values: which one applies by default and what each costs."""
    values: list[str] = Field(min_length=1)
    default: str
    price_multiplier: dict[str, Ratio] = {}

    @model_validator(mode="after")
    def _offered(self):
        if self.default not in self.values:
            raise ValueError(f"default: {self.default!r} is not one of values ({', '.join(self.values)})")
        for value, mult in self.price_multiplier.items():
            if value not in self.values:
                raise ValueError(f"price_multiplier.{value}: {value!r} is not offered "
                                 f"(values: {', '.join(self.values)})")
            if mult <= 0:
                raise ValueError(f"price_multiplier.{value}: must be more than 0")
        return self


class DurationOption(Section):
    min: float | None = Field(None, ge=0)
    max: float | None = Field(None, gt=0)
    step: float | None = Field(None, gt=0)
    values: list[float] = []
    default: float | None = None


class AudioOption(Section):
    default: bool = True
    audio_off_price_multiplier: Ratio | None = None


class VideoReferenceOption(Section):
    max_seconds: Seconds


class FreeTier(Section):
    """Limits within which a keyed call uses the daily allowance; an unlisted limit is no limit."""
    operations: list[str] | None = None
    max_n: Count | None = None
    quality: list[str] | None = None
    resolution: list[str] | None = None
    max_duration_seconds: Seconds | None = None


class MediaOptions(Section):
    aspect_ratio: list[str] = []
    quality: Tiered | None = None
    resolution: Tiered | None = None
    duration_seconds: DurationOption | None = None
    audio: AudioOption | None = None
    video_reference: VideoReferenceOption | None = None


IMAGE_OPERATIONS = ("generate", "edit")
VIDEO_OPERATIONS = ("text_to_video", "image_to_video", "reference_to_video")


def _upstream(value: Any) -> Any:
    if value is None or isinstance(value, str) or \
            isinstance(value, dict) and value and all(isinstance(k, str) and isinstance(v, str)
                                                      for k, v in value.items()):
        return value
    raise ValueError(f"expected a model id or a map operation -> model id, got {value!r}")


class MediaEntry(LifecycleFields):
    kind: ClassVar[str] = ""
    id: str = Field(min_length=1)
    provider: str
    label: str | None = None
    upstream: Annotated[Any, PlainValidator(_upstream)] = None
    operations: list[str] | None = None
    max_references: int | None = Field(None, ge=0)
    options: MediaOptions = MediaOptions()
    upstream_input: dict[str, Any] = {}
    upstream_fields: dict[str, str | None] = {}
    upstream_values: dict[str, dict[str, Any]] = {}
    free_tier: FreeTier | None = None
    timeout_seconds: Seconds | None = None
    note: str | None = None

    def offered(self) -> list[str]:
        """The operations this model serves: the keys of an upstream map, or `operations`."""
        if isinstance(self.upstream, dict):
            return list(self.upstream)
        return list(self.operations or [IMAGE_OPERATIONS[0] if self.kind == "image" else VIDEO_OPERATIONS[0]])

    @model_validator(mode="after")
    def _known_operations(self):
        allowed = IMAGE_OPERATIONS if self.kind == "image" else VIDEO_OPERATIONS
        bad = [op for op in self.offered() if op not in allowed]
        if bad:
            raise ValueError(f"upstream: unknown operation {bad[0]!r} (known: {', '.join(allowed)})")
        return self


class ImageModelEntry(MediaEntry):
    kind: ClassVar[str] = "image"
    list_usd_per_image: USD
    usd_per_image: USD | None = None


class VideoModelEntry(MediaEntry):
    kind: ClassVar[str] = "video"
    list_usd_per_second: USD | None = None
    list_usd_per_video: USD | None = None
    usd_per_second: USD | None = None
    usd_per_video: USD | None = None

    @model_validator(mode="after")
    def _video(self):
        if (self.list_usd_per_second is None) == (self.list_usd_per_video is None):
            raise ValueError("give exactly one of list_usd_per_second, list_usd_per_video")
        if "reference_to_video" in self.offered() and (self.max_references or 0) < 2:
            raise ValueError("max_references: reference_to_video needs room for at least two references "
                             f"(got {self.max_references or 0})")
        return self
