"""Images and videos with the offline demo provider: real PNGs and MP4s, exact prices for
n, quality, resolution, duration and audio, option validation (400, nothing charged),
artifacts and their expiry, URL safety, reference clip length, x402 on media."""
import base64
import os
import time

import aiohttp
import pytest
from aiohttp import web

from plugins import hookimpl
from plugins.media.mp4 import duration_seconds
from tests.conftest import MICRO

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY_PNG = "data:image/png;base64," + base64.b64encode(PNG_MAGIC + b"0" * 40).decode()
MEDIA = {"image": [
    {"id": "demo/image", "provider": "demo", "upstream": {"generate": "demo-image", "edit": "demo-edit"},
     "max_references": 2, "list_usd_per_image": 0.04,
     "options": {"aspect_ratio": ["1:1", "16:9"],
                 "quality": {"values": ["low", "medium", "high"], "default": "medium",
                             "price_multiplier": {"low": 0.5, "high": 2}},
                 "resolution": {"values": ["1K", "2K", "4K"], "default": "1K", "price_multiplier": {"2K": 1.5, "4K": 3}}}},
    {"id": "demo/image-basic", "provider": "demo", "upstream": "demo-image", "list_usd_per_image": 0.01}],
    "video": [
    {"id": "demo/video", "provider": "demo", "max_references": 3, "list_usd_per_second": 0.10,
     "upstream": {"text_to_video": "t2v", "image_to_video": "i2v", "reference_to_video": "r2v"},
     "options": {"duration_seconds": {"min": 4, "max": 12, "step": 4, "default": 4},
                 "resolution": {"values": ["720p", "1080p"], "default": "720p", "price_multiplier": {"1080p": 1.5}},
                 "aspect_ratio": ["16:9", "9:16"], "audio": {"default": True, "audio_off_price_multiplier": 0.6},
                 "video_reference": {"max_seconds": 0.5}}},
    {"id": "demo/video-flat", "provider": "demo", "upstream": "t2v", "list_usd_per_video": 0.50,
     "options": {"duration_seconds": {"values": [5, 10], "default": 5}}}]}


@pytest.fixture
async def media_gw(start_gateway, tmp_path):
    gw = await start_gateway({"models": MEDIA, "media": {"artifacts": {"dir": str(tmp_path / "artifacts")},
                                                         "allow_private_urls": True}})
    key, account = await gw.key(5)
    return gw, key, account


async def post(gw, path, body, key=None, headers=None):
    h = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{gw.url}{path}", json=body, headers={**h, **(headers or {})}) as r:
            return r.status, await r.json(), r.headers


async def get_bytes(gw, path):
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{gw.url}{path}") as r:
            return r.status, await r.read(), r.headers


# ---- images ---------------------------------------------------------------------------

async def test_images_with_the_openai_sdk_and_exact_price(media_gw):
    gw, key, account = media_gw
    resp = await gw.openai(key).images.generate(model="demo/image", prompt="a red fox", n=3, quality="high",
                                                extra_body={"resolution": "4K", "aspect_ratio": "16:9"})
    assert len(resp.data) == 3 and all(base64.b64decode(d.b64_json).startswith(PNG_MAGIC) for d in resp.data)
    assert len({d.b64_json for d in resp.data}) == 3                      # three different images
    billing = resp.model_extra["billing"]
    # service 0.02 per image (list 0.04 x 0.5) x high 2 x 4K 3 = 0.12 an image, x 3
    assert billing == {"model": "demo/image", "operation": "generate", "images": 3, "usd": 0.36,
                       "usage_usd": 0.36, "quote_usd": 0.36, "list_usd": 0.72, "note": "charged from prepaid credits"}
    assert await gw.balance(account) == 5 * MICRO - 360_000 == await gw.ledger_sum(account)


async def test_same_prompt_same_image(media_gw):
    gw, key, _ = media_gw
    a = await gw.openai(key).images.generate(model="demo/image-basic", prompt="same")
    b = await gw.openai(key).images.generate(model="demo/image-basic", prompt="same")
    assert a.data[0].b64_json == b.data[0].b64_json


async def test_a_reference_image_switches_to_edit(media_gw):
    gw, key, account = media_gw
    status, body, _ = await post(gw, "/api/v1/images/generations",
                                 {"model": "demo/image", "prompt": "make it blue", "image_url": TINY_PNG}, key)
    assert status == 200 and body["billing"]["operation"] == "edit" and body["billing"]["usd"] == 0.02


@pytest.mark.parametrize("body,param,words", [
    ({"model": "demo/image", "aspect_ratio": "4:3"}, "aspect_ratio", "'4:3' is not offered by demo/image; allowed: 1:1, 16:9"),
    ({"model": "demo/image-basic", "resolution": "2K"}, "resolution", "allowed: none"),
    ({"model": "demo/image", "quality": "ultra"}, "quality", "allowed: low, medium, high"),
    ({"model": "demo/image", "n": 11}, "n", "at most 10"),
    ({"model": "demo/image-basic", "image_url": TINY_PNG}, "image_url", "cannot edit images"),
    ({"model": "demo/image", "input_images": [TINY_PNG] * 3}, "input_images", "at most 2 reference images"),
    ({"model": "demo/image", "image_url": "ftp://x/y.png"}, "image_url", "https URL or a data: URL"),
    ({"model": "demo/video"}, "model", "not an image model"),
    ({"model": "demo/nope"}, "model", "not an image model"),
])
async def test_image_options_are_checked_before_any_charge(media_gw, body, param, words):
    gw, key, account = media_gw
    status, err, _ = await post(gw, "/api/v1/images/generations", {"prompt": "p", **body}, key)
    assert status == 400 and err["error"]["param"] == param and words in err["error"]["message"], err
    assert await gw.balance(account) == 5 * MICRO
    assert tuple(await gw.store.fetchone("SELECT COUNT(*) FROM holds")) == (0,)


@pytest.mark.parametrize("url", ["https://127.0.0.1/x.png", "https://localhost/x.png", "https://10.0.0.8/x.png",
                                 "https://[::1]/x.png", "https://169.254.169.254/latest/meta-data"])
async def test_private_addresses_are_never_fetched(start_gateway, url):
    gw = await start_gateway({"models": MEDIA})                      # the default: private URLs refused
    key, account = await gw.key(1)
    status, err, _ = await post(gw, "/api/v1/images/generations",
                                {"model": "demo/image", "prompt": "p", "image_url": url}, key)
    assert status == 400 and "private, loopback and link-local" in err["error"]["message"]
    assert await gw.balance(account) == MICRO


async def test_names_resolving_to_private_addresses_are_refused():
    from plugins.media.fetch import GuardedResolver
    with pytest.raises(OSError, match="private or local"):
        await GuardedResolver().resolve("localhost", 443)


# ---- videos ---------------------------------------------------------------------------

async def test_video_render_artifact_and_price(media_gw):
    gw, key, account = media_gw
    status, body, _ = await post(gw, "/api/v1/videos/generations",
                                 {"model": "demo/video", "prompt": "a falcon dives", "duration_seconds": 8,
                                  "resolution": "1080p", "audio": False, "aspect_ratio": "9:16"}, key)
    assert status == 200 and body["status"] == "succeeded"
    url = body["results"][0]["url"]
    assert url.startswith("/api/v1/media/artifacts/") and url.endswith(".mp4")
    # list 0.10/s x 8 s x 1080p 1.5 x audio off 0.6 = 0.72 held; service is half: 0.36 charged
    assert body["billing"] == {"model": "demo/video", "operation": "text_to_video", "jobs": 1, "usd": 0.36,
                               "usage_usd": 0.36, "quote_usd": 0.72, "list_usd": 0.72,
                               "note": "charged from prepaid credits"}
    assert await gw.balance(account) == 5 * MICRO - 360_000 == await gw.ledger_sum(account)
    status, clip, headers = await get_bytes(gw, url)                     # no key needed
    assert status == 200 and headers["Content-Type"] == "video/mp4" and duration_seconds(clip) == 1.0


async def test_video_defaults_steps_and_per_video_prices(media_gw):
    gw, key, account = media_gw
    status, body, _ = await post(gw, "/api/v1/videos/generations", {"model": "demo/video", "prompt": "x"}, key)
    assert status == 200 and body["billing"]["quote_usd"] == 0.40 and body["billing"]["usd"] == 0.20   # 4 s default
    status, body, _ = await post(gw, "/api/v1/videos/generations",
                                 {"model": "demo/video-flat", "prompt": "x", "seconds": 10}, key)
    assert status == 200 and body["billing"]["quote_usd"] == 1.0 and body["billing"]["usd"] == 0.5   # 2 x default


@pytest.mark.parametrize("body,param,words", [
    ({"duration_seconds": 6}, "duration_seconds", "4 to 12 seconds in steps of 4"),
    ({"duration_seconds": "long"}, "duration_seconds", "must be a number, got a string"),
    ({"duration_seconds": "8"}, "duration_seconds", "must be a number, got a string"),    # as max_tokens: "8" is
    ({"seconds": "8"}, "seconds", "must be a number, got a string"),
    ({"resolution": "4K"}, "resolution", "allowed: 720p, 1080p"),
    ({"quality": "high"}, "quality", "only for svc/smart"),
    ({"input_images": [TINY_PNG]}, "input_images", "two or more references"),
    ({"model": "demo/video-flat", "audio": True}, "audio", "renders no soundtrack"),
    ({"model": "demo/video-flat", "image_url": TINY_PNG}, "image_url", "has no image_to_video"),
])
async def test_video_options_are_checked_before_any_charge(media_gw, body, param, words):
    gw, key, account = media_gw
    status, err, _ = await post(gw, "/api/v1/videos/generations", {"model": "demo/video", "prompt": "p", **body}, key)
    assert status == 400 and err["error"]["param"] == param and words in err["error"]["message"], err
    assert await gw.balance(account) == 5 * MICRO


async def test_operations_follow_the_inputs(media_gw):
    gw, key, _ = media_gw
    for body, operation in (({"image_url": TINY_PNG}, "image_to_video"),
                            ({"input_images": [TINY_PNG, TINY_PNG]}, "reference_to_video")):
        status, out, _ = await post(gw, "/api/v1/videos/generations", {"model": "demo/video", "prompt": "p", **body}, key)
        assert status == 200 and out["billing"]["operation"] == operation


async def test_reference_clip_length_is_checked(media_gw, aiohttp_server):
    gw, key, account = media_gw
    clip = open(os.path.join(os.path.dirname(__file__), "..", "providers", "assets", "demo-clip-0.mp4"), "rb").read()
    async def serve(request):
        body = clip if request.path == "/clip.mp4" else b"hello"
        return web.Response(body=body, content_type="video/mp4")
    app = web.Application()
    app.router.add_get("/clip.mp4", serve)
    app.router.add_get("/not-a-clip.mp4", serve)
    server = await aiohttp_server(app)
    status, err, _ = await post(gw, "/api/v1/videos/generations", {"model": "demo/video", "prompt": "p",
                                                                   "video_url": str(server.make_url("/clip.mp4"))}, key)
    assert status == 400 and "the clip is 1.0 s; demo/video takes at most 0.5 s" in err["error"]["message"]
    status, err, _ = await post(gw, "/api/v1/videos/generations", {"model": "demo/video", "prompt": "p",
                                                                   "video_url": str(server.make_url("/not-a-clip.mp4"))}, key)
    assert status == 400 and "not an MP4" in err["error"]["message"]
    assert await gw.balance(account) == 5 * MICRO


async def test_artifact_links_expire_and_cannot_be_guessed(media_gw, tmp_path):
    gw, key, _ = media_gw
    status, body, _ = await post(gw, "/api/v1/videos/generations", {"model": "demo/video", "prompt": "x"}, key)
    url = body["results"][0]["url"]
    name = url.rsplit("/", 1)[1]
    assert len(name.split(".")[0]) >= 32                                   # 24 random bytes
    path = tmp_path / "artifacts" / name
    old = time.time() - 7200
    os.utime(path, (old, old))                                             # two hours later
    status, body, _ = await get_bytes(gw, url)
    assert status == 404 and b"expired" in body and not path.exists()
    for probe in ("../gateway.db", "short.mp4", "x" * 40 + ".exe"):
        status, _, _ = await get_bytes(gw, "/api/v1/media/artifacts/" + probe)
        assert status == 404


async def test_media_listing(media_gw):
    gw, _, _ = media_gw
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{gw.url}/api/v1/media/models") as r:
            body = await r.json()
    by_id = {m["id"]: m for m in body["models"]}
    image, video = by_id["demo/image"], by_id["demo/video"]
    assert image["kind"] == "image" and image["operations"] == ["generate", "edit"] and image["max_references"] == 2
    assert image["usd_per_image"] == 0.02 and image["list_usd_per_image"] == 0.04
    assert image["options"]["quality"]["price_multiplier"] == {"low": 0.5, "high": 2}
    assert video["operations"] == ["text_to_video", "image_to_video", "reference_to_video"]
    assert video["usd_per_second"] == 0.05 and video["options"]["video_reference"] == {"max_seconds": 0.5}
    assert "smart" in body and "aspect_ratio is free" in body["how"]


async def test_keyless_media_without_x402_is_402(media_gw):
    gw, _, _ = media_gw
    status, err, _ = await post(gw, "/api/v1/images/generations", {"model": "demo/image", "prompt": "p"})
    assert status == 402 and "API key" in err["error"]["message"]


async def test_x402_pays_for_images(start_gateway, aiohttp_server, tmp_path):
    from eth_account import Account

    from tests.fakes.facilitator import FakeFacilitator
    from tests.test_x402 import chains, decode, sign
    facilitator = FakeFacilitator()
    server = await aiohttp_server(facilitator.app)
    gw = await start_gateway({"models": MEDIA, "media": {"artifacts": {"dir": str(tmp_path / "a")}},
                              "payments": {"x402": {"facilitator": {"url": str(server.make_url(""))},
                                                    "chains": chains("usdc")}}})
    body = {"model": "demo/image", "prompt": "a fox", "n": 2, "quality": "low"}
    status, challenge, _ = await post(gw, "/api/v1/images/generations", body)
    assert status == 402 and challenge["accepts"][0]["maxAmountRequired"] == "20000"    # 0.01 x 2
    status, out, headers = await post(gw, "/api/v1/images/generations", body,
                                      headers=sign(Account.create(), amount=20_000))
    assert status == 200 and len(out["data"]) == 2 and out["billing"]["usd"] == 0.02
    assert decode(headers["PAYMENT-RESPONSE"])["success"] is True


class MemoryArtifacts:
    """A plugin's own artifact store: files kept in memory."""

    @hookimpl
    def gateway_register_artifact_stores(self, register):
        from plugins.media.artifacts import PREFIX, ArtifactStore

        class Memory(ArtifactStore):
            type_name = "memory"
            files: dict = {}

            async def save(self, data, content_type):
                name = f"{'m' * 30}{len(self.files)}.mp4"
                self.files[name] = data
                return PREFIX + name

            async def open(self, name):
                return (self.files[name], "video/mp4") if name in self.files else None
        register(Memory)


async def test_a_plugin_can_store_artifacts(start_gateway):
    from plugins import get_plugin_manager
    pm = get_plugin_manager()
    pm.register(MemoryArtifacts(), "memory-artifacts")
    gw = await start_gateway({"models": MEDIA, "media": {"artifacts": {"type": "memory"}}}, pm=pm)
    key, _ = await gw.key(1)
    status, body, _ = await post(gw, "/api/v1/videos/generations", {"model": "demo/video", "prompt": "x"}, key)
    status, clip, _ = await get_bytes(gw, body["results"][0]["url"])
    assert status == 200 and duration_seconds(clip) == 1.0


async def test_x402_pays_for_videos_at_list_price(start_gateway, aiohttp_server, tmp_path):
    from eth_account import Account

    from tests.fakes.facilitator import FakeFacilitator
    from tests.test_x402 import chains, sign
    facilitator = FakeFacilitator()
    server = await aiohttp_server(facilitator.app)
    gw = await start_gateway({"models": MEDIA, "media": {"artifacts": {"dir": str(tmp_path / "a")}},
                              "payments": {"x402": {"facilitator": {"url": str(server.make_url(""))},
                                                    "chains": chains("usdc")}}})
    body = {"model": "demo/video", "prompt": "waves", "duration_seconds": 8}
    status, challenge, _ = await post(gw, "/api/v1/videos/generations", body)
    assert status == 402 and challenge["accepts"][0]["maxAmountRequired"] == "800000"   # list: 0.10/s x 8 s
    status, out, _ = await post(gw, "/api/v1/videos/generations", body, headers=sign(Account.create(), amount=800_000))
    assert status == 200 and out["billing"]["usd"] == 0.8 and len(facilitator.settled) == 1


async def test_media_free_tier_uses_the_daily_allowance(start_gateway, tmp_path):
    models = {"image": [{**MEDIA["image"][1], "free_tier": {"max_n": 1}}]}
    gw = await start_gateway({"models": models, "media": {"artifacts": {"dir": str(tmp_path)}},
                              "free": {"daily_allowance_usd": 0.02}})
    key, account = await gw.key(1)
    status, body, _ = await post(gw, "/api/v1/images/generations", {"model": "demo/image-basic", "prompt": "a"}, key)
    assert status == 200 and body["billing"]["usd"] == 0 and body["billing"]["note"].startswith("free:")
    status, body, _ = await post(gw, "/api/v1/images/generations",
                                 {"model": "demo/image-basic", "prompt": "a", "n": 2}, key)       # outside the tier
    assert status == 200 and body["billing"]["usd"] == 0.01
    assert await gw.balance(account) == MICRO - 10_000 == await gw.ledger_sum(account)
