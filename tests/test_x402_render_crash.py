"""A video render paid per call with x402 (no key, so no hold), in flight when the gateway
is killed (kill -9): after a restart the job is cancelled upstream once, the payment ends
`unused` (the work was not delivered, so nothing is settled) with one usage row, outcome
`crashed`, charged nothing, and the next paid render is settled once, for itself alone."""
import asyncio
import inspect
import time

import httpx
import pytest
from eth_account import Account
from x402.http.clients.httpx import PaymentError

from plugins.storage import open_storage
from tests.fakes import FakeFal, MediaReply
from tests.fakes.facilitator import FakeFacilitator
from tests.gateway_process import GatewayProcess
from tests.test_render_crash import render_config
from tests.test_x402 import USDC, chains, decode, payer_client
from tests.test_x402_upto import FACILITATOR, upto_client
from tests.test_x402_upto_crash import ADMIN_KEY, admin_usage, seen

ENGINES = ("sqlite", "postgresql")
VIDEO = {"model": "fal/veo3", "prompt": "a falcon"}
CLIENTS = {"exact": lambda payer: payer_client(payer, asset=USDC), "upto": upto_client}


async def eventually(check, seconds: float = 20) -> None:
    """Until `check()` (plain or awaitable) is true."""
    deadline = time.monotonic() + seconds
    while not await _value(check()):
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("scheme", ["exact", "upto"])
async def test_a_paid_render_left_by_a_killed_process_is_cancelled_and_not_settled(scheme, storage_url,
                                                                                   aiohttp_server, tmp_path):
    facilitator = FakeFacilitator(upto_address=FACILITATOR)
    fac = await aiohttp_server(facilitator.app)
    fal = FakeFal()
    fal.server = await aiohttp_server(fal.app)
    fal.enqueue(MediaReply(video=True, hang=True))
    url = storage_url + ("&" if "?" in storage_url else "?") + "lease_seconds=1"
    gw = GatewayProcess(tmp_path, {
        **render_config(tmp_path, fal, url),
        "payments": {"x402": {"facilitator": {"url": str(fac.make_url(""))}, "chains": chains("usdc")}}},
        env={"GATEWAY_ADMIN_KEY": ADMIN_KEY})
    store = await open_storage(url, [])

    async def payments():
        return sorted(tuple(r) for r in await store.fetchall(
            "SELECT scheme, status, reason, upstream_job FROM x402_payments"))

    async def payments_are(rows) -> bool:
        return await payments() == sorted(rows)

    await gw.start()
    payer = Account.create()
    try:
        async with CLIENTS[scheme](payer) as http:
            call = asyncio.ensure_future(http.post(f"{gw.url}/api/v1/videos/generations", json=VIDEO))
            await eventually(lambda: sum(r.path.endswith("/status") for r in fal.requests) >= 2)  # rendering
            gw.kill9()
            try:
                await call
            except (httpx.HTTPError, PaymentError):
                pass                                             # the client lost its answer with the process
        job_id = list(fal.jobs)[0]
        [(paid_with, status, _, job)] = await payments()
        assert (paid_with, status) == (scheme, "claimed") and job_id in job and '"PUT"' in job
        assert fal.cancelled == []

        await gw.start()
        await eventually(lambda: fal.cancelled != [])
        await asyncio.sleep(1)                                   # more recovery rounds: cancelled once
        assert fal.cancelled == [job_id]
        finished = [(scheme, "unused", "crashed_before_priced", None)]
        await eventually(lambda: payments_are(finished))
        assert [action for action, _ in facilitator.calls] == ["verify"]            # nothing settled
        (call_id,) = await store.fetchone("SELECT ref FROM x402_payments")
        crashed = (call_id, "videos.generations", "fal/veo3", "crashed", 0.0, 0.0, "x402", payer.address.lower())
        assert [seen(r) for r in await admin_usage(gw.url)] == [crashed]

        fal.enqueue(MediaReply(video=True))                      # the restarted gateway serves the next one
        async with CLIENTS[scheme](Account.create()) as http:
            r = await http.post(f"{gw.url}/api/v1/videos/generations", json=VIDEO)
        assert r.status_code == 200, r.text
        settled = decode(r.headers["PAYMENT-RESPONSE"])
        assert settled["success"] and [a for a, _ in facilitator.calls] == ["verify", "verify", "settle"]
        assert await payments_are(finished + [(scheme, "settled", None, None)])
        assert len(facilitator.exact_settled + facilitator.upto_settled) == 1 and fal.cancelled == [job_id]
        usage = await admin_usage(gw.url)
        assert [seen(r) for r in usage if r["outcome"] == "crashed"] == [crashed]   # still one, the served one ok
        assert sorted(r["outcome"] for r in usage) == ["crashed", "ok"]
    finally:
        gw.stop()
        await store.close()


async def _value(result):
    return await result if inspect.isawaitable(result) else result
