"""Google's image models (Nano Banana) and Veo on the Gemini API, against its strict fake:
every request as upstream takes it, prices charged exactly, refusals and failures free,
and the API key never sent anywhere but the API's origin."""
import base64

import openai
import pytest

from tests.conftest import DEMO_MODELS, MICRO, UPSTREAM_PRICES
from tests.fakes import FakeGemini, FakeGeminiMedia, MediaReply
from tests.fakes.gemini_media import CLIP
from tests.fakes.media_script import png_bytes
from tests.test_media_upstreams import download, post

KEY = "gemini-test-key"
PNG = png_bytes()
JPEG = b"\xff\xd8\xff\xe0" + b"\x00" * 60           # enough of a JPEG for a type check
RATIOS = ["21:9", "16:9", "3:2", "4:3", "5:4", "1:1", "4:5", "3:4", "2:3", "9:16"]
VEO_OPTIONS = {"duration_seconds": {"values": [4, 6, 8], "default": 8}, "aspect_ratio": ["16:9", "9:16"]}


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def veo(model_id: str, upstream: str, list_usd: float, multiplier_1080p: float, **extra) -> dict:
    """A Veo entry as the catalog writes it, with image_to_video as well."""
    return {"id": model_id, "provider": "gemini", "list_usd_per_second": list_usd,
            "upstream": {"text_to_video": upstream, "image_to_video": upstream},
            "upstream_fields": {"generate_audio": None},
            "options": {**VEO_OPTIONS, "resolution": {"values": ["720p", "1080p"], "default": "720p",
                                                      "price_multiplier": {"1080p": multiplier_1080p}}}, **extra}


@pytest.fixture
async def gem(aiohttp_server, start_gateway, tmp_path):
    fake = FakeGeminiMedia()
    fake.server = await aiohttp_server(fake.app)
    gw = await start_gateway({
        "providers": {"gemini": {"type": "gemini", "base_url": str(fake.server.make_url("")), "api_key": KEY,
                                 "poll_seconds": 0.01}},
        "models": {"image": [
            {"id": "gemini/nano-banana-2", "provider": "gemini", "max_references": 3, "list_usd_per_image": 0.045,
             "upstream": {"generate": "gemini-3.1-flash-image", "edit": "gemini-3.1-flash-image"},
             "options": {"aspect_ratio": RATIOS}},
            {"id": "gemini/nano-banana-pro", "provider": "gemini", "max_references": 14, "list_usd_per_image": 0.134,
             "upstream": {"generate": "gemini-3-pro-image", "edit": "gemini-3-pro-image"},
             "options": {"aspect_ratio": RATIOS, "resolution": {"values": ["1K", "2K"], "default": "1K"}}},
            # more references than the model takes, to meet upstream's own limit
            {"id": "gemini/too-many", "provider": "gemini", "max_references": 15, "list_usd_per_image": 0.1,
             "upstream": {"generate": "gemini-3-pro-image", "edit": "gemini-3-pro-image"}}],
            "video": [
            veo("gemini/veo-3.1-fast", "veo-3.1-fast-generate-001", 0.10, 1.2),
            veo("gemini/veo-3.1-lite", "veo-3.1-lite-generate-001", 0.05, 1.6, timeout_seconds=0.5),
            # what upstream refuses: a 5 s render, and a soundtrack switch
            {"id": "gemini/veo-5s", "provider": "gemini", "upstream": "veo-3.1-fast-generate-001",
             "list_usd_per_second": 0.1, "options": {"duration_seconds": {"values": [5, 8], "default": 8}}},
            {"id": "gemini/veo-audio", "provider": "gemini", "upstream": "veo-3.1-fast-generate-001",
             "list_usd_per_second": 0.1, "options": {"duration_seconds": {"values": [8], "default": 8},
                                                     "audio": {"default": True}}}]},
        "media": {"artifacts": {"dir": str(tmp_path / "art")}, "allow_private_urls": True}})
    key, account = await gw.key(10)
    return gw, key, account, fake


def calls(fake, suffix: str) -> list:
    return [r for r in fake.requests if r.path.endswith(suffix)]


async def unchanged(gw, account) -> bool:
    return await gw.balance(account) == 10 * MICRO == await gw.ledger_sum(account)


# ---- images

async def test_images_are_generated_one_call_each_and_charged_exactly(gem):
    gw, key, account, fake = gem
    client = gw.openai(key)
    resp = await client.images.generate(model="gemini/nano-banana-2", prompt="a lighthouse", n=2,
                                        extra_body={"aspect_ratio": "16:9"})
    assert [base64.b64decode(d.b64_json) for d in resp.data] == [PNG, PNG]
    sent = calls(fake, ":generateContent")
    assert len(sent) == 2 and all(r.rejected is None and r.headers["x-goog-api-key"] == KEY for r in sent)
    assert sent[0].path == "/v1beta/models/gemini-3.1-flash-image:generateContent"
    assert sent[0].body["contents"] == [{"role": "user", "parts": [{"text": "a lighthouse"}]}]
    assert sent[0].body["generationConfig"] == {"responseModalities": ["IMAGE"], "imageConfig": {"aspectRatio": "16:9"}}
    # list 0.045 x discount 0.5 = 0.0225 an image, x 2
    assert resp.model_extra["billing"]["usd"] == 0.045
    assert await gw.balance(account) == 10 * MICRO - 45_000


async def test_an_edit_sends_the_references_inline(gem):
    gw, key, account, fake = gem
    status, body = await post(gw, "/api/v1/images/generations",
                              {"model": "gemini/nano-banana-pro", "prompt": "make it dusk", "resolution": "2K",
                               "input_images": [data_url(PNG, "image/png"), data_url(JPEG, "image/jpeg")]}, key)
    assert status == 200 and body["billing"]["operation"] == "edit", body
    sent = calls(fake, "gemini-3-pro-image:generateContent")[-1]
    assert sent.rejected is None
    parts = sent.body["contents"][0]["parts"]
    assert parts[0] == {"text": "make it dusk"}
    assert [(p["inlineData"]["mimeType"], base64.b64decode(p["inlineData"]["data"])) for p in parts[1:]] == \
        [("image/png", PNG), ("image/jpeg", JPEG)]
    assert sent.body["generationConfig"]["imageConfig"] == {"imageSize": "2K"}
    assert await gw.balance(account) == 10 * MICRO - 67_000            # 0.134 x 0.5; 2K costs as 1K


@pytest.mark.parametrize("model,references,words", [
    ("gemini/nano-banana-2", [data_url(b"just words", "text/plain")], "Unsupported MIME type: text/plain"),
    ("gemini/nano-banana-2", [data_url(JPEG, "image/png")], "Unable to process input image"),
    ("gemini/too-many", [data_url(PNG, "image/png")] * 15, "Too many input images"),
])
async def test_references_upstream_refuses_are_a_free_400(gem, model, references, words):
    gw, key, account, fake = gem
    status, body = await post(gw, "/api/v1/images/generations",
                              {"model": model, "prompt": "x", "input_images": references}, key)
    assert status == 400 and words in body["error"]["message"], body
    assert calls(fake, ":generateContent")[-1].rejected
    assert await unchanged(gw, account)


@pytest.mark.parametrize("reply,reason", [
    (MediaReply(fail="blocked:PROHIBITED_CONTENT"), "prompt blocked: PROHIBITED_CONTENT"),
    (MediaReply(fail="IMAGE_SAFETY"), "IMAGE_SAFETY"),
])
async def test_a_refused_image_is_a_free_400(gem, reply, reason):
    gw, key, account, fake = gem
    fake.enqueue(reply)
    with pytest.raises(openai.BadRequestError) as info:
        await gw.openai(key).images.generate(model="gemini/nano-banana-2", prompt="something forbidden")
    assert info.value.code == "content_policy_violation" and reason in info.value.message
    assert await unchanged(gw, account)


async def test_images_made_before_a_refusal_are_delivered_and_only_they_are_charged(gem):
    gw, key, account, fake = gem
    fake.enqueue(MediaReply(), MediaReply(fail="IMAGE_SAFETY"))
    resp = await gw.openai(key).images.generate(model="gemini/nano-banana-2", prompt="two of them", n=2)
    assert len(resp.data) == 1 and resp.model_extra["billing"]["images"] == 1
    assert await gw.balance(account) == 10 * MICRO - 22_500


@pytest.mark.parametrize("reply,words", [
    (MediaReply(images=0), "answered without an image (STOP)"),
    (MediaReply(error_status=500), "failed with HTTP 500"),
    (MediaReply(error_status=429), "rate limiting"),
])
async def test_an_image_upstream_failure_is_free(gem, reply, words):
    gw, key, account, fake = gem
    fake.enqueue(reply)
    status, body = await post(gw, "/api/v1/images/generations", {"model": "gemini/nano-banana-2", "prompt": "x"}, key)
    assert status in (502, 429) and words in body["error"]["message"], body
    assert await unchanged(gw, account)


# ---- videos

async def test_text_to_video_polls_the_operation_and_downloads_with_the_key(gem):
    gw, key, account, fake = gem
    fake.enqueue(MediaReply(video=True, polls_before_done=3))
    status, body = await post(gw, "/api/v1/videos/generations",
                              {"model": "gemini/veo-3.1-fast", "prompt": "waves", "resolution": "1080p"}, key)
    assert status == 200 and body["status"] == "succeeded", body
    start = calls(fake, "veo-3.1-fast-generate-001:predictLongRunning")[-1]
    assert start.rejected is None and start.headers["x-goog-api-key"] == KEY
    assert start.body == {"instances": [{"prompt": "waves"}],
                          "parameters": {"durationSeconds": 8, "resolution": "1080p"}}
    polls = [r for r in fake.requests if "/operations/" in r.path]
    assert len(polls) == 4 and all(r.rejected is None for r in polls)
    fetched = calls(fake, ":download")
    assert len(fetched) == 1 and fetched[0].headers["x-goog-api-key"] == KEY
    assert (await download(gw, body["results"][0]["url"])) == (200, CLIP)
    # list 0.10/s x 8 s x 1080p 1.2 = 0.96 held; service half of it charged
    assert (body["billing"]["quote_usd"], body["billing"]["usd"]) == (0.96, 0.48)
    assert await gw.balance(account) == 10 * MICRO - 480_000


async def test_image_to_video_sends_the_start_frame_inline(gem):
    gw, key, account, fake = gem
    fake.enqueue(MediaReply(video=True))
    status, body = await post(gw, "/api/v1/videos/generations",
                              {"model": "gemini/veo-3.1-lite", "prompt": "the sail fills", "duration_seconds": 4,
                               "aspect_ratio": "9:16", "image_url": data_url(PNG, "image/png")}, key)
    assert status == 200 and body["billing"]["operation"] == "image_to_video", body
    start = calls(fake, "veo-3.1-lite-generate-001:predictLongRunning")[-1]
    assert start.rejected is None
    assert start.body["instances"] == [{"prompt": "the sail fills", "image": {
        "bytesBase64Encoded": base64.b64encode(PNG).decode(), "mimeType": "image/png"}}]
    assert start.body["parameters"] == {"durationSeconds": 4, "aspectRatio": "9:16"}
    assert await gw.balance(account) == 10 * MICRO - 100_000          # 0.05/s x 0.5 x 4 s


@pytest.mark.parametrize("request_body,words", [
    ({"model": "gemini/veo-5s", "duration_seconds": 5}, "Unsupported video duration 5"),
    ({"model": "gemini/veo-audio"}, "`generateAudio` isn't supported by the Gemini API"),
    ({"model": "gemini/veo-3.1-fast", "duration_seconds": 4, "resolution": "1080p"}, "1080p videos are 8 seconds"),
])
async def test_settings_upstream_refuses_are_a_free_400(gem, request_body, words):
    gw, key, account, fake = gem
    status, body = await post(gw, "/api/v1/videos/generations", {"prompt": "x", **request_body}, key)
    assert status == 400 and words in body["error"]["message"], body
    assert calls(fake, ":predictLongRunning")[-1].rejected
    assert await unchanged(gw, account)


@pytest.mark.parametrize("reply,status,words", [
    (MediaReply(video=True, fail="Video generation failed due to an internal error."), 502,
     "render failed: Video generation failed"),
    (MediaReply(video=True, fail="filtered:The prompt could not be submitted."), 400,
     "refused to render this (The prompt could not be submitted.)"),
    (MediaReply(video=True, error_status=503), 502, "failed with HTTP 503"),
])
async def test_a_failed_or_filtered_render_is_free(gem, reply, status, words):
    gw, key, account, fake = gem
    fake.enqueue(reply)
    got, body = await post(gw, "/api/v1/videos/generations", {"model": "gemini/veo-3.1-fast", "prompt": "x"}, key)
    assert got == status and words in body["error"]["message"], body
    assert await unchanged(gw, account)


async def test_a_render_past_its_deadline_is_abandoned_without_a_cancel_call(gem):
    gw, key, account, fake = gem
    fake.enqueue(MediaReply(video=True, hang=True))
    status, body = await post(gw, "/api/v1/videos/generations", {"model": "gemini/veo-3.1-lite", "prompt": "x"}, key)
    assert status == 502 and "did not finish the render within 0.5 s; nothing was charged" in body["error"]["message"]
    assert not [r for r in fake.requests if "cancel" in r.path]       # the Gemini API documents no cancel
    assert await unchanged(gw, account)


# ---- the key stays on the API's origin

@pytest.mark.parametrize("how", ["result_origin", "redirect_downloads"])
async def test_a_video_on_another_host_is_fetched_without_the_key(gem, how):
    gw, key, account, fake = gem
    setattr(fake, how, str(fake.server.make_url("")).replace("127.0.0.1", "localhost").rstrip("/"))
    fake.enqueue(MediaReply(video=True))
    status, body = await post(gw, "/api/v1/videos/generations", {"model": "gemini/veo-3.1-fast", "prompt": "x"}, key)
    assert status == 200, body
    cdn = calls(fake, ".mp4")
    assert len(cdn) == 1 and "x-goog-api-key" not in cdn[0].headers and "key" not in cdn[0].query
    assert cdn[0].headers["host"].startswith("localhost")
    assert (await download(gw, body["results"][0]["url"])) == (200, CLIP)
    assert all(r.headers.get("x-goog-api-key") == KEY for r in fake.requests if r not in cdn)


async def test_a_wrong_key_is_the_operators_problem_and_free(aiohttp_server, start_gateway, tmp_path):
    """Google answers a bad key with a 400; the client is not to blame (chat or media)."""
    media, chat = FakeGeminiMedia(), FakeGemini()
    for fake in (media, chat):
        fake.server = await aiohttp_server(fake.app)
    wrong = "AIzaWrongWrongWrongWrongWrong12345"
    gw = await start_gateway({
        "providers": {"gemini": {"type": "gemini", "base_url": str(media.server.make_url("")), "api_key": wrong},
                      "gemini-chat": {"type": "gemini", "base_url": str(chat.server.make_url("")), "api_key": wrong}},
        "models": {"chat": DEMO_MODELS + [{"id": "gemini/flash", "provider": "gemini-chat",
                                           "upstream": "gemini-2.5-flash", **UPSTREAM_PRICES}],
                   "image": [{"id": "gemini/nano-banana-2", "provider": "gemini", "list_usd_per_image": 0.045,
                              "upstream": "gemini-3.1-flash-image"}]},
        "media": {"artifacts": {"dir": str(tmp_path / "art")}}})
    key, account = await gw.key(10)
    status, body = await post(gw, "/api/v1/images/generations", {"model": "gemini/nano-banana-2", "prompt": "x"}, key)
    assert status == 502 and body["error"]["code"] == "upstream_auth" and "AIza" not in str(body), body
    with pytest.raises(openai.APIStatusError) as info:
        await gw.openai(key).chat.completions.create(model="gemini/flash", messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 502 and info.value.code == "upstream_auth"
    assert await unchanged(gw, account)
