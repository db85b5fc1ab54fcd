"""A render in flight when the gateway is killed (kill -9): after a restart the job is
cancelled upstream once, and its hold is released."""
import asyncio
import sqlite3
import time

import aiohttp

from tests.conftest import DEMO_MODELS
from tests.fakes import FakeFal, MediaReply
from tests.gateway_process import GatewayProcess


def render_config(tmp_path, fal: FakeFal, storage: str) -> dict:
    """A gateway with one fal video model whose renders the fake can leave hanging."""
    return {
        "storage": storage,
        "providers": {"demo": {"type": "demo"},
                      "fal": {"type": "fal", "base_url": str(fal.server.make_url("")), "api_key": "fal-test-key",
                              "poll_seconds": 0.05}},
        "models": {"chat": DEMO_MODELS, "video": [
            {"id": "fal/veo3", "provider": "fal", "upstream": "fal-ai/veo3", "list_usd_per_second": 0.40,
             "timeout_seconds": 120, "options": {"duration_seconds": {"values": [8], "default": 8}}}]},
        "media": {"artifacts": {"dir": str(tmp_path / "art")}, "allow_private_urls": True}}


async def eventually(check, seconds: float = 15) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_a_render_left_by_a_killed_process_is_cancelled_upstream(aiohttp_server, tmp_path):
    fal = FakeFal()
    fal.server = await aiohttp_server(fal.app)
    fal.enqueue(MediaReply(video=True, hang=True))
    db = tmp_path / "gw.db"
    gw = GatewayProcess(tmp_path, render_config(tmp_path, fal, f"sqlite:///{db}?lease_seconds=1"))
    key = gw.cli("keys", "create", "--credits", "10").split()[-1]
    await gw.start()
    try:
        async with aiohttp.ClientSession() as s:
            call = asyncio.ensure_future(s.post(f"{gw.url}/api/v1/videos/generations",
                                                json={"model": "fal/veo3", "prompt": "a falcon"},
                                                headers={"Authorization": f"Bearer {key}"}))
            await eventually(lambda: sum(r.path.endswith("/status") for r in fal.requests) >= 2)   # rendering
            gw.kill9()
            try:
                await call
            except aiohttp.ClientError:
                pass
        assert fal.cancelled == []
        job = sqlite3.connect(db).execute("SELECT status, upstream_job FROM holds").fetchone()
        assert job[0] == "open" and '"PUT"' in job[1]
        await gw.start()
        await eventually(lambda: fal.cancelled != [])
        await asyncio.sleep(1)                                   # more rounds: cancelled once
        assert len(fal.cancelled) == 1 and fal.cancelled == [list(fal.jobs)[0]]
        assert sqlite3.connect(db).execute("SELECT status, upstream_job FROM holds").fetchone() == ("released", None)
    finally:
        gw.stop()
