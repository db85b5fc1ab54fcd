"""The admin API (`/api/v1/admin/...`) for operators, and the account's own summaries.

Admin credentials are separate from account keys: `GATEWAY_ADMIN_KEY` in the environment,
or keys made by `gateway admin-keys create` (stored hashed), sent as Bearer. An account
key on an admin route is a 403; with no admin credential configured at all, the admin API
does not exist (404). Every change is a ledger entry or a key row, never an edit of a
balance.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import time

from aiohttp import web

from config import parse_usd, usd
from plugins import hookimpl
from plugins.accounts import create_account, require_key
from plugins.allowance import left as allowance_left
from plugins.appstate import STORE
from plugins.auth import KEY_PREFIX, credential, key_changed
from plugins.errors import GatewayError, bad_request
from plugins.formats.base import json_response, read_json
from plugins.keypolicy import PERIODS
from plugins.listings import served_model_ids
from plugins.storage import KeyPolicy, reports

from . import render, writes
from .filters import page, parse_time, usage_filter

ADMIN = web.AppKey("admin_settings", dict)
ADMIN_PREFIX = "adm_"


# ---- who may use the admin API -------------------------------------------------------

@hookimpl
def gateway_configure(app, config):
    env = os.environ.get("GATEWAY_ADMIN_KEY", "")
    app[ADMIN] = {"env_hash": hashlib.sha256(env.encode()).hexdigest() if env else None}


@hookimpl
def gateway_register_migrations(register):
    register("0300_admin_keys", writes.ADMIN_SCHEMA)


async def require_admin(request: web.Request) -> None:
    settings, store = request.app[ADMIN], request.app[STORE]
    configured = settings["env_hash"] is not None or await writes.has_admin_keys(store)
    if not configured:
        raise GatewayError(404, f"no route {request.method} {request.path}: the admin API is off until "
                                "GATEWAY_ADMIN_KEY is set or `gateway admin-keys create` is run", code="not_found")
    key = credential(request)
    if key is None:
        raise GatewayError(401, "the admin API needs the admin key: Authorization: Bearer <admin key>",
                           code="missing_admin_key")
    if key.startswith(KEY_PREFIX):
        raise GatewayError(403, "account keys cannot use the admin API; send the operator's admin key",
                           code="admin_only")
    digest = hashlib.sha256(key.encode()).hexdigest()
    if settings["env_hash"] and hmac.compare_digest(digest, settings["env_hash"]):
        return
    if await writes.admin_key_valid(store, digest):
        return
    raise GatewayError(401, "invalid admin key", code="invalid_admin_key")


def admin(handler):
    async def guarded(request: web.Request) -> web.StreamResponse:
        await require_admin(request)
        return await handler(request)
    guarded.__name__ = handler.__name__
    return guarded


def _id(request: web.Request, name: str = "id") -> int:
    try:
        return int(request.match_info[name])
    except ValueError:
        raise bad_request(f"{name} must be a whole number", param=name) from None


async def _account_or_404(store, account_id: int):
    row = await reports.account(store, account_id)
    if row is None:
        raise GatewayError(404, f"no account {account_id}", code="account_not_found")
    return row


def _csv_wanted(request: web.Request) -> bool:
    return request.query.get("format") == "csv" or "text/csv" in request.headers.get("Accept", "")


# ---- accounts ----------------------------------------------------------------------------

@admin
async def list_accounts(request):
    p = page(request.query, 50)
    rows, total = await reports.accounts(request.app[STORE], request.query.get("q", "").strip(), p)
    return json_response({"object": "list", "data": [render.account(r) for r in rows], "total": total,
                          "limit": p.limit, "offset": p.offset})


@admin
async def create(request):
    body = await read_json(request)
    name = body.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > 80:
        raise bad_request("name: a non-empty string of at most 80 characters", param="name")
    credits = _usd(body.get("credits_usd", "0"), "credits_usd", allow_negative=False)
    account_id, key = await create_account(request.app[STORE], name.strip(), credits)
    row = await reports.account(request.app[STORE], account_id)
    return json_response({"account": render.account(row), "key": key,
                          "note": "the key is shown once; it is stored only as a hash"}, status=201)


@admin
async def show(request):
    store, account_id = request.app[STORE], _id(request)
    row = await _account_or_404(store, account_id)
    today, month = await reports.spend_today_and_month(store, account_id)
    return json_response({**render.account(row), "free_allowance_left_usd": usd(await allowance_left(request.app,
                                                                                                   account_id)),
                          "spend_today_usd": usd(today), "spend_month_usd": usd(month),
                          "keys": [render.key(k) for k in await reports.keys(store, account_id)],
                          "agents": [render.agent(a) for a in await reports.agents(store, account_id)]})


@admin
async def adjust(request):
    store, account_id = request.app[STORE], _id(request)
    await _account_or_404(store, account_id)
    body = await read_json(request)
    amount = _usd(body.get("usd"), "usd", allow_negative=True)
    reason = body.get("reason")
    if not isinstance(reason, str) or not reason.strip() or len(reason) > 200:
        raise bad_request("reason: say why, in at most 200 characters (it is kept in the ledger)", param="reason")
    if amount == 0:
        raise bad_request("usd: an adjustment of 0 changes nothing", param="usd")
    balance = await writes.adjust(store, account_id, amount, reason.strip())
    if balance is None:
        raise GatewayError(409, "the balance cannot go below zero; take back at most the balance",
                           code="balance_too_low")
    return json_response({"account_id": account_id, "adjusted_usd": usd(amount), "balance_usd": usd(balance)})


def _usd(value, param: str, *, allow_negative: bool) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise bad_request(f"{param}: an amount of USD, e.g. \"10\" or \"-2.5\"", param=param)
    text = str(value).strip()
    negative = allow_negative and text.startswith("-")
    try:
        micro = parse_usd(text[1:] if negative else text)
    except ValueError as err:
        raise bad_request(f"{param}: {err}", param=param) from None
    if micro > writes.MAX_ADJUST_MICRO:
        raise bad_request(f"{param}: at most {usd(writes.MAX_ADJUST_MICRO):,.0f} USD at once", param=param)
    return -micro if negative else micro


# ---- keys --------------------------------------------------------------------------------

@admin
async def list_keys(request):
    account = request.query.get("account")
    account_id = int(account) if account and account.isdigit() else None
    if account and account_id is None:
        raise bad_request("account must be a whole number", param="account")
    return json_response({"object": "list",
                          "data": [render.key(k) for k in await reports.keys(request.app[STORE], account_id)]})


@admin
async def create_key(request):
    store, account_id = request.app[STORE], _id(request)
    await _account_or_404(store, account_id)
    body = await read_json(request)
    name = body.get("name")
    if name is not None and (not isinstance(name, str) or len(name) > 60):
        raise bad_request("name: at most 60 characters", param="name")
    key_id, key = await writes.new_key(store, account_id, name, _policy(request, body))
    return json_response({"id": key_id, "account_id": account_id, "key": key, "prefix": key[:12],
                          "note": "the key is shown once; it is stored only as a hash"}, status=201)


def _policy(request: web.Request, body: dict) -> KeyPolicy | None:
    """The restrictions asked for in a key's body: expires_at, spend_limit {usd, period}, models."""
    expires = body.get("expires_at")
    if expires is not None:
        expires = parse_time(str(expires), "expires_at")
        if expires <= time.time():
            raise bad_request("expires_at: must be in the future", param="expires_at")
    limit_micro = period = None
    if body.get("spend_limit") is not None:
        limit = body["spend_limit"]
        if not isinstance(limit, dict) or limit.get("period", "day") not in PERIODS:
            raise bad_request("spend_limit: {\"usd\": \"5\", \"period\": \"day\" or \"month\"}", param="spend_limit")
        limit_micro, period = _usd(limit.get("usd"), "spend_limit.usd", allow_negative=False), limit.get("period", "day")
        if limit_micro == 0:
            raise bad_request("spend_limit.usd: more than 0 (revoke the key to stop it spending)", param="spend_limit.usd")
    models = body.get("models")
    if models is not None:
        known = served_model_ids(request.app)
        if not isinstance(models, list) or not models or not all(isinstance(m, str) for m in models):
            raise bad_request("models: a non-empty list of model ids", param="models")
        unknown = [m for m in models if m not in known]
        if unknown:
            raise bad_request(f"models: not served here: {', '.join(unknown)}", param="models")
        models = tuple(models)
    if expires is None and limit_micro is None and models is None:
        return None
    return KeyPolicy(expires, limit_micro, period, models)


@admin
async def revoke_key(request):
    store, key_id = request.app[STORE], _id(request)
    found = await reports.key(store, key_id)
    if found is None:
        raise GatewayError(404, f"no key {key_id}", code="key_not_found")
    await store.keys.revoke(key_id)
    await key_changed(request.app)            # every process drops what it cached
    return json_response({"id": key_id, "revoked_at": (await reports.key(store, key_id))["revoked_at"]})


# ---- usage and ledger ----------------------------------------------------------------------

async def _rows(request, read, shape, columns: tuple[str, ...], filename: str):
    """A filtered, paged listing as JSON, or as CSV when asked (`format=csv` or Accept)."""
    rows = await read(request.app[STORE], usage_filter(request.query), page(request.query, 100))
    items = [shape(r) for r in rows]
    if _csv_wanted(request):
        return render.to_csv(items, columns, filename)
    return json_response({"object": "list", "data": items})


@admin
async def list_usage(request):
    return await _rows(request, reports.usage, render.usage, render.USAGE_CSV, "usage.csv")


@admin
async def summarize(request):
    return json_response(render.summary(await reports.usage_summary(request.app[STORE], usage_filter(request.query))))


@admin
async def list_ledger(request):
    return await _rows(request, reports.ledger, render.entry, render.LEDGER_CSV, "ledger.csv")


# ---- the account's own summaries (account key) ------------------------------------------------

async def own_summary(request):
    p = await require_key(request)
    f = usage_filter(request.query)
    f.account_id = p.account_id
    return json_response(render.summary(await reports.usage_summary(request.app[STORE], f)))


async def own_agents(request):
    p = await require_key(request)
    return json_response({"object": "list",
                          "data": [render.agent(a) for a in await reports.agents(request.app[STORE], p.account_id)]})


@hookimpl
def gateway_register_routes(register, config):
    base = "/api/v1/admin"
    for method, path, handler in (
            ("GET", "/accounts", list_accounts), ("POST", "/accounts", create),
            ("GET", "/accounts/{id}", show), ("POST", "/accounts/{id}/credits", adjust),
            ("POST", "/accounts/{id}/keys", create_key), ("GET", "/keys", list_keys),
            ("POST", "/keys/{id}/revoke", revoke_key), ("GET", "/usage", list_usage),
            ("GET", "/usage/summary", summarize), ("GET", "/ledger", list_ledger)):
        register(method, base + path, handler)
    register("GET", "/api/v1/account/usage/summary", own_summary)
    register("GET", "/api/v1/account/agents", own_agents)
