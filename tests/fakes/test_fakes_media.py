"""Self-test of the media fakes: fal's queue, Replicate's predictions and the Gemini API's
image and Veo generation driven over raw HTTP as their REST docs describe, OpenAI Images
driven by the official SDK.

The flows below are the ones a gateway must follow (submit, poll the returned URLs,
fetch the result, download the files), so gateway tests built on these fakes mean
something.
"""

from __future__ import annotations

import base64
from typing import Any

import aiohttp
import openai
import pytest

from . import FakeFal, FakeGeminiMedia, FakeOpenAIImages, FakeReplicate, MediaReply
from .gemini_media import CLIP
from .media_script import PNG_MAGIC, png_base64, png_bytes

pytestmark = pytest.mark.asyncio

FAL_AUTH = {"Authorization": "Key fal-test-key"}
R8_AUTH = {"Authorization": "Bearer r8_test"}
GOOG_AUTH = {"x-goog-api-key": "gemini-test-key"}


@pytest.fixture
async def fal(aiohttp_server):
    fake = FakeFal()
    fake.server = await aiohttp_server(fake.app)
    return fake


@pytest.fixture
async def replicate(aiohttp_server):
    fake = FakeReplicate()
    fake.server = await aiohttp_server(fake.app)
    return fake


@pytest.fixture
async def gemini(aiohttp_server):
    fake = FakeGeminiMedia()
    fake.server = await aiohttp_server(fake.app)
    return fake


@pytest.fixture
async def images(aiohttp_server):
    fake = FakeOpenAIImages()
    fake.server = await aiohttp_server(fake.app)
    client = openai.AsyncOpenAI(base_url=str(fake.server.make_url("/v1")), api_key=fake.api_key, max_retries=0)
    yield fake, client
    await client.close()


async def call(method: str, url: Any, headers: dict[str, str] | None = None, **kw) -> tuple[int, Any, Any]:
    """One raw request -> (status, parsed JSON or bytes, headers)."""
    async with aiohttp.ClientSession() as session:
        async with session.request(method, str(url), headers=headers or {}, **kw) as response:
            body = await response.read()
            is_json = response.content_type.endswith("json")
            return response.status, (await response.json(content_type=None)) if is_json else body, response.headers


async def fal_submit(fake: FakeFal, endpoint: str = "fal-ai/flux/dev", body: dict | None = None) -> dict:
    url = fake.server.make_url(f"/{endpoint}")
    status, data, _ = await call("POST", url, FAL_AUTH, json=body or {"prompt": "a fox"})
    assert status == 200, data
    return data


async def fal_wait(submitted: dict, limit: int = 10) -> list[dict]:
    """Poll status_url until the job leaves the queue; every status seen, in order."""
    seen = []
    for _ in range(limit):
        _, data, _ = await call("GET", submitted["status_url"] + "?logs=1", FAL_AUTH)
        seen.append(data)
        if data["status"] not in ("IN_QUEUE", "IN_PROGRESS"):
            return seen
    return seen


# ---------------------------------------------------------------- fal


async def test_fal_image_flow_drops_subpath_and_serves_png(fal):
    fal.enqueue(MediaReply(polls_before_done=3))
    submitted = await fal_submit(fal, body={"prompt": "a fox", "num_images": 2})
    assert submitted["status"] == "IN_QUEUE" and submitted["queue_position"] == 0
    request_id = submitted["request_id"]
    assert submitted["status_url"].endswith(f"/fal-ai/flux/requests/{request_id}/status")
    assert submitted["response_url"].endswith(f"/fal-ai/flux/requests/{request_id}")
    assert submitted["cancel_url"].endswith(f"/fal-ai/flux/requests/{request_id}/cancel")

    seen = await fal_wait(submitted)
    assert [s["status"] for s in seen] == ["IN_QUEUE", "IN_QUEUE", "IN_PROGRESS", "COMPLETED"]
    assert [s.get("queue_position") for s in seen[:2]] == [1, 0]
    assert seen[2]["logs"] and seen[-1]["error"] is None and "metrics" in seen[-1]

    status, result, _ = await call("GET", submitted["response_url"], FAL_AUTH)
    assert status == 200
    assert len(result["images"]) == 2 and result["has_nsfw_concepts"] == [False, False]
    assert result["prompt"] == "a fox" and isinstance(result["seed"], int)
    image = result["images"][0]
    assert image["content_type"] == "image/png" and image["width"] > 0
    status, data, headers = await call("GET", image["url"])  # CDN files need no auth
    assert status == 200 and data.startswith(PNG_MAGIC) and headers["Content-Type"] == "image/png"
    assert fal.downloads == [image["url"].rsplit("/", 1)[1]]
    assert fal.requests[0].path == "/fal-ai/flux/dev"
    assert all(r.rejected is None for r in fal.requests)


async def test_fal_result_before_completion_is_refused(fal):
    submitted = await fal_submit(fal)
    status, data, _ = await call("GET", submitted["response_url"], FAL_AUTH)
    assert (status, data) == (400, {"detail": "Request is still in progress"})


async def test_fal_polling_with_the_subpath_is_not_found(fal):
    submitted = await fal_submit(fal)
    wrong = fal.server.make_url(f"/fal-ai/flux/dev/requests/{submitted['request_id']}/status")
    status, data, _ = await call("GET", wrong, FAL_AUTH)
    assert status == 404 and "detail" in data


async def test_fal_video_result(fal):
    fal.enqueue(MediaReply(video=True, polls_before_done=0))
    submitted = await fal_submit(fal, "fal-ai/veo3", {"prompt": "a falcon dives", "duration": "8s"})
    assert [s["status"] for s in await fal_wait(submitted)] == ["COMPLETED"]
    _, result, _ = await call("GET", submitted["response_url"], FAL_AUTH)
    video = result["video"]
    assert video["content_type"] == "video/mp4" and video["file_name"].endswith(".mp4")
    status, data, headers = await call("GET", video["url"])
    assert status == 200 and data[4:8] == b"ftyp" and headers["Content-Type"] == "video/mp4"
    assert len(data) == video["file_size"]


async def test_fal_auth_must_be_key_not_bearer(fal):
    url = fal.server.make_url("/fal-ai/flux/dev")
    status, data, _ = await call("POST", url, {"Authorization": "Bearer fal-test-key"}, json={"prompt": "x"})
    assert status == 401 and isinstance(data["detail"], str)
    status, _, _ = await call("POST", url, {}, json={"prompt": "x"})
    assert status == 401
    assert fal.requests[0].rejected and not fal.jobs


async def test_fal_failed_jobs(fal):
    fal.enqueue(MediaReply(fail="NSFW content detected"), MediaReply(fail="FAILED: out of memory"))
    first, second = await fal_submit(fal), await fal_submit(fal)
    done = (await fal_wait(first))[-1]
    assert done["status"] == "COMPLETED" and done["error"] == "NSFW content detected" and done["error_type"]
    status, data, _ = await call("GET", first["response_url"], FAL_AUTH)
    assert status >= 400 and data["detail"] == "NSFW content detected"
    failed = (await fal_wait(second))[-1]
    assert failed["status"] == "FAILED" and failed["error"] == "out of memory"


async def test_fal_cancel(fal):
    fal.enqueue(MediaReply(hang=True))
    submitted = await fal_submit(fal)
    assert [s["status"] for s in await fal_wait(submitted, limit=3)] == ["IN_PROGRESS"] * 3
    status, data, _ = await call("PUT", submitted["cancel_url"], FAL_AUTH)
    assert (status, data) == (202, {"status": "CANCELLATION_REQUESTED"})
    assert fal.cancelled == [submitted["request_id"]] and fal.requests[-1].path.endswith("/cancel")
    after = (await fal_wait(submitted))[-1]
    assert after["status"] == "COMPLETED" and after["error"]
    status, data, _ = await call("PUT", submitted["cancel_url"], FAL_AUTH)
    assert (status, data) == (400, {"status": "ALREADY_COMPLETED"})


async def test_fal_validation_and_scripted_errors(fal):
    url = fal.server.make_url("/fal-ai/flux/dev")
    status, data, _ = await call("POST", url, FAL_AUTH, json={"prompt": "x", "num_images": 5})
    assert status == 422 and data["detail"][0]["loc"] == ["body", "num_images"]
    status, data, _ = await call("POST", url, FAL_AUTH, json={"image_url": "ftp://host/a.png"})
    assert status == 422 and {tuple(e["loc"]) for e in data["detail"]} == {("body", "prompt"), ("body", "image_url")}
    ok_urls = {"prompt": "x", "image_urls": ["https://h/a.png", "data:image/png;base64,AAAA"]}
    assert (await call("POST", url, FAL_AUTH, json=ok_urls))[0] == 200
    status, data, _ = await call("POST", fal.server.make_url("/fal-ai/nope"), FAL_AUTH, json={"prompt": "x"})
    assert status == 404 and "not found" in data["detail"]
    fal.enqueue(MediaReply(error_status=429))
    status, data, headers = await call("POST", url, FAL_AUTH, json={"prompt": "x"})
    assert status == 429 and "detail" in data and headers["retry-after"] == "1"
    with pytest.raises(ValueError):
        fal.enqueue(MediaReply(polls_before_done=-1))


# ---------------------------------------------------------------- Replicate


async def replicate_create(fake: FakeReplicate, model: str, body: dict, headers: dict | None = None) -> tuple:
    url = fake.server.make_url(f"/v1/models/{model}/predictions")
    return await call("POST", url, {**R8_AUTH, **(headers or {})}, json=body)


async def test_replicate_image_flow(replicate):
    replicate.enqueue(MediaReply(polls_before_done=2))
    status, created, _ = await replicate_create(
        replicate, "black-forest-labs/flux-schnell", {"input": {"prompt": "a fox", "num_outputs": 2}}
    )
    assert status == 201 and created["status"] == "starting" and created["output"] is None
    assert created["version"] == "hidden" and created["model"] == "black-forest-labs/flux-schnell"
    assert created["urls"]["get"].startswith("http://") and created["urls"]["cancel"].endswith("/cancel")
    statuses = []
    for _ in range(5):
        _, prediction, _ = await call("GET", created["urls"]["get"], R8_AUTH)
        statuses.append(prediction["status"])
        if prediction["status"] == "succeeded":
            break
    assert statuses == ["starting", "processing", "succeeded"]
    assert prediction["created_at"] == created["created_at"] and prediction["completed_at"]
    assert len(prediction["output"]) == 2
    status, data, headers = await call("GET", prediction["output"][0])
    assert status == 200 and data.startswith(PNG_MAGIC) and headers["Content-Type"] == "image/png"


async def test_replicate_prefer_wait_and_video_output(replicate):
    replicate.enqueue(MediaReply(video=True, polls_before_done=0))
    status, prediction, _ = await replicate_create(
        replicate, "google/veo-3", {"input": {"prompt": "a falcon"}}, {"Prefer": "wait"}
    )
    assert status == 201 and prediction["status"] == "succeeded"
    assert isinstance(prediction["output"], str) and prediction["output"].endswith(".mp4")
    status, data, headers = await call("GET", prediction["output"])
    assert status == 200 and data[4:8] == b"ftyp" and headers["Content-Type"] == "video/mp4"


async def test_replicate_failed_and_canceled(replicate):
    replicate.enqueue(MediaReply(fail="CUDA out of memory", polls_before_done=0), MediaReply(hang=True))
    _, failed, _ = await replicate_create(replicate, "black-forest-labs/flux-dev", {"input": {"prompt": "x"}})
    _, polled, _ = await call("GET", failed["urls"]["get"], R8_AUTH)
    assert polled["status"] == "failed" and polled["error"] == "CUDA out of memory" and polled["output"] is None
    _, hanging, _ = await replicate_create(replicate, "black-forest-labs/flux-dev", {"input": {"prompt": "x"}})
    for _ in range(3):
        assert (await call("GET", hanging["urls"]["get"], R8_AUTH))[1]["status"] == "processing"
    status, canceled, _ = await call("POST", hanging["urls"]["cancel"], {"Authorization": "Token r8_test"})
    assert status == 200 and canceled["status"] == "canceled"
    assert (await call("GET", hanging["urls"]["get"], R8_AUTH))[1]["status"] == "canceled"


async def test_replicate_auth(replicate):
    no_key = {"Authorization": ""}
    status, data, _ = await replicate_create(replicate, "google/veo-3", {"input": {"prompt": "x"}}, no_key)
    assert status == 401 and data["title"] == "Unauthenticated" and data["status"] == 401
    assert set(data) >= {"type", "title", "status", "detail"}
    status, data, _ = await replicate_create(
        replicate, "google/veo-3", {"input": {"prompt": "x"}}, {"Authorization": "Bearer nope"}
    )
    assert status == 401 and "valid" in data["detail"]


async def test_replicate_validation(replicate):
    status, data, _ = await replicate_create(replicate, "google/veo-3", {"inptu": {"prompt": "x"}})
    assert status == 422
    assert {f["type"] for f in data["invalid_fields"]} == {"required", "additional_property_not_allowed"}
    assert "inptu" in data["detail"]
    status, data, _ = await replicate_create(replicate, "google/veo-3", {"input": {"aspect_ratio": "16:9"}})
    assert status == 422 and "prompt is required" in data["detail"]
    status, data, _ = await replicate_create(replicate, "nobody/nothing", {"input": {"prompt": "x"}})
    assert status == 404 and data["title"] == "Not found"
    hook = {"input": {"prompt": "x"}, "webhook": "https://gw.example/cb", "webhook_events_filter": ["completed"]}
    assert (await replicate_create(replicate, "google/veo-3", hook))[0] == 201
    assert replicate.requests[-1].body["webhook"] == "https://gw.example/cb"


# ---------------------------------------------------------------- OpenAI Images


def decoded(result) -> list[bytes]:
    return [base64.b64decode(item.b64_json) for item in result.data]


async def test_openai_generate_two_images(images):
    fake, client = images
    result = await client.images.generate(model="gpt-image-1", prompt="a red fox", n=2, size="1024x1024", quality="low")
    pictures = decoded(result)
    assert len(pictures) == 2 and all(p.startswith(PNG_MAGIC) for p in pictures)
    assert all(item.url is None for item in result.data)
    assert result.usage.output_tokens == 2 * 272 and result.quality == "low" and result.size == "1024x1024"
    assert fake.requests[0].body == {"model": "gpt-image-1", "prompt": "a red fox", "n": 2, "size": "1024x1024",
                                     "quality": "low"}


async def test_openai_edit_with_several_images(images):
    fake, client = images
    png = png_bytes()
    result = await client.images.edit(
        model="gpt-image-1",
        image=[("a.png", png, "image/png"), ("b.png", png, "image/png")],
        prompt="put them together",
        input_fidelity="high",
    )
    assert len(decoded(result)) == 1 and decoded(result)[0].startswith(PNG_MAGIC)
    body = fake.requests[0].body
    assert [f["filename"] for f in body["image[]"]] == ["a.png", "b.png"] and body["prompt"] == "put them together"
    assert result.usage.input_tokens_details.image_tokens > 0
    single = await client.images.edit(model="gpt-image-1", image=("a.png", png, "image/png"), prompt="x", n=3)
    assert len(single.data) == 3 and fake.requests[1].body["image"]["size"] == len(png)


async def test_openai_refusals(images):
    fake, client = images
    with pytest.raises(openai.BadRequestError) as info:
        await client.images.generate(model="gpt-image-1", prompt="x", response_format="b64_json")
    assert "Unknown parameter: 'response_format'." in str(info.value)
    with pytest.raises(openai.BadRequestError) as info:
        await client.images.edit(model="gpt-image-1", image=("a.png", b"not an image", "image/png"), prompt="x")
    assert "Invalid image file" in str(info.value)
    with pytest.raises(openai.BadRequestError):
        await client.images.generate(model="gpt-image-1", prompt="x", size="512x512")
    with pytest.raises(openai.BadRequestError):
        await client.images.generate(model="gpt-image-1", prompt="x", n=11)
    with pytest.raises(openai.BadRequestError):
        await client.images.generate(model="gpt-image-1", prompt="x", extra_body={"colour": "red"})
    assert all(r.rejected for r in fake.requests)
    assert (await client.images.generate(model="gpt-image-2", prompt="x", size="2048x1152")).size == "2048x1152"


async def test_openai_edits_refuse_json(images):
    fake, _ = images
    url = fake.server.make_url("/v1/images/edits")
    body = {"model": "gpt-image-1", "prompt": "x", "image": "data:image/png;base64,AAAA"}
    status, data, _ = await call("POST", url, {"Authorization": "Bearer sk-test-upstream"}, json=body)
    assert status == 400 and "multipart/form-data" in data["error"]["message"]


async def test_openai_scripted_errors_and_auth(images):
    fake, client = images
    fake.enqueue(MediaReply(fail="moderation"), MediaReply(error_status=429), MediaReply(images=3))
    with pytest.raises(openai.BadRequestError) as info:
        await client.images.generate(model="gpt-image-1", prompt="x")
    assert info.value.code == "moderation_blocked" and info.value.type == "image_generation_user_error"
    with pytest.raises(openai.RateLimitError):
        await client.images.generate(model="gpt-image-1", prompt="x")
    assert len((await client.images.generate(model="gpt-image-1", prompt="x")).data) == 3
    stranger = openai.AsyncOpenAI(base_url=str(fake.server.make_url("/v1")), api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        await stranger.images.generate(model="gpt-image-1", prompt="x")
    await stranger.close()
    with pytest.raises(ValueError):
        fake.enqueue(MediaReply(video=True))


async def test_openai_hang_times_out(images):
    fake, client = images
    fake.enqueue(MediaReply(hang=True))
    with pytest.raises(openai.APITimeoutError):
        await client.images.generate(model="gpt-image-1", prompt="x", timeout=0.3)


# ---------------------------------------------------------------- Gemini API (images, Veo)

IMAGE_BODY = {"contents": [{"role": "user", "parts": [{"text": "a fox"}]}],
              "generationConfig": {"responseModalities": ["IMAGE"], "imageConfig": {"aspectRatio": "16:9"}}}
VEO_BODY = {"instances": [{"prompt": "a falcon dives"}], "parameters": {"durationSeconds": 8, "resolution": "720p"}}


async def test_gemini_image_answers_an_inline_png(gemini):
    url = gemini.server.make_url("/v1beta/models/gemini-3-pro-image:generateContent")
    status, data, _ = await call("POST", url, GOOG_AUTH, json=IMAGE_BODY)
    assert status == 200, data
    parts = data["candidates"][0]["content"]["parts"]
    assert parts == [{"inlineData": {"mimeType": "image/png", "data": png_base64()}}]
    edit = {**IMAGE_BODY, "contents": [{"role": "user", "parts": [
        {"text": "bluer"}, {"inlineData": {"mimeType": "image/png", "data": png_base64()}}]}]}
    assert (await call("POST", url, GOOG_AUTH, json=edit))[0] == 200


@pytest.mark.parametrize("headers,status", [({}, 403), ({"x-goog-api-key": "wrong"}, 400),
                                            ({"Authorization": "Bearer gemini-test-key"}, 403)])
async def test_gemini_media_needs_its_key_header(gemini, headers, status):
    url = gemini.server.make_url("/v1beta/models/veo-3.1-fast-generate-001:predictLongRunning")
    got, data, _ = await call("POST", url, headers, json=VEO_BODY)
    assert got == status and data["error"]["code"] == status and not gemini.jobs


@pytest.mark.parametrize("change,words", [
    ({"generationConfig": {"imageConfig": {"aspect_ratio": "16:9"}}}, 'Unknown name "aspect_ratio"'),
    ({"generationConfig": {"imageConfig": {"imageSize": "1k"}}}, "image size '1k' is not supported"),
    ({"generationConfig": {"responseModalities": ["image"]}}, "response_modalities[0]"),
    ({"contents": [{"role": "user", "parts": [{"inlineData": {"mimeType": "image/gif", "data": png_base64()}}]}]},
     "Unsupported MIME type: image/gif"),
])
async def test_gemini_image_requests_are_checked(gemini, change, words):
    url = gemini.server.make_url("/v1beta/models/gemini-3.1-flash-image:generateContent")
    status, data, _ = await call("POST", url, GOOG_AUTH, json={**IMAGE_BODY, **change})
    assert status == 400 and words in data["error"]["message"], data


@pytest.mark.parametrize("parameters,words", [
    ({"durationSeconds": 5}, "Unsupported video duration 5"),
    ({"durationSeconds": "8"}, "Unsupported video duration '8'"),
    ({"generateAudio": True}, "`generateAudio` isn't supported by the Gemini API"),
    ({"duration_seconds": 8}, 'Unknown name "duration_seconds"'),
    ({"resolution": "4k"}, "Unsupported resolution '4k'"),
])
async def test_gemini_veo_parameters_are_checked(gemini, parameters, words):
    url = gemini.server.make_url("/v1beta/models/veo-3.1-lite-generate-001:predictLongRunning")
    status, data, _ = await call("POST", url, GOOG_AUTH, json={**VEO_BODY, "parameters": parameters})
    assert status == 400 and words in data["error"]["message"], data


async def test_gemini_veo_operation_then_download_with_the_key(gemini):
    gemini.enqueue(MediaReply(video=True, polls_before_done=2))
    url = gemini.server.make_url("/v1beta/models/veo-3.1-fast-generate-001:predictLongRunning")
    _, started, _ = await call("POST", url, GOOG_AUTH, json=VEO_BODY)
    name = started["name"]
    assert name.startswith("models/veo-3.1-fast-generate-001/operations/") and set(started) == {"name"}
    seen = [(await call("GET", gemini.server.make_url(f"/v1beta/{name}"), GOOG_AUTH))[1] for _ in range(3)]
    assert seen[:2] == [{"name": name}] * 2 and seen[2]["done"] is True
    uri = seen[2]["response"]["generateVideoResponse"]["generatedSamples"][0]["video"]["uri"]
    assert (await call("GET", uri))[0] == 403                               # the download needs the key
    status, data, headers = await call("GET", uri, GOOG_AUTH)
    assert status == 200 and data == CLIP and headers["Content-Type"] == "video/mp4"
    status, _, _ = await call("POST", gemini.server.make_url(f"/v1beta/{name}:cancel"), GOOG_AUTH)
    assert status == 404                                                    # no cancel on the Gemini API
