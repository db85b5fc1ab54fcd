"""Keeping the catalog current: `gateway run`'s start-up warnings for models that retire
soon or have retired, and `gateway catalog check`, which says the same offline, compares
list prices with the `genai-prices` package's data when it is installed, and exits 1
while a retired model is still served (so a scheduled job notices).

The refusal of calls to retired models is not here: the pipeline does it where it
resolves the model (plugins/pipeline.py), with the same dates (config/lifecycle.py).
"""
from __future__ import annotations

import argparse
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Iterator

import structlog

import config as config_mod
from config.lifecycle import WARN_DAYS, endings, parse_day

from . import hookimpl
from .appstate import CONFIG, utc_today

log = structlog.get_logger("catalog")


@hookimpl
def gateway_startup(app):
    """At start: one warning per model that has retired or retires within WARN_DAYS."""
    for end in endings(app[CONFIG], utc_today(app)):
        log.warning("model_retired" if end.retired else "model_retires_soon", model=end.model_id, kind=end.kind,
                    retires=str(end.lifecycle.retires), replacement=end.lifecycle.replacement,
                    days_left=max(end.days_left, 0))


# ---- gateway catalog check ----------------------------------------------------------

def _day(text: str) -> date:
    try:
        return parse_day(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@hookimpl
def gateway_register_commands(subparsers):
    catalog = subparsers.add_parser("catalog", help="keep the model catalog current")
    sub = catalog.add_subparsers(dest="catalog_command", required=True)
    check = sub.add_parser("check", help="offline: list retired and retiring models and list-price differences; "
                                         "exit 1 while a retired model is still served")
    check.add_argument("--config", help="YAML config (default: the embedded demo with the shipped catalog)")
    check.add_argument("--date", type=_day, help="check as of this UTC day, YYYY-MM-DD (default: today)")
    check.set_defaults(func=cmd_catalog_check)


def cmd_catalog_check(args) -> int:
    cfg = config_mod.load(args.config)
    today = args.date or datetime.now(timezone.utc).date()
    kinds = [m.kind for m in cfg.media_models.values()]
    print(f"{cfg.path}: {len(cfg.chat_models)} chat, {kinds.count('image')} image, {kinds.count('video')} video "
          f"models, as of {today}")
    ends = list(endings(cfg, today))
    retired = [e for e in ends if e.retired]
    for end in retired + [e for e in ends if not e.retired]:
        print(f"{'RETIRED' if end.retired else 'retires soon'}: {end.describe()}")
    if not ends:
        print(f"none retired or retiring within {WARN_DAYS} days")
    for line in price_differences(cfg, today):
        print(line)
    if retired:
        print(f"{len(retired)} retired model(s) still served: remove them from the catalog, or point callers "
              "at their replacement")
    return 1 if retired else 0


def price_differences(cfg, today: date) -> Iterator[str]:
    """Lines for every chat model whose list price differs from genai-prices' data for the
    same provider URL and upstream id, as of `today`; a line saying why when it cannot."""
    try:
        import genai_prices
    except ImportError:
        yield "list prices not compared: install the optional genai-prices package (pip install 'gateway[catalog]')"
        return
    when = datetime(today.year, today.month, today.day, tzinfo=timezone.utc)
    unknown = compared = 0
    for m in cfg.chat_models.values():
        if m.pricing != "per_token":
            continue
        base_url = cfg.providers[m.provider].settings.get("base_url")
        theirs = _their_price(genai_prices, m.upstream, base_url, when) if base_url else None
        if theirs is None:
            unknown += 1
            continue
        compared += 1
        ours = (Decimal(m.list_input_micro) / 1_000_000, Decimal(m.list_output_micro) / 1_000_000)
        if theirs != ours:
            yield (f"price differs: chat model {m.id} ({m.upstream}): list {_pair(ours)}, "
                   f"genai-prices {genai_prices.__version__} {_pair(theirs)} USD per million tokens in/out")
    yield f"list prices compared with genai-prices {genai_prices.__version__}: {compared} chat models " \
          f"({unknown} not in its data)"


def _their_price(genai_prices, upstream: str, base_url: str, when: datetime) -> tuple[Decimal, Decimal] | None:
    """genai-prices' (input, output) USD per million tokens for this upstream id at this
    provider URL, or None when its data does not have it."""
    try:        # priced on 1,000 tokens each, so that no long-prompt tier applies
        price = genai_prices.calc_price(genai_prices.Usage(input_tokens=1000, output_tokens=1000), upstream,
                                        provider_api_url=base_url, genai_request_timestamp=when)
    except (LookupError, ValueError):
        return None
    return (price.input_price * 1000).normalize(), (price.output_price * 1000).normalize()


def _pair(prices: tuple[Decimal, Decimal]) -> str:
    return "/".join(f"{p:.2f}" if p == p.quantize(Decimal("0.01")) else f"{p.normalize():f}" for p in prices)
