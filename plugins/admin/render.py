"""Rows as the admin API shows them (JSON), and the same rows as CSV for export. Money is
micro-USD inside and a USD number only here, at the edge."""
from __future__ import annotations

import csv
import datetime as dt
import io
from typing import Any, Iterable

import orjson
from aiohttp import web

from config import usd


def account(row) -> dict[str, Any]:
    out = {"id": row["id"], "name": row["name"], "balance_usd": usd(row["balance_micro"]),
           "created_at": row["created_at"]}
    if "keys" in row.keys():
        out["keys"] = row["keys"]
    return out


def key(row) -> dict[str, Any]:
    return {"id": row["id"], "account_id": row["account_id"], "prefix": row["prefix"], "name": row["name"],
            "agent_id": row["agent_id"], "created_at": row["created_at"], "revoked_at": row["revoked_at"],
            "last_used_at": row["last_used_at"], "spend_usd": usd(int(row["spend_micro"])),
            "expires_at": row["expires_at"],
            "spend_limit": None if row["spend_limit_micro"] is None else {"usd": usd(row["spend_limit_micro"]),
                                                                          "period": row["spend_period"]},
            "models": orjson.loads(row["models"]) if row["models"] else None}


def agent(row) -> dict[str, Any]:
    return {"id": row["id"], "name": row["name"], "created_at": row["created_at"], "keys": row["keys"]}


def usage(row) -> dict[str, Any]:
    return {"id": row["id"], "call_id": row["call_id"], "account_id": row["account_id"], "key_id": row["key_id"],
            "agent_id": row["agent_id"], "endpoint": row["endpoint"], "requested_model": row["requested_model"],
            "model": row["model"], "input_tokens": row["input_tokens"], "output_tokens": row["output_tokens"],
            "usd": usd(row["usd_micro"]), "status": row["status"], "outcome": row["outcome"],
            "latency_ms": row["latency_ms"], "billing": orjson.loads(row["billing"]) if row["billing"] else None,
            "created_at": row["created_at"]}


def entry(row) -> dict[str, Any]:
    return {"id": row["id"], "account_id": row["account_id"], "usd": usd(row["amount_micro"]), "kind": row["kind"],
            "ref": row["ref"], "created_at": row["created_at"]}


def _day(ts: int) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).date().isoformat()


def summary(groups: dict[str, list]) -> dict[str, list[dict[str, Any]]]:
    return {"by_day": [{"day": _day(r["day"]), "calls": r["calls"], "usd": usd(int(r["usd_micro"]))} for r in groups["by_day"]],
            "by_model": [{"model": r["model"], "calls": r["calls"], "usd": usd(int(r["usd_micro"]))}
                         for r in groups["by_model"]],
            "by_endpoint": [{"endpoint": r["endpoint"], "calls": r["calls"], "usd": usd(int(r["usd_micro"]))}
                            for r in groups["by_endpoint"]]}


USAGE_CSV = ("id", "created_at", "call_id", "account_id", "key_id", "agent_id", "endpoint", "requested_model", "model",
             "input_tokens", "output_tokens", "usd", "status", "outcome", "latency_ms")
LEDGER_CSV = ("id", "created_at", "account_id", "kind", "usd", "ref")


def to_csv(items: Iterable[dict[str, Any]], columns: tuple[str, ...], filename: str) -> web.Response:
    """Money in CSV is written from micro-USD with six decimals, so a spreadsheet sums it
    exactly; never a float's noise."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(columns)
    for item in items:
        writer.writerow([f"{item[c]:.6f}" if c == "usd" else ("" if item[c] is None else item[c]) for c in columns])
    return web.Response(text=out.getvalue(), content_type="text/csv", charset="utf-8",
                        headers={"Content-Disposition": f'attachment; filename="{filename}"'})
