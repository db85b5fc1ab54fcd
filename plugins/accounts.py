"""Accounts and keys: `GET /api/v1/account`, `GET /api/v1/account/usage`, and the CLI
commands `gateway keys create` and `gateway credits grant`."""
from __future__ import annotations

import asyncio
import sys

import orjson

from config import MICRO, format_usd, parse_usd, usd  # noqa: F401 - parse_usd: the one USD parser, for the CLI

from . import acall_all, hookimpl
from .appstate import PM, STORE
from .auth import authenticate_request, display_prefix, hash_key, new_key
from .errors import GatewayError, bad_request
from .formats.base import json_response
from .storage import Storage, collect_migrations, open_storage


# ---- operations ------------------------------------------------------------------

async def create_account(store: Storage, name: str | None = None, credits_micro: int = 0) -> tuple[int, str]:
    """A new account with one key (returned once, never stored) and optional credits."""
    key = new_key()
    return await store.keys.create_account(name, hash_key(key), display_prefix(key), credits_micro), key


MAX_GRANT_MICRO = 1_000_000 * MICRO     # one CLI grant; a typo such as 1e12 is refused, balances stay exact


async def account_for_key(store: Storage, key: str) -> int:
    """The account of a full key, or of a unique display prefix; ValueError saying why not."""
    found = await store.keys.get(hash_key(key))
    if found is not None:
        return found.account_id
    accounts = {k.account_id for k in await store.keys.with_prefix(key)} if len(key) >= 8 else set()
    if len(accounts) > 1:
        raise ValueError(f"the prefix {key!r} matches keys of {len(accounts)} accounts; give more of the key")
    if not accounts:
        raise ValueError("no account has that key (give the whole key, or a unique prefix of at least 8 characters)")
    return accounts.pop()


# ---- HTTP ----------------------------------------------------------------------

async def require_key(request):
    """The caller's principal on an endpoint that needs an account key (401 otherwise)."""
    principal = await authenticate_request(request)
    if principal is None:
        raise GatewayError(401, "this endpoint needs an API key: Authorization: Bearer chk_...",
                           code="missing_api_key")
    return principal


async def get_account(request):
    p = await require_key(request)
    body = {"account_id": p.account_id,
            "balance_usd": usd(await request.app[STORE].ledger.balance(p.account_id)),
            "free_allowance_left_usd": 0.0,
            "key": {"prefix": p.key_prefix, "agent": p.agent_id}}
    for extra in await acall_all(request.app[PM].hook.gateway_account_info, app=request.app, principal=p):
        body.update(extra)
    return json_response(body)


async def get_usage(request):
    p = await require_key(request)
    text = request.query.get("limit", "50")
    if not text.isdigit() or not 1 <= int(text) <= 500:
        raise bad_request(f"limit must be a whole number from 1 to 500, got {text!r}", param="limit")
    limit = int(text)
    rows = await request.app[STORE].usage.recent(p.account_id, limit)
    return json_response({"object": "list", "data": [{
        "call_id": r.call_id, "endpoint": r.endpoint, "requested_model": r.requested_model, "model": r.model,
        "input_tokens_billed": r.input_tokens, "output_tokens_billed": r.output_tokens, "usd": usd(r.usd_micro),
        "status": r.status, "outcome": r.outcome, "latency_ms": r.latency_ms,
        "billing": orjson.loads(r.billing) if r.billing else None, "created": r.created_at} for r in rows]})


@hookimpl
def gateway_register_routes(register, config):
    register("GET", "/api/v1/account", get_account)
    register("GET", "/api/v1/account/usage", get_usage)


# ---- CLI -----------------------------------------------------------------------

def with_store(args, work, *, with_config: bool = False):
    """Run `work(store)` (with_config: `work(store, config)`) on the database the config names
    (for CLI commands), after checking the whole config as `gateway run` does."""
    from plugins import load_checked
    cfg, pm = load_checked(args.config, getattr(args, "plugins_dir", None))

    async def go():
        store = await open_storage(cfg.storage_url, collect_migrations(pm))
        try:
            return await (work(store, cfg) if with_config else work(store))
        finally:
            await store.close()
    return asyncio.run(go())


def cmd_credits_grant(args) -> int:
    try:
        amount = parse_usd(args.usd, positive=True, maximum=MAX_GRANT_MICRO)
    except ValueError as err:
        print(f"gateway: USD: {err}", file=sys.stderr)
        return 2

    async def work(store):
        try:
            account_id = await account_for_key(store, args.key)
        except ValueError as err:
            print(f"gateway: {err}", file=sys.stderr)
            return 1
        balance = await store.ledger.credit(account_id, amount, "grant", "cli")
        print(f"account {account_id}: granted ${format_usd(amount)}; balance ${format_usd(balance)}")
        return 0
    return with_store(args, work)


@hookimpl
def gateway_register_commands(subparsers):
    credits = subparsers.add_parser("credits", help="manage credits").add_subparsers(dest="credits_command",
                                                                                      required=True)
    grant = credits.add_parser("grant", help="add credits to the account of KEY")
    grant.add_argument("key", help="the full key, or a unique prefix of it")
    grant.add_argument("usd", help="amount in USD, e.g. 10 or 0.25")
    grant.set_defaults(func=cmd_credits_grant)
    grant.add_argument("--config", help="YAML config (default: the embedded demo)")
