"""Media against strict fake fal, Replicate and OpenAI Images upstreams: every operation,
results copied into artifacts, failures and slow renders handled, nothing charged for a
render that did not happen."""
import base64

import aiohttp
import openai
import pytest

from tests.conftest import MICRO
from tests.fakes import FakeFal, FakeOpenAIImages, FakeReplicate, MediaReply

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY_PNG = "data:image/png;base64," + base64.b64encode(PNG_MAGIC + b"0" * 60).decode()


@pytest.fixture
async def ups(aiohttp_server, start_gateway, tmp_path):
    fal, rep, oai = FakeFal(), FakeReplicate(), FakeOpenAIImages()
    for fake in (fal, rep, oai):
        fake.server = await aiohttp_server(fake.app)
    gw = await start_gateway({
        "providers": {
            "fal": {"type": "fal", "base_url": str(fal.server.make_url("")), "api_key": "fal-test-key",
                    "poll_seconds": 0.01},
            "replicate": {"type": "replicate", "base_url": str(rep.server.make_url("")), "api_key": "r8_test",
                          "poll_seconds": 0.01},
            "oai": {"type": "openai", "base_url": str(oai.server.make_url("/v1")), "api_key": "sk-test-upstream"}},
        "models": {"image": [
            {"id": "fal/flux-dev", "provider": "fal", "upstream": "fal-ai/flux/dev", "list_usd_per_image": 0.05,
             "options": {"aspect_ratio": ["1:1", "16:9"]},
             "upstream_fields": {"aspect_ratio": "image_size"},
             "upstream_values": {"aspect_ratio": {"1:1": "square_hd", "16:9": "landscape_16_9"}}},
            {"id": "fal/nano-banana", "provider": "fal", "max_references": 3, "list_usd_per_image": 0.04,
             "upstream": {"generate": "fal-ai/nano-banana", "edit": "fal-ai/nano-banana/edit"},
             "upstream_fields": {"image_url": "image_urls"}},
            {"id": "replicate/flux-schnell", "provider": "replicate", "upstream": "black-forest-labs/flux-schnell",
             "list_usd_per_image": 0.006, "upstream_fields": {"image_url": "input_image"}},
            {"id": "openai/gpt-image-1", "provider": "oai", "max_references": 4, "list_usd_per_image": 0.04,
             "upstream": {"generate": "gpt-image-1", "edit": "gpt-image-1"},
             "options": {"quality": {"values": ["low", "medium", "high"], "default": "medium",
                                     "price_multiplier": {"low": 0.25, "high": 4}}}}],
            "video": [
            {"id": "fal/veo3", "provider": "fal", "upstream": "fal-ai/veo3", "list_usd_per_second": 0.40,
             "timeout_seconds": 0.5, "upstream_values": {"duration": {"8": "8s"}},
             "options": {"duration_seconds": {"values": [8], "default": 8},
                         "audio": {"default": True, "audio_off_price_multiplier": 0.5}}},
            {"id": "replicate/veo-3", "provider": "replicate", "upstream": "google/veo-3", "list_usd_per_second": 0.5,
             "options": {"duration_seconds": {"values": [8], "default": 8}}}]},
        "media": {"artifacts": {"dir": str(tmp_path / "art")}, "allow_private_urls": True}})
    key, account = await gw.key(10)
    return gw, key, account, fal, rep, oai


async def post(gw, path, body, key):
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{gw.url}{path}", json=body, headers={"Authorization": f"Bearer {key}"}) as r:
            return r.status, await r.json()


async def download(gw, url):
    path = "/api/v1/media/artifacts/" + url.rsplit("/api/v1/media/artifacts/", 1)[1]
    async with aiohttp.ClientSession() as s:
        async with s.get(gw.url + path) as r:
            return r.status, await r.read()


async def test_fal_images_in_batches_copied_into_artifacts(ups):
    gw, key, account, fal, _, _ = ups
    status, body = await post(gw, "/api/v1/images/generations",
                              {"model": "fal/flux-dev", "prompt": "a lighthouse", "n": 6, "aspect_ratio": "16:9"}, key)
    assert status == 200, body
    assert len(body["data"]) == 6 and all("url" in d for d in body["data"])
    for d in body["data"]:
        assert str(fal.server.make_url("")) not in d["url"]          # our link, not the upstream's
        status, data = await download(gw, d["url"])
        assert status == 200 and data.startswith(PNG_MAGIC)
    submits = [r.body for r in fal.requests if r.body is not None and "prompt" in (r.body or {})]
    assert [s["num_images"] for s in submits] == [4, 2]               # fal caps 4 a request
    assert all(s["image_size"] == "landscape_16_9" and "aspect_ratio" not in s for s in submits)
    assert body["billing"]["usd"] == 0.15 and await gw.balance(account) == 10 * MICRO - 150_000


async def test_fal_edit_sends_a_list_of_references(ups):
    gw, key, _, fal, _, _ = ups
    status, body = await post(gw, "/api/v1/images/generations",
                              {"model": "fal/nano-banana", "prompt": "bluer", "image_url": TINY_PNG}, key)
    assert status == 200 and body["billing"]["operation"] == "edit"
    submit = next(r for r in fal.requests if r.path.endswith("/nano-banana/edit"))
    assert submit.body["image_urls"] == [TINY_PNG] and "image_url" not in submit.body


async def test_fal_video_with_polling(ups):
    gw, key, account, fal, _, _ = ups
    fal.enqueue(MediaReply(video=True, polls_before_done=3))
    status, body = await post(gw, "/api/v1/videos/generations",
                              {"model": "fal/veo3", "prompt": "waves", "audio": False}, key)
    assert status == 200 and body["status"] == "succeeded", body
    status, clip = await download(gw, "/api/v1/media/artifacts/" + body["results"][0]["url"].rsplit("/", 1)[1])
    assert status == 200 and clip[4:8] == b"ftyp"
    submit = next(r for r in fal.requests if r.path == "/fal-ai/veo3")
    assert submit.body["duration"] == "8s" and submit.body["generate_audio"] is False
    # list 0.40/s x 8 s x audio off 0.5 = 1.60 held; service 0.80 charged
    assert (body["billing"]["quote_usd"], body["billing"]["usd"]) == (1.6, 0.8)
    assert await gw.balance(account) == 10 * MICRO - 800_000


@pytest.mark.parametrize("reply,words", [
    (MediaReply(video=True, fail="content policy violation"), "render failed: content policy violation"),
    (MediaReply(video=True, fail="FAILED: worker crashed"), "render failed"),
    (MediaReply(video=True, error_status=500), "failed with HTTP 500"),
])
async def test_failed_renders_are_502_and_free(ups, reply, words):
    gw, key, account, fal, _, _ = ups
    fal.enqueue(reply)
    status, body = await post(gw, "/api/v1/videos/generations", {"model": "fal/veo3", "prompt": "x"}, key)
    assert status == 502 and words in body["error"]["message"], body
    assert await gw.balance(account) == 10 * MICRO == await gw.ledger_sum(account)


async def test_a_render_slower_than_its_budget_is_cancelled_and_free(ups):
    gw, key, account, fal, _, _ = ups
    fal.enqueue(MediaReply(video=True, hang=True))
    status, body = await post(gw, "/api/v1/videos/generations", {"model": "fal/veo3", "prompt": "x"}, key)
    assert status == 502 and "did not finish the render within 0.5 s" in body["error"]["message"]
    assert len(fal.cancelled) == 1
    assert await gw.balance(account) == 10 * MICRO
    row = await gw.store.fetchone("SELECT outcome, usd_micro FROM usage")
    assert tuple(row) == ("failed", 0)


async def test_upstream_validation_error_is_a_400(ups):
    gw, key, account, fal, _, _ = ups
    fal.enqueue(MediaReply(error_status=422))
    status, body = await post(gw, "/api/v1/images/generations", {"model": "fal/flux-dev", "prompt": "x"}, key)
    assert status == 400 and "rejected the request" in body["error"]["message"]
    assert await gw.balance(account) == 10 * MICRO


async def test_replicate_images_and_video(ups):
    gw, key, account, _, rep, _ = ups
    status, body = await post(gw, "/api/v1/images/generations",
                              {"model": "replicate/flux-schnell", "prompt": "x", "n": 2}, key)
    assert status == 200 and len(body["data"]) == 2
    assert (await download(gw, body["data"][0]["url"]))[1].startswith(PNG_MAGIC)
    create = next(r for r in rep.requests if r.path.endswith("/predictions") and r.body)
    assert create.body["input"]["num_outputs"] == 2
    rep.enqueue(MediaReply(video=True, polls_before_done=2))
    status, body = await post(gw, "/api/v1/videos/generations", {"model": "replicate/veo-3", "prompt": "x"}, key)
    assert status == 200 and body["billing"]["usd"] == 2.0            # 0.25/s service x 8 s
    video_create = [r for r in rep.requests if r.path.endswith("veo-3/predictions")][-1]
    assert video_create.body["input"]["duration"] == 8               # Replicate wants a number
    rep.enqueue(MediaReply(video=True, fail="out of memory"))
    status, body = await post(gw, "/api/v1/videos/generations", {"model": "replicate/veo-3", "prompt": "x"}, key)
    assert status == 502 and "out of memory" in body["error"]["message"]


async def test_openai_images_generate_and_edit(ups):
    gw, key, account, _, _, oai = ups
    client = gw.openai(key)
    resp = await client.images.generate(model="openai/gpt-image-1", prompt="a fox", n=2, quality="low")
    assert len(resp.data) == 2 and base64.b64decode(resp.data[0].b64_json).startswith(PNG_MAGIC)
    assert resp.model_extra["billing"]["usd"] == 0.01                 # 0.02 x low 0.25 x 2
    status, body = await post(gw, "/api/v1/images/generations",
                              {"model": "openai/gpt-image-1", "prompt": "bluer",
                               "input_images": [TINY_PNG, TINY_PNG]}, key)
    assert status == 200 and body["billing"]["operation"] == "edit"
    edit = next(r for r in oai.requests if r.path.endswith("/images/edits"))
    assert edit.rejected is None
    oai.enqueue(MediaReply(fail="moderation"))
    with pytest.raises(openai.BadRequestError) as info:
        await client.images.generate(model="openai/gpt-image-1", prompt="bad")
    assert "safety system" in info.value.message


async def test_a_self_hosted_upstream_on_the_operators_network_works(aiohttp_server, start_gateway, tmp_path):
    """An http:// provider on the operator's own network: its result links (same origin as
    its configured base_url) are fetched as configured; a link elsewhere is the upstream's
    fault (502, uncharged), never the client's (400). Private addresses stay refused for
    URLs that clients send."""
    fal = FakeFal()
    fal.server = await aiohttp_server(fal.app)
    gw = await start_gateway({
        "providers": {"lan": {"type": "fal", "base_url": str(fal.server.make_url("")), "api_key": "fal-test-key",
                              "poll_seconds": 0.01}},
        "models": {"image": [{"id": "lan/flux", "provider": "lan",
                              "list_usd_per_image": 0.05, "max_references": 1,
                              "upstream": {"generate": "fal-ai/flux/dev", "edit": "fal-ai/flux/dev/edit"}}]},
        "media": {"artifacts": {"dir": str(tmp_path / "art")}}})
    key, account = await gw.key(10)
    status, body = await post(gw, "/api/v1/images/generations", {"model": "lan/flux", "prompt": "a barn"}, key)
    assert status == 200, body
    assert (await download(gw, body["data"][0]["url"]))[1].startswith(PNG_MAGIC)
    spent = 10 * MICRO - await gw.balance(account)
    fal.result_origin = "http://10.255.255.1:9"            # a link off the provider's origin, on a private address
    status, body = await post(gw, "/api/v1/images/generations", {"model": "lan/flux", "prompt": "a barn"}, key)
    assert status == 502 and body["error"]["param"] == "result", body
    assert await gw.balance(account) == 10 * MICRO - spent
    status, body = await post(gw, "/api/v1/images/generations", {"model": "lan/flux", "prompt": "a barn",
                                                                 "image_url": str(fal.server.make_url("/files/x"))}, key)
    assert status == 400 and body["error"]["param"] == "image_url"
