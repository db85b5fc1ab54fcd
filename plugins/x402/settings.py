"""`payments.x402` and `credits` from the YAML: their schemas and what they become.

A chain without `pay_to`, or an asset without `address`, is left out (the shipped
catalog has placeholders the operator fills in); x402 is on when at least one chain
with one asset remains and a facilitator is set. Each chain type declares its own block
(`Chain.Settings`), so a key one type does not take is refused.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from pydantic import Field, model_validator

from config import MICRO, Config, ConfigError, parse_section
from config.schema import USD, Count, Ratio, Seconds, Section

from .chains import Asset, Chain

@dataclass
class X402Settings:
    facilitator_url: str = ""
    facilitator_timeout: float = 30.0
    facilitator_headers: dict[str, str] = field(default_factory=dict)
    max_timeout_seconds: int = 300
    upto_max_timeout_seconds: int = 900          # an upto authorization must outlive the slowest render
    upto_markup: Fraction = Fraction(1)          # keyless upto calls pay the keyed price times this
    chains: list[Chain] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)   # placeholders not filled in

    @property
    def enabled(self) -> bool:
        return bool(self.facilitator_url and self.chains)


@dataclass
class CreditSettings:
    min_micro: int = 3 * MICRO
    max_micro: int = 1000 * MICRO
    first_bonus: Fraction = Fraction(0)
    tiers: list[tuple[int, Fraction]] = field(default_factory=list)   # (min micro, bonus fraction)

    def bonus(self, amount: int, first: bool) -> int:
        """Bonus credits for a purchase, rounded down: the first purchase's bonus plus the
        best tier the amount reaches."""
        rate = (self.first_bonus if first else 0) + max((r for m, r in self.tiers if amount >= m), default=0)
        return int(amount * rate)


# ---- schemas ---------------------------------------------------------------------

class FacilitatorSection(Section):
    url: str = ""
    timeout_seconds: Seconds = 30
    headers: dict[str, str] = {}


class UptoSection(Section):
    max_timeout_seconds: int = Field(900, ge=60)   # an upto authorization must outlive the slowest render
    markup: Ratio = Fraction(1)                    # keyless upto calls pay the keyed price times this

    @model_validator(mode="after")
    def _markup(self):
        if self.markup < 1:
            raise ValueError("markup: at least 1 (keyless calls never pay less than keyed ones)")
        return self


class X402Section(Section):
    facilitator: FacilitatorSection = FacilitatorSection()
    max_timeout_seconds: Count = 300      # how long a signed payment stays valid
    upto: UptoSection = UptoSection()
    chains: list[dict[str, Any]] = []     # each checked against its type's Chain.Settings


class PaymentsSection(Section):
    """`payments:` in the YAML."""
    x402: X402Section = X402Section()


class TierSection(Section):
    min_usd: USD
    pct: Ratio


class BonusSection(Section):
    first_purchase_pct: Ratio = Fraction(0)
    tiers: list[TierSection] = []


class PurchaseSection(Section):
    min_usd: USD = 3 * MICRO
    max_usd: USD = 1000 * MICRO
    bonus: BonusSection = BonusSection()

    @model_validator(mode="after")
    def _limits(self):
        if self.max_usd > 1000 * MICRO:
            raise ValueError("max_usd: at most 1000 (the service's limit)")
        if not 0 < self.min_usd <= self.max_usd:
            raise ValueError("min_usd: must be more than 0 and at most max_usd")
        return self


class CreditsSection(Section):
    """`credits:` in the YAML."""
    purchase: PurchaseSection = PurchaseSection()


# ---- loading -----------------------------------------------------------------------

def load_x402(cfg: Config, chain_types: dict[str, type]) -> X402Settings:
    raw: X402Section = cfg.settings("payments").x402
    out = X402Settings(facilitator_url=raw.facilitator.url.rstrip("/"),
                       facilitator_timeout=raw.facilitator.timeout_seconds,
                       facilitator_headers=dict(raw.facilitator.headers), max_timeout_seconds=raw.max_timeout_seconds,
                       upto_max_timeout_seconds=raw.upto.max_timeout_seconds, upto_markup=raw.upto.markup)
    problems: list[str] = []
    for i, block in enumerate(raw.chains):
        path = f"payments.x402.chains[{i}]"
        cls = chain_types.get(block.get("type"))
        if cls is None:
            problems.append(f"{cfg.path}: {path}.type: no payment chain type {block.get('type')!r} "
                            f"(known: {', '.join(sorted(chain_types))})")
            continue
        try:
            chain = parse_section(cfg, cls.Settings, block, path)
        except ConfigError as err:
            problems += err.problems
            continue
        assets = []
        for j, a in enumerate(chain.assets):
            if not a.address:
                out.skipped.append(f"{path}.assets[{j}] ({a.symbol or '?'}): no address")
                continue
            assets.append(Asset(symbol=a.symbol, address=a.address, decimals=a.decimals,
                                usd_rate=a.usd_rate if a.usd_rate is not None else Fraction(1), discount=a.discount,
                                transfer=a.transfer, eip712={k: v for k, v in a.eip712.items() if k in ("name", "version")},
                                upto=a.upto))
        missing = [k for k in ("pay_to", *cls.required_settings) if not getattr(chain, k)]
        if missing:
            out.skipped.append(f"{path} ({chain.network}): no {', '.join(missing)}")
        elif assets:
            out.chains.append(cls(chain.network, chain.pay_to, assets, chain))
    if problems:
        raise ConfigError(problems)
    return out


def load_credits(cfg: Config) -> CreditSettings:
    raw: PurchaseSection = cfg.settings("credits").purchase
    return CreditSettings(min_micro=raw.min_usd, max_micro=raw.max_usd,
                          first_bonus=raw.bonus.first_purchase_pct / 100,
                          tiers=[(t.min_usd, t.pct / 100) for t in raw.bonus.tiers])
