"""Money: the one unit and the one parser for USD amounts.

Every amount inside the gateway is an integer number of micro-USD (1 USD = 1,000,000
micro-USD; USDC's atomic unit too). Amounts arrive as decimal text or YAML/JSON numbers
(config prices, `credits grant`, a purchase body, x402 and media settings) and all go
through `parse_usd`: exact, never rounded; more precision than one micro-USD is refused.
"""
from __future__ import annotations

import math
from decimal import Decimal, InvalidOperation
from fractions import Fraction

MICRO = 1_000_000     # micro-USD per USD
MAX_USD = 10 ** 12    # far above any real amount: keeps 1e999999 from becoming a huge integer


def _decimal(value) -> Decimal:
    """Decimal text or a plain number (not true/false) -> Decimal, else ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str, Decimal)):
        raise ValueError("expected a decimal amount")
    try:
        amount = Decimal(str(value).strip())
    except InvalidOperation:
        raise ValueError("expected a decimal amount") from None
    if not amount.is_finite():
        raise ValueError("expected a decimal amount")
    return amount


def parse_usd(value, *, positive: bool = False, maximum: int | None = None) -> int:
    """An amount of USD ("0.05", 12.5, 3) -> integer micro-USD.

    Raises ValueError with a message fit for an operator or a client: not a decimal
    amount, negative (or zero when `positive`), finer than one micro-USD, above `maximum`
    (micro-USD)."""
    try:
        given = _decimal(value)
    except ValueError:
        raise ValueError(f"expected an amount in USD such as 0.05, got {value!r}") from None
    if given < 0 or positive and given == 0:
        raise ValueError(f"must be {'more than' if positive else 'at least'} 0 USD, got {value!r}")
    if given > MAX_USD:                  # before scaling: 1e999999 must not overflow
        raise ValueError(f"at most {MAX_USD:,} USD, got {value!r}")
    amount = given * MICRO
    if amount != amount.to_integral_value():
        raise ValueError(f"more precision than one micro-USD (at most 6 decimals), got {value!r}")
    micro = int(amount)
    if maximum is not None and micro > maximum:
        raise ValueError(f"at most {format_usd(maximum)} USD, got {value!r}")
    return micro


def parse_ratio(value) -> Fraction:
    """A decimal multiplier or rate ("1.5", 0.10) -> an exact Fraction."""
    try:
        return Fraction(_decimal(value))
    except ValueError:
        raise ValueError(f"expected a decimal number such as 1.5, got {value!r}") from None


def usd(micro: int) -> float:
    """micro-USD -> a USD number for JSON output (the only place money becomes a float)."""
    return micro / MICRO


def format_usd(micro: int) -> str:
    """micro-USD -> exact decimal text ('12.5', '0.000001', '1000000'), never in exponent form."""
    whole, frac = divmod(abs(micro), MICRO)
    text = f"{whole}.{frac:06d}".rstrip("0").rstrip(".")
    return f"-{text}" if micro < 0 else text


def discounted(micro: int, ratio: Fraction) -> int:
    """A price times a ratio (e.g. list price x pricing.discount), rounded half up to a micro-USD."""
    return math.floor(micro * ratio + Fraction(1, 2))
