"""CLI parity with the admin API: `gateway keys create|list|revoke`, `gateway accounts
list|show`, `gateway usage` and `gateway admin-keys create`. Each opens the database the
config names, does one thing, and prints what an operator needs (a new key last)."""
from __future__ import annotations

import sys

from config import format_usd, parse_usd, redact_url, usd
from plugins import hookimpl
from plugins.accounts import MAX_GRANT_MICRO, create_account, with_store
from plugins.auth import hash_key
from plugins.keycache import TTL_SECONDS, publish_once
from plugins.redis_link import redis_url

from plugins.storage import reports

from . import render, writes
from plugins.storage.records import Page, UsageFilter

from .filters import parse_time


def _fail(message: str) -> int:
    print(f"gateway: {message}", file=sys.stderr)
    return 2


def cmd_keys_create(args) -> int:
    try:
        credits = parse_usd(args.credits, maximum=MAX_GRANT_MICRO)
    except ValueError as err:
        return _fail(f"--credits: {err}")

    async def work(store):
        if args.account is None:
            account_id, key = await create_account(store, args.name, credits)
            print(f"account {account_id} created with ${format_usd(credits)} credits; the key is shown once:")
        else:
            if credits:
                return _fail("--credits goes with a new account; use `gateway credits grant` for an existing one")
            if await reports.account(store, args.account) is None:
                return _fail(f"no account {args.account} (see `gateway accounts list`)")
            _, key = await writes.new_key(store, args.account, args.name)
            print(f"a new key for account {args.account}; it is shown once:")
        print(key)
        return 0
    return with_store(args, work)


def cmd_keys_list(args) -> int:
    async def work(store):
        rows = await reports.keys(store, args.account)
        print(f"{'id':>5}  {'account':>7}  {'prefix':<13} {'name':<20} {'spend':>12}  state")
        for r in rows:
            k = render.key(r)
            state = "revoked" if k["revoked_at"] else "active"
            print(f"{k['id']:>5}  {k['account_id']:>7}  {k['prefix']:<13} {(k['name'] or '')[:20]:<20} "
                  f"{k['spend_usd']:>12.6f}  {state}")
        return 0
    return with_store(args, work)


async def _tell_running_gateways(config, key_hash: str) -> None:
    """With `redis:`, every running gateway drops its cached copy of the key now, as after a
    change made over HTTP. A Redis that cannot be reached is a warning: the database change
    stands, and every process re-reads a key within its cache lifetime anyway."""
    url = redis_url(config)
    if url is None:
        return
    why = await publish_once(url, key_hash)
    if why is not None:
        print(f"gateway: warning: saved in the database, but Redis at {redact_url(url)} could not be reached ({why}); "
              f"running gateways may go on with the key as it was for up to {TTL_SECONDS:g} s, until their cached "
              "copy expires", file=sys.stderr)


def cmd_keys_revoke(args) -> int:
    async def work(store, config):
        matches = await reports.keys_matching(store, args.key, hash_key(args.key))
        if not matches:
            return _fail("no key matches (give the whole key, or its prefix as `gateway keys list` shows it)")
        if len(matches) > 1:
            return _fail(f"{len(matches)} keys start with {args.key!r}; give more of the key")
        key = matches[0]
        await store.keys.revoke(key["id"])
        await _tell_running_gateways(config, key["hash"])
        revoked = (await reports.key(store, key["id"]))["revoked_at"]
        print(f"key {key['prefix']}... (id {key['id']}) revoked at {revoked}", flush=True)     # refused from now on
        return 0
    return with_store(args, work, with_config=True)


def cmd_accounts_list(args) -> int:
    async def work(store):
        rows, total = await reports.accounts(store, args.search or "", Page(limit=args.limit, offset=0))
        print(f"{'id':>7}  {'name':<24} {'balance':>14}  keys")
        for r in rows:
            a = render.account(r)
            print(f"{a['id']:>7}  {(a['name'] or '')[:24]:<24} {a['balance_usd']:>14.6f}  {a['keys']}")
        print(f"{len(rows)} of {total} accounts")
        return 0
    return with_store(args, work)


def cmd_accounts_show(args) -> int:
    async def work(store):
        row = await reports.account(store, args.id)
        if row is None:
            return _fail(f"no account {args.id}")
        today, month = await reports.spend_today_and_month(store, args.id)
        print(f"account {row['id']} {row['name'] or ''}".rstrip())
        print(f"  balance          ${usd(row['balance_micro']):.6f}")
        print(f"  spend today      ${usd(today):.6f}")
        print(f"  spend this month ${usd(month):.6f}")
        for k in await reports.keys(store, args.id):
            print(f"  key {k['prefix']}... id {k['id']} {'revoked' if k['revoked_at'] else 'active'}"
                  f" spend ${usd(k['spend_micro']):.6f}")
        for g in await reports.agents(store, args.id):
            print(f"  agent {g['id']} {g['name']}")
        return 0
    return with_store(args, work)


def cmd_usage(args) -> int:
    try:
        since = parse_time(args.since, "--since") if args.since else None
    except Exception:
        return _fail(f"--since: expected a date such as 2026-11-23, got {args.since!r}")

    async def work(store):
        rows = await reports.usage(store, UsageFilter(account_id=args.account, since=since), Page(limit=args.limit))
        items = [render.usage(r) for r in rows]
        if args.csv:
            sys.stdout.write(render.to_csv(items, render.USAGE_CSV, "usage.csv").text)
            return 0
        for u in items:
            print(f"{u['created_at']}  account {u['account_id']}  {u['endpoint']:<20} {u['model'] or '-':<28} "
                  f"{u['input_tokens']:>7}/{u['output_tokens']:<7} ${u['usd']:.6f}  {u['outcome']}")
        return 0
    return with_store(args, work)


def cmd_admin_keys_create(args) -> int:
    async def work(store):
        key = await writes.create_admin_key(store, args.name)
        print("an admin key for /api/v1/admin and the dashboard; it is shown once:")
        print(key)
        return 0
    return with_store(args, work)


@hookimpl
def gateway_register_commands(subparsers):
    keys = subparsers.add_parser("keys", help="manage API keys").add_subparsers(dest="keys_command", required=True)
    create = keys.add_parser("create", help="a new key, for a new account or (--account) an existing one")
    create.add_argument("--account", type=int, help="add the key to this account instead of creating one")
    create.add_argument("--credits", default="0", help="starting credits in USD (new accounts)")
    create.add_argument("--name", help="a label for the account (or, with --account, the key)")
    create.set_defaults(func=cmd_keys_create)
    listing = keys.add_parser("list", help="keys with their spend")
    listing.add_argument("--account", type=int)
    listing.set_defaults(func=cmd_keys_list)
    revoke = keys.add_parser("revoke", help="revoke a key; refused from the next request on (with `redis:`, "
                                            "by every running gateway at once)")
    revoke.add_argument("key", help="the whole key or its prefix (as `keys list` shows it)")
    revoke.set_defaults(func=cmd_keys_revoke)
    accounts = subparsers.add_parser("accounts", help="see accounts").add_subparsers(dest="accounts_command",
                                                                                      required=True)
    alist = accounts.add_parser("list", help="accounts, newest first")
    alist.add_argument("--search", help="a name fragment or an id")
    alist.add_argument("--limit", type=int, default=50)
    alist.set_defaults(func=cmd_accounts_list)
    ashow = accounts.add_parser("show", help="one account: balance, spend, keys, agents")
    ashow.add_argument("id", type=int)
    ashow.set_defaults(func=cmd_accounts_show)
    usage = subparsers.add_parser("usage", help="recent calls, newest first")
    usage.add_argument("--account", type=int)
    usage.add_argument("--since", help="a date (2026-11-23) or an ISO time")
    usage.add_argument("--limit", type=int, default=100)
    usage.add_argument("--csv", action="store_true", help="CSV for a spreadsheet")
    usage.set_defaults(func=cmd_usage)
    admin_keys = subparsers.add_parser("admin-keys", help="keys for the admin API and the operator's dashboard")
    admin_create = admin_keys.add_subparsers(dest="admin_keys_command", required=True).add_parser(
        "create", help="print a new admin key (last line)")
    admin_create.add_argument("--name")
    admin_create.set_defaults(func=cmd_admin_keys_create)
    for p in (create, listing, revoke, alist, ashow, usage, admin_create):
        p.add_argument("--config", help="YAML config (default: the embedded demo)")
