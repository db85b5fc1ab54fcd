"""x402 upto across a crash: the gateway process is killed (kill -9) after the call was
priced and while its settlement is in flight; the restarted process finishes it from the
record, and the payment is settled exactly once, for what the call used. Either way the
call gets one usage row, outcome `crashed`, charged what was settled."""
import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import time

import aiohttp
import httpx
import yaml
from aiohttp import web
from eth_account import Account
from x402.http.clients.httpx import PaymentError

from tests.conftest import DEMO_MODELS, ROOT, UPSTREAM_PRICES, upstream_cost
from tests.fakes import Reply
from tests.fakes.facilitator import FakeFacilitator
from tests.test_cli import free_port
from tests.test_x402 import chains
from tests.test_x402_upto import BODY, FACILITATOR, upto_client


async def start(config, port: int, tmp_path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(ROOT / "gateway.py"), "run", "--config", str(config),
                             "--port", str(port)], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=open(tmp_path / f"gateway-{port}.log", "a"))
    deadline = time.monotonic() + 20
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            try:
                async with s.get(f"http://127.0.0.1:{port}/api/v1/models") as r:
                    if r.status == 200:
                        return proc
            except aiohttp.ClientError:
                await asyncio.sleep(0.1)
    proc.kill()
    raise AssertionError((tmp_path / f"gateway-{port}.log").read_text())


ADMIN_KEY = "adm_crash-test-operator"


async def admin_usage(url: str) -> list[dict]:
    """Every usage row, as the operator reads them (keyless x402 calls have no account)."""
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{url}/api/v1/admin/usage", headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as r:
            assert r.status == 200, await r.text()
            return (await r.json())["data"]


def seen(row: dict) -> tuple:
    """What a usage row says about an x402 call: which call, where, how it ended, what it cost, who paid."""
    return (row["call_id"], row["endpoint"], row["model"], row["outcome"], row["usd"], row["billing"]["usd"],
            row["billing"]["payment"], row["billing"]["payer"].lower())


async def wait_for(check, seconds: float = 15):
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_kill_between_the_call_and_its_settlement_then_restart_settles_once(aiohttp_server, fake_openai,
                                                                                  tmp_path, monkeypatch):
    monkeypatch.setenv("GATEWAY_ADMIN_KEY", ADMIN_KEY)
    facilitator = FakeFacilitator(upto_address=FACILITATOR, settle_gate=asyncio.Event())   # /settle hangs
    fac = await aiohttp_server(facilitator.app)
    db = tmp_path / "gw.db"
    config = tmp_path / "gw.yaml"
    config.write_text(yaml.safe_dump({
        "storage": f"sqlite:///{db}?lease_seconds=1",
        "providers": {"demo": {"type": "demo"},
                      "up": {"type": "openai", "base_url": str(fake_openai.server.make_url("/v1")), "api_key": "sk-test-upstream"}},
        "models": {"chat": DEMO_MODELS + [{"id": "up/gpt", "provider": "up", "upstream": "gpt-4o-mini",
                                           **UPSTREAM_PRICES}]},
        "payments": {"x402": {"facilitator": {"url": str(fac.make_url(""))}, "chains": chains("usdc")}}}))
    fake_openai.enqueue(Reply(text="Short.", output_tokens=3))
    port, payer = free_port(), Account.create()
    proc = await start(config, port, tmp_path)
    try:
        async with upto_client(payer) as http:
            call = asyncio.ensure_future(http.post(f"http://127.0.0.1:{port}/api/v1/chat/completions", json=BODY))
            await wait_for(lambda: any(action == "settle" for action, _ in facilitator.calls))
            os.kill(proc.pid, signal.SIGKILL)                   # the call is done; its settlement is not
            proc.wait(timeout=10)
            try:
                await call
            except (httpx.HTTPError, PaymentError):
                pass                                             # the client lost its answer with the process
        used = upstream_cost(1, 3)
        row = sqlite3.connect(db).execute("SELECT status, due FROM x402_payments").fetchone()
        assert row == ("settling", str(used)) and facilitator.upto_settled == []

        facilitator.settle_gate = None                           # the facilitator answers again
        proc = await start(config, port, tmp_path)
        await wait_for(lambda: facilitator.upto_settled != [])
        await asyncio.sleep(1.5)                                 # a few more recovery rounds: still once
        assert [amount for _, _, amount in facilitator.upto_settled] == [used]
        row = sqlite3.connect(db).execute("SELECT status, amount, usd_micro, ref FROM x402_payments").fetchone()
        assert row[:3] == ("settled", str(used), used)
        # the answer never left the killed process: the call's one usage row says so, with what was settled
        assert [seen(r) for r in await admin_usage(f"http://127.0.0.1:{port}")] == \
            [(row[3], "chat.completions", "up/gpt", "crashed", used / 1e6, used / 1e6, "x402", payer.address.lower())]
    finally:
        proc.kill()
        proc.wait(timeout=10)


async def test_kill_during_the_call_settles_nothing_and_leaves_one_crashed_usage_row(aiohttp_server, tmp_path,
                                                                                     monkeypatch):
    monkeypatch.setenv("GATEWAY_ADMIN_KEY", ADMIN_KEY)
    facilitator = FakeFacilitator(upto_address=FACILITATOR)
    fac = await aiohttp_server(facilitator.app)
    asked = []

    async def never_answers(request):                           # the upstream is still thinking
        asked.append(await request.json())
        await asyncio.sleep(60)
        return web.json_response({})
    slow = web.Application()
    slow.router.add_post("/v1/chat/completions", never_answers)
    upstream = await aiohttp_server(slow)
    db = tmp_path / "gw.db"
    config = tmp_path / "gw.yaml"
    config.write_text(yaml.safe_dump({
        "storage": f"sqlite:///{db}?lease_seconds=1",
        "providers": {"demo": {"type": "demo"},
                      "up": {"type": "openai", "base_url": str(upstream.make_url("/v1")), "api_key": "sk-t"}},
        "models": {"chat": DEMO_MODELS + [{"id": "up/gpt", "provider": "up", "upstream": "gpt-4o-mini",
                                           **UPSTREAM_PRICES}]},
        "payments": {"x402": {"facilitator": {"url": str(fac.make_url(""))}, "chains": chains("usdc")}}}))
    port, payer = free_port(), Account.create()
    proc = await start(config, port, tmp_path)
    try:
        async with upto_client(payer) as http:
            call = asyncio.ensure_future(http.post(f"http://127.0.0.1:{port}/api/v1/chat/completions", json=BODY))
            await wait_for(lambda: len(asked) == 1)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            try:
                await call
            except (httpx.HTTPError, PaymentError):
                pass
        assert sqlite3.connect(db).execute("SELECT status FROM x402_payments").fetchone() == ("claimed",)
        proc = await start(config, port, tmp_path)
        await wait_for(lambda: sqlite3.connect(db).execute("SELECT status, reason FROM x402_payments").fetchone()
                       == ("unused", "crashed_before_priced"))
        assert facilitator.upto_settled == [] and [a for a, _ in facilitator.calls] == ["verify"]
        (call_id,) = sqlite3.connect(db).execute("SELECT ref FROM x402_payments").fetchone()
        await asyncio.sleep(1.5)                                 # a few more recovery rounds: still one row
        assert [seen(r) for r in await admin_usage(f"http://127.0.0.1:{port}")] == \
            [(call_id, "chat.completions", "up/gpt", "crashed", 0.0, 0.0, "x402", payer.address.lower())]
    finally:
        proc.kill()
        proc.wait(timeout=10)
