"""The admin API through HTTP: who may use it, accounts, credit adjustments as ledger
entries, keys (create, list, revoke), usage and the ledger with filters, paging and CSV,
and the account's own summaries. Calls are made with the official openai SDK."""
import asyncio
import csv
import io
import time

import aiohttp
import openai
import pytest

from tests.conftest import MICRO

ENGINES = ("sqlite", "postgresql")          # every admin test runs on both storage engines
ADMIN_KEY = "adm_test-admin-key-for-the-suite"
HELLO = [{"role": "user", "content": "Hello there"}]


@pytest.fixture
async def ops(start_gateway, monkeypatch):
    monkeypatch.setenv("GATEWAY_ADMIN_KEY", ADMIN_KEY)
    return await start_gateway()


async def call(gw, method, path, body=None, key=ADMIN_KEY, raw=False):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as s:
        async with s.request(method, f"{gw.url}{path}", json=body, headers=headers) as r:
            if raw:
                return r.status, await r.text(), dict(r.headers)
            return r.status, await r.json()


# ---- who may use it ---------------------------------------------------------------------------

async def test_no_admin_key_configured_means_no_admin_api(gw, monkeypatch):
    status, body = await call(gw, "GET", "/api/v1/admin/accounts")
    assert status == 404 and "GATEWAY_ADMIN_KEY" in body["error"]["message"]


async def test_account_keys_never_reach_admin_routes(ops):
    key, _ = await ops.key(5)
    assert (await call(ops, "GET", "/api/v1/admin/accounts", key=key))[0] == 403
    assert (await call(ops, "GET", "/api/v1/admin/accounts", key=None))[0] == 401
    assert (await call(ops, "GET", "/api/v1/admin/accounts", key="adm_wrong"))[0] == 401
    assert (await call(ops, "GET", "/api/v1/admin/accounts"))[0] == 200


# ---- accounts --------------------------------------------------------------------------------

async def test_create_an_account_whose_key_works_at_once(ops):
    status, made = await call(ops, "POST", "/api/v1/admin/accounts", {"name": "Acme", "credits_usd": "2.5"})
    assert status == 201 and made["account"]["balance_usd"] == 2.5 and made["key"].startswith("chk_")
    reply = await ops.openai(made["key"]).chat.completions.create(model="demo/echo", messages=HELLO)
    assert reply.choices[0].message.content
    _, shown = await call(ops, "GET", f"/api/v1/admin/accounts/{made['account']['id']}")
    charged = round(reply.billing["usd"] * MICRO)
    assert round(shown["balance_usd"] * MICRO) == 2_500_000 - charged
    assert round(shown["spend_today_usd"] * MICRO) == charged == round(shown["spend_month_usd"] * MICRO)
    assert shown["free_allowance_left_usd"] == 0.0
    [k] = shown["keys"]
    assert k["prefix"] == made["key"][:12] and round(k["spend_usd"] * MICRO) == charged
    assert k["last_used_at"] >= int(time.time()) - 60


async def test_accounts_are_listed_with_paging_and_search(ops):
    for name in ("alpha", "beta", "gamma", "delta", "alphabet"):
        await call(ops, "POST", "/api/v1/admin/accounts", {"name": name})
    _, page = await call(ops, "GET", "/api/v1/admin/accounts?limit=2&offset=1")
    assert page["total"] == 5 and [a["name"] for a in page["data"]] == ["delta", "gamma"]
    _, found = await call(ops, "GET", "/api/v1/admin/accounts?q=alpha")
    assert sorted(a["name"] for a in found["data"]) == ["alpha", "alphabet"] and found["total"] == 2
    status, body = await call(ops, "GET", "/api/v1/admin/accounts?limit=0")
    assert status == 400 and body["error"]["param"] == "limit"
    assert (await call(ops, "GET", "/api/v1/admin/accounts/999"))[0] == 404


@pytest.mark.parametrize("body,param", [
    ({"name": ""}, "name"), ({"name": "x", "credits_usd": "-1"}, "credits_usd"),
    ({"name": "x", "credits_usd": "1e12"}, "credits_usd"), ({"name": "x", "credits_usd": "0.0000001"}, "credits_usd"),
])
async def test_bad_account_bodies_are_400s(ops, body, param):
    status, answer = await call(ops, "POST", "/api/v1/admin/accounts", body)
    assert status == 400 and answer["error"]["param"] == param


async def test_credit_adjustments_are_ledger_entries_with_a_reason(ops):
    key, account = await ops.key(1)
    status, up = await call(ops, "POST", f"/api/v1/admin/accounts/{account}/credits",
                            {"usd": "0.25", "reason": "refund for ticket 7"})
    assert status == 200 and up["balance_usd"] == 1.25
    status, down = await call(ops, "POST", f"/api/v1/admin/accounts/{account}/credits",
                              {"usd": "-1.000001", "reason": "chargeback"})
    assert status == 200 and round(down["balance_usd"] * MICRO) == 249_999
    status, refused = await call(ops, "POST", f"/api/v1/admin/accounts/{account}/credits",
                                 {"usd": "-1", "reason": "too much"})
    assert status == 409 and "below zero" in refused["error"]["message"]
    assert (await call(ops, "POST", f"/api/v1/admin/accounts/{account}/credits", {"usd": "1"}))[0] == 400
    assert await ops.balance(account) == 249_999 == await ops.ledger_sum(account)
    _, ledger = await call(ops, "GET", f"/api/v1/admin/ledger?account={account}")
    assert [(e["kind"], e["usd"], e["ref"]) for e in ledger["data"][:2]] == [
        ("adjustment", -1.000001, "admin: chargeback"), ("adjustment", 0.25, "admin: refund for ticket 7")]


# ---- keys ------------------------------------------------------------------------------------

async def test_another_key_for_an_account_and_revocation_on_the_next_request(ops):
    first, account = await ops.key(1)
    status, made = await call(ops, "POST", f"/api/v1/admin/accounts/{account}/keys", {"name": "ci"})
    assert status == 201 and made["key"] != first and made["account_id"] == account
    client = ops.openai(made["key"])
    await client.chat.completions.create(model="demo/echo", messages=HELLO)
    _, listed = await call(ops, "GET", f"/api/v1/admin/keys?account={account}")
    assert [(k["name"], k["revoked_at"]) for k in listed["data"]] == [("test", None), ("ci", None)]
    assert listed["data"][1]["spend_usd"] > 0 and listed["data"][0]["spend_usd"] == 0
    status, revoked = await call(ops, "POST", f"/api/v1/admin/keys/{made['id']}/revoke")
    assert status == 200 and revoked["revoked_at"]
    with pytest.raises(openai.AuthenticationError):
        await client.chat.completions.create(model="demo/echo", messages=HELLO)
    await ops.openai(first).chat.completions.create(model="demo/echo", messages=HELLO)   # the other key still works
    assert (await call(ops, "POST", "/api/v1/admin/keys/999/revoke"))[0] == 404


# ---- usage and the ledger --------------------------------------------------------------------

async def test_usage_filters_paging_and_csv(ops):
    key_a, acc_a = await ops.key(1)
    key_b, acc_b = await ops.key(1)
    for _ in range(3):
        await ops.openai(key_a).chat.completions.create(model="demo/echo", messages=HELLO)
    await ops.openai(key_b).chat.completions.create(model="demo/echo", messages=HELLO)
    _, mine = await call(ops, "GET", f"/api/v1/admin/usage?account={acc_a}")
    assert len(mine["data"]) == 3 and {u["account_id"] for u in mine["data"]} == {acc_a}
    _, paged = await call(ops, "GET", f"/api/v1/admin/usage?account={acc_a}&limit=2&offset=2")
    assert [u["id"] for u in paged["data"]] == [mine["data"][2]["id"]]
    assert len((await call(ops, "GET", "/api/v1/admin/usage?model=demo/echo&endpoint=chat.completions"))[1]["data"]) == 4
    assert (await call(ops, "GET", "/api/v1/admin/usage?model=nope"))[1]["data"] == []
    assert (await call(ops, "GET", "/api/v1/admin/usage?since=2099-01-01"))[1]["data"] == []
    assert len((await call(ops, "GET", "/api/v1/admin/usage?since=2000-01-01&until=2099-01-01"))[1]["data"]) == 4
    status, text, headers = await call(ops, "GET", f"/api/v1/admin/usage?account={acc_a}&format=csv", raw=True)
    assert status == 200 and headers["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == 3 and all(r["account_id"] == str(acc_a) for r in rows)
    assert [r["usd"] for r in rows] == [f"{u['usd']:.6f}" for u in mine["data"]]
    status, body = await call(ops, "GET", "/api/v1/admin/usage?since=yesterday")
    assert status == 400 and body["error"]["param"] == "since"


async def test_usage_summary_by_day_model_and_endpoint(ops):
    key, account = await ops.key(1)
    replies = [await ops.openai(key).chat.completions.create(model="demo/echo", messages=HELLO) for _ in range(2)]
    _, summary = await call(ops, "GET", f"/api/v1/admin/usage/summary?account={account}")
    spent = sum(round(r.billing["usd"] * MICRO) for r in replies)
    [today] = summary["by_day"]
    assert today["calls"] == 2 and round(today["usd"] * MICRO) == spent
    assert summary["by_model"] == [{"model": "demo/echo", "calls": 2, "usd": today["usd"]}]
    assert summary["by_endpoint"] == [{"endpoint": "chat.completions", "calls": 2, "usd": today["usd"]}]
    _, own = await call(ops, "GET", "/api/v1/account/usage/summary", key=key)
    assert own == summary


async def test_ledger_export_as_csv(ops):
    _, account = await ops.key(3)
    status, text, _ = await call(ops, "GET", f"/api/v1/admin/ledger?account={account}&format=csv", raw=True)
    rows = list(csv.DictReader(io.StringIO(text)))
    assert status == 200 and [(r["kind"], r["usd"]) for r in rows] == [("grant", "3.000000")]


# ---- key policies: expiry, allowed models, a spend limit per day -------------------------------

async def keyed(ops, account, **policy):
    status, made = await call(ops, "POST", f"/api/v1/admin/accounts/{account}/keys", {"name": "p", **policy})
    assert status == 201, made
    return made["key"]


async def test_a_key_outside_its_model_list_gets_403(ops):
    _, account = await ops.key(1)
    key = await keyed(ops, account, models=["demo/echo"])
    await ops.openai(key).chat.completions.create(model="demo/echo", messages=HELLO)
    with pytest.raises(openai.PermissionDeniedError) as refused:
        await ops.openai(key).chat.completions.create(model="svc/smart", messages=HELLO)
    assert "may call only demo/echo" in refused.value.message
    status, body = await call(ops, "POST", f"/api/v1/admin/accounts/{account}/keys", {"models": ["nope/model"]})
    assert status == 400 and "nope/model" in body["error"]["message"]


async def test_an_expired_key_gets_401_saying_so(ops, monkeypatch):
    _, account = await ops.key(1)
    key = await keyed(ops, account, expires_at=int(time.time()) + 2)
    await ops.openai(key).chat.completions.create(model="demo/echo", messages=HELLO)
    later = time.time() + 3
    monkeypatch.setattr("plugins.keypolicy.time.time", lambda: later)
    with pytest.raises(openai.AuthenticationError) as refused:
        await ops.openai(key).chat.completions.create(model="demo/echo", messages=HELLO)
    assert "expired" in refused.value.message
    status, body = await call(ops, "POST", f"/api/v1/admin/accounts/{account}/keys", {"expires_at": "2001-01-01"})
    assert status == 400 and body["error"]["param"] == "expires_at"


async def test_a_key_past_its_daily_limit_gets_402_naming_the_limit(ops):
    _, account = await ops.key(5)
    # one demo/echo call with max_tokens 100 reserves 1 + 100 x 2 micro at the 1.00/2.00 list (0.5 discount)
    key = await keyed(ops, account, spend_limit={"usd": "0.0005", "period": "day"})
    client = ops.openai(key)
    spent = 0
    for _ in range(60):
        try:
            reply = await client.chat.completions.create(model="demo/echo", messages=HELLO, max_tokens=100)
        except openai.APIStatusError as err:
            assert err.status_code == 402 and "spend limit of $0.000500 per day is reached" in err.message
            break
        spent += round(reply.billing["usd"] * MICRO)
    else:
        pytest.fail("the limit never stopped the key")
    assert 0 < spent <= 500
    _, listed = await call(ops, "GET", f"/api/v1/admin/keys?account={account}")
    assert listed["data"][-1]["spend_limit"] == {"usd": 0.0005, "period": "day"}


async def test_concurrent_calls_never_overshoot_a_key_limit(ops):
    _, account = await ops.key(5)
    key = await keyed(ops, account, spend_limit={"usd": "0.001", "period": "month"})
    client = ops.openai(key)

    async def one():
        try:
            reply = await client.chat.completions.create(model="demo/echo", messages=HELLO, max_tokens=100)
            return round(reply.billing["usd"] * MICRO)
        except openai.APIStatusError as err:
            assert err.status_code == 402
            return None
    results = await asyncio.gather(*[one() for _ in range(40)])
    charged = [r for r in results if r is not None]
    assert charged and None in results
    assert sum(charged) <= 1000                                  # never past the limit, holds included
    _, shown = await call(ops, "GET", f"/api/v1/admin/keys?account={account}")
    assert round(shown["data"][-1]["spend_usd"] * MICRO) == sum(charged)
