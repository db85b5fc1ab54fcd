"""Query-string filters and paging shared by the admin and account listings: parsed once,
refused with a 400 that names the parameter, never a 500."""
from __future__ import annotations

import calendar
import datetime as dt

from plugins.errors import bad_request
from plugins.storage.records import Page, UsageFilter

MAX_PAGE = 500


def page(query, default: int = 50) -> Page:
    return Page(limit=_int(query, "limit", default, 1, MAX_PAGE), offset=_int(query, "offset", 0, 0, 10**9))


def usage_filter(query) -> UsageFilter:
    return UsageFilter(account_id=_opt_int(query, "account"), key_id=_opt_int(query, "key"),
                       model=query.get("model") or None, endpoint=query.get("endpoint") or None,
                       since=_time(query, "since"), until=_time(query, "until"))


def _int(query, name: str, default: int, low: int, high: int) -> int:
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise bad_request(f"{name} must be a whole number from {low} to {high}", param=name) from None
    if not low <= value <= high:
        raise bad_request(f"{name} must be a whole number from {low} to {high}", param=name)
    return value


def _opt_int(query, name: str) -> int | None:
    return _int(query, name, 0, 1, 2**62) if query.get(name) else None


def _time(query, name: str) -> int | None:
    """A date (2026-11-23, UTC midnight), an ISO time with a zone, or Unix seconds."""
    raw = query.get(name)
    if not raw:
        return None
    return parse_time(raw, name)


def parse_time(raw: str, name: str) -> int:
    if raw.isdigit():
        return int(raw)
    try:
        if len(raw) == 10:
            day = dt.date.fromisoformat(raw)
            return calendar.timegm(day.timetuple())
        moment = dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise bad_request(f"{name}: expected a date (2026-11-23), an ISO time or Unix seconds, got {raw!r}",
                          param=name) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    return int(moment.timestamp())

