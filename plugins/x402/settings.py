"""`payments.x402` and `credits` from the YAML, validated with key paths.

A chain without `pay_to`, or an asset without `address`, is left out (the shipped
catalog has placeholders the operator fills in); x402 is on when at least one chain
with one asset remains and a facilitator is set.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

from config import Config, ConfigError

from .chains import Asset, Chain

MICRO = 1_000_000


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


def _fraction(value, path: str, problems: list[str], *, default: str) -> Fraction:
    try:
        return Fraction(Decimal(str(value if value is not None else default)))
    except (InvalidOperation, ValueError):
        problems.append(f"{path}: expected a number, got {value!r}")
        return Fraction(default)


def load_x402(cfg: Config, chain_types: dict[str, type]) -> X402Settings:
    raw = cfg.section("payments").get("x402") or {}
    problems: list[str] = []
    out = X402Settings()
    if not isinstance(raw, dict):
        raise ConfigError([f"{cfg.path}: payments.x402: expected a mapping"])
    fac = raw.get("facilitator") or {}
    out.facilitator_url = str(fac.get("url") or "").rstrip("/")
    out.facilitator_timeout = float(fac.get("timeout_seconds", 30))
    out.facilitator_headers = {str(k): str(v) for k, v in (fac.get("headers") or {}).items()}
    out.max_timeout_seconds = int(raw.get("max_timeout_seconds", 300))
    up = raw.get("upto") or {}
    if not isinstance(up, dict):
        problems.append("payments.x402.upto: expected a mapping (max_timeout_seconds, markup)")
        up = {}
    out.upto_max_timeout_seconds = int(up.get("max_timeout_seconds", 900))
    if out.upto_max_timeout_seconds < 60:
        problems.append("payments.x402.upto.max_timeout_seconds: at least 60, to settle after the work")
    out.upto_markup = _fraction(up.get("markup"), "payments.x402.upto.markup", problems, default="1")
    if out.upto_markup < 1:
        problems.append("payments.x402.upto.markup: at least 1 (keyless calls never pay less than keyed ones)")
    for i, chain in enumerate(raw.get("chains") or []):
        path = f"payments.x402.chains[{i}]"
        if not isinstance(chain, dict):
            problems.append(f"{path}: expected a mapping")
            continue
        cls = chain_types.get(chain.get("type"))
        if cls is None:
            problems.append(f"{path}.type: no payment chain type {chain.get('type')!r} "
                            f"(known: {', '.join(sorted(chain_types))})")
            continue
        network = str(chain.get("network") or "")
        if ":" not in network:
            problems.append(f"{path}.network: expected a CAIP-2 id such as eip155:8453, got {network!r}")
            continue
        parsed = [_asset(a, f"{path}.assets[{j}]", problems, out.skipped)
                  for j, a in enumerate(chain.get("assets") or [])]
        assets = [a for a in parsed if a is not None]
        missing = [k for k in ("pay_to", *cls.required_settings) if not chain.get(k)]
        if missing:
            out.skipped.append(f"{path} ({network}): no {', '.join(missing)}")
        elif assets:
            out.chains.append(cls(network, str(chain["pay_to"]), assets, chain))
    if problems:
        raise ConfigError([f"{cfg.path}: {p}" for p in problems])
    return out


def _asset(raw: Any, path: str, problems: list[str], skipped: list[str]) -> Asset | None:
    if not isinstance(raw, dict):
        problems.append(f"{path}: expected a mapping")
        return None
    if not raw.get("address"):
        skipped.append(f"{path} ({raw.get('symbol', '?')}): no address")
        return None
    decimals = raw.get("decimals")
    if isinstance(decimals, bool) or not isinstance(decimals, int) or not 0 <= decimals <= 36:
        problems.append(f"{path}.decimals: expected a whole number 0-36, got {decimals!r}")
        return None
    rate = _fraction(raw.get("usd_rate"), f"{path}.usd_rate", problems, default="1")
    discount = _fraction(raw.get("discount"), f"{path}.discount", problems, default="0")
    if rate <= 0 or not 0 <= discount < 1:
        problems.append(f"{path}: usd_rate must be > 0 and discount in [0, 1)")
        return None
    eip712 = raw.get("eip712") or {}
    return Asset(symbol=str(raw.get("symbol", "")), address=str(raw["address"]), decimals=decimals,
                 usd_rate=rate, discount=discount, transfer=str(raw.get("transfer", "eip3009")),
                 eip712={k: str(v) for k, v in eip712.items() if k in ("name", "version")},
                 upto=bool(raw.get("upto", True)))


def load_credits(cfg: Config) -> CreditSettings:
    raw = (cfg.section("credits").get("purchase") or {})
    problems: list[str] = []
    out = CreditSettings()
    out.min_micro = int(_fraction(raw.get("min_usd"), "credits.purchase.min_usd", problems, default="3") * MICRO)
    out.max_micro = int(_fraction(raw.get("max_usd"), "credits.purchase.max_usd", problems, default="1000") * MICRO)
    bonus = raw.get("bonus") or {}
    out.first_bonus = _fraction(bonus.get("first_purchase_pct"), "credits.purchase.bonus.first_purchase_pct",
                                problems, default="0") / 100
    for i, tier in enumerate(bonus.get("tiers") or []):
        p = f"credits.purchase.bonus.tiers[{i}]"
        floor = _fraction(tier.get("min_usd"), f"{p}.min_usd", problems, default="0")
        out.tiers.append((int(floor * MICRO), _fraction(tier.get("pct"), f"{p}.pct", problems, default="0") / 100))
    if out.max_micro > 1000 * MICRO:
        problems.append("credits.purchase.max_usd: at most 1000 (the service's limit)")
    if problems:
        raise ConfigError([f"{cfg.path}: {p}" for p in problems])
    return out
