"""Media prices, exact: micro-USD integers times fractions, rounded up once.

Images: a unit price per image for the chosen quality and resolution; a keyed call holds
unit x n and is charged unit x images produced; x402 pays unit x n.
Videos: the list price for the settings (length against the default, resolution tier,
audio off) is what a keyed call holds and what x402 pays; a keyed call is charged the
service price for the same settings.
"""
from __future__ import annotations

from fractions import Fraction

from config import usd
from plugins.context import CallContext
from plugins.pricing import with_route_notes
from providers.media_types import ImageJob, VideoJob

from .catalog import MediaModel


def ceil(x: Fraction) -> int:
    return -(-x.numerator // x.denominator)


def image_unit(model: MediaModel, job: ImageJob, *, list_price: bool = False) -> int:
    base = model.list_micro if list_price else model.service_micro
    mult = Fraction(1)
    if model.quality:
        mult *= model.quality.multiplier(job.quality)
    if model.resolution:
        mult *= model.resolution.multiplier(job.resolution)
    return ceil(base * mult)


def video_price(model: MediaModel, job: VideoJob, *, list_price: bool = False) -> int:
    base = Fraction(model.list_micro if list_price else model.service_micro)
    seconds = Fraction(job.duration).limit_denominator(1000)
    amount = base * seconds if model.per == "second" else base * seconds / Fraction(model.duration.default)
    if model.resolution:
        amount *= model.resolution.multiplier(job.resolution)
    if job.audio is False and model.audio_off_multiplier is not None:
        amount *= model.audio_off_multiplier
    return ceil(amount)


class MediaPricer:
    def __init__(self, model: MediaModel, job: ImageJob | VideoJob):
        self.model, self.job = model, job
        if isinstance(job, ImageJob):
            self.unit = image_unit(model, job)
            self.hold = self.unit * job.n
            self.list_total = image_unit(model, job, list_price=True) * job.n
        else:
            self.unit = video_price(model, job)
            self.hold = self.list_total = video_price(model, job, list_price=True)

    @property
    def is_image(self) -> bool:
        return isinstance(self.job, ImageJob)

    def reserve(self, ctx: CallContext) -> tuple[int, int, int]:
        return self.hold, 0, 0

    def x402_price(self, ctx: CallContext) -> tuple[int, str]:
        what = f"{self.job.n} image(s)" if self.is_image else f"a {self.job.duration:g}s video"
        return self.hold, f"{what} from {self.model.id}"

    def shortfall(self, ctx: CallContext, amount: int) -> str:
        return f"this call's reserve ${usd(amount):.6f} ({self.x402_price(ctx)[1]})"

    def produced(self, ctx: CallContext) -> int:
        return len(ctx.media_files or [])

    def charge(self, ctx: CallContext) -> tuple[int, int]:
        cost = self.unit * self.produced(ctx) if self.is_image else (self.unit if self.produced(ctx) else 0)
        return min(cost, ctx.hold.amount_micro if ctx.hold else cost), cost

    def billing(self, ctx: CallContext, charged: int, usage: int, note: str) -> dict:
        block = {"model": self.model.id, "operation": self.job.operation,
                 ("images" if self.is_image else "jobs"): self.produced(ctx) if ctx.outcome == "ok" else 0,
                 "usd": usd(charged), "usage_usd": usd(usage), "quote_usd": usd(self.hold),
                 "list_usd": usd(self.list_total), "note": with_route_notes(ctx, note)}
        if ctx.route and ctx.route.is_alias:
            block["requested_model"] = ctx.route.requested_model
        return block

    def free_part(self, tier: dict) -> int:
        """The price a keyed call will be charged if the job fits the model's `free_tier`,
        else 0. A tier lists limits (operations, max_n, quality, resolution,
        max_duration_seconds); a limit it does not list is no limit."""
        job, model = self.job, self.model

        def chosen(option, value):
            return value or (option.default if option else None)
        checks = [job.operation in tier.get("operations", [job.operation]),
                  chosen(model.resolution, job.resolution) in tier.get("resolution",
                                                                       [chosen(model.resolution, job.resolution)])]
        if self.is_image:
            checks += [job.n <= int(tier.get("max_n", job.n)),
                       chosen(model.quality, job.quality) in tier.get("quality", [chosen(model.quality, job.quality)])]
        else:
            checks.append(job.duration <= float(tier.get("max_duration_seconds", job.duration)))
        if not all(checks):
            return 0
        return self.unit * job.n if self.is_image else self.unit
