"""Images and Veo videos on Google's Gemini API, for the `gemini` provider.

Images: `POST /v1beta/models/{model}:generateContent` with the prompt, the reference
images as inline parts (an edit), and `generationConfig.imageConfig` (aspectRatio,
imageSize). An answer carries one image as an inline part, so n images are n calls.

Videos: `POST /v1beta/models/{model}:predictLongRunning` with one instance (the prompt,
and the start frame inline for image_to_video) and `parameters` (aspectRatio,
durationSeconds, resolution) starts an operation, polled at `GET /v1beta/{name}` until
`done`. The video's URI is on the API's origin and is downloaded with the key
(QueueProvider.result_file). The Gemini API documents no cancel for these operations:
a render past its deadline is abandoned, not cancelled, and none is recorded for
cancelling after a crash.

A refusal (a blocked prompt, a safety finish, Veo's RAI filter) is a 400 naming the
reason; like every upstream failure it is not charged.
"""
from __future__ import annotations

import base64
from typing import Any

from .base import UpstreamError
from .gemini import FINISH
from .media_base import job_input
from .media_types import ImageJob, MediaFile, VideoJob
from .types import CONTENT_FILTER

# The gateway's canonical input names -> the Gemini API's; None: not a config field
# (the prompt and references go into the contents or the instance). A model's
# `upstream_fields` and `upstream_values` in the catalog adjust these.
IMAGE_CONFIG = {"prompt": None, "num_images": None, "image_url": None, "image_urls": None,
                "aspect_ratio": "aspectRatio", "resolution": "imageSize"}
VIDEO_PARAMETERS = {"prompt": None, "image_url": None, "image_urls": None, "video_url": None,
                    "duration": "durationSeconds", "aspect_ratio": "aspectRatio", "resolution": "resolution",
                    "generate_audio": "generateAudio"}
REFUSED = "content_policy_violation"


def refusal(provider, reason: str) -> UpstreamError:
    return UpstreamError(400, f"{provider.name} refused to render this ({reason}); nothing was charged", code=REFUSED)


def inline(data: bytes, mime_type: str) -> dict[str, str]:
    return {"mimeType": mime_type, "data": base64.b64encode(data).decode()}


# ---- images --------------------------------------------------------------------------

def image_request(job: ImageJob, model) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"text": job.prompt}]
    parts += [{"inlineData": inline(data, mime)} for data, mime in job.reference_files]
    config: dict[str, Any] = {"responseModalities": ["IMAGE"]}
    image_config = job_input(job, model, duration_text=False, renames=IMAGE_CONFIG)
    if image_config:
        config["imageConfig"] = image_config
    return {"contents": [{"role": "user", "parts": parts}], "generationConfig": config}


def images_in(provider, answer: dict[str, Any]) -> list[MediaFile]:
    """The final images of a generateContent answer (thought parts hold drafts)."""
    blocked = (answer.get("promptFeedback") or {}).get("blockReason")
    if blocked:
        raise refusal(provider, f"prompt blocked: {blocked}")
    files, said, finish = [], [], None
    for candidate in answer["candidates"]:
        for part in (candidate.get("content") or {}).get("parts") or []:
            if part.get("thought"):
                continue
            if "inlineData" in part:
                data = base64.b64decode(part["inlineData"]["data"], validate=True)
                if not data:
                    raise ValueError("an empty image")
                files.append(MediaFile(data=data, content_type=part["inlineData"]["mimeType"]))
            elif "text" in part:
                said.append(part["text"])
        finish = candidate.get("finishReason") or finish
    if files:
        return files
    if FINISH.get(finish) == CONTENT_FILTER:
        raise refusal(provider, finish)
    words = f": {' '.join(said)[:300]}" if said else ""
    raise UpstreamError(502, f"{provider.name} answered without an image ({finish or 'no reason given'}){words}",
                        code="render_failed")


async def generate_images(provider, job: ImageJob, model) -> list[MediaFile]:
    url = f"{provider.base_url}/v1beta/models/{model.upstream[job.operation]}:generateContent"
    body = image_request(job, model)
    files: list[MediaFile] = []
    while len(files) < job.n:
        try:
            files += images_in(provider, await provider.call("POST", url, body, timeout=model.timeout_seconds))
        except UpstreamError as err:
            if err.code != REFUSED or not files:
                raise
            break                  # the images made before a refusal are delivered (and charged)
    return files[:job.n]


# ---- videos --------------------------------------------------------------------------

def video_request(job: VideoJob, model) -> dict[str, Any]:
    instance: dict[str, Any] = {"prompt": job.prompt}
    if job.image_file is not None:
        data, mime = job.image_file
        instance["image"] = {"bytesBase64Encoded": base64.b64encode(data).decode(), "mimeType": mime}
    return {"instances": [instance],
            "parameters": job_input(job, model, duration_text=False, renames=VIDEO_PARAMETERS)}


async def render_video(provider, job: VideoJob, model) -> MediaFile:
    if job.operation not in ("text_to_video", "image_to_video"):
        raise UpstreamError(400, f"{provider.name} renders text_to_video and image_to_video only",
                            code="upstream_rejected")
    upstream = model.upstream[job.operation]
    started = await provider.call("POST", f"{provider.base_url}/v1beta/models/{upstream}:predictLongRunning",
                                  video_request(job, model))
    name = started.get("name")
    if not isinstance(name, str) or not name:
        raise UpstreamError(502, f"{provider.name} started no operation; nothing was charged",
                            code="upstream_malformed")

    async def poll():
        operation = await provider.call("GET", f"{provider.base_url}/v1beta/{name}")
        return operation if operation.get("done") else None    # `done: false` is left out of the JSON

    done = await provider.wait(poll, None, model.timeout_seconds)
    if done.get("error") is not None:
        raise UpstreamError(502, f"{provider.name} render failed: {done['error'].get('message') or 'no detail'}",
                            code="render_failed")
    answer = done["response"]["generateVideoResponse"]
    samples = answer.get("generatedSamples") or []
    if not samples:
        if answer.get("raiMediaFilteredCount"):
            raise refusal(provider, "; ".join(answer.get("raiMediaFilteredReasons") or ["safety filter"]))
        raise UpstreamError(502, f"{provider.name} finished without a video", code="render_failed")
    return await provider.result_file(samples[0]["video"]["uri"], "video", "video/mp4")
