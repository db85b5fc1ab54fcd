"""Strict fake of the Gemini API's image and video generation (Nano Banana, Veo).

Images: `POST /v1beta/models/{model}:generateContent` on an image model answers one
inline PNG part per call. Reference images are inline parts: too many, an unsupported
MIME type, or bytes that are not the image they claim to be are refused. The request
body is checked with the chat fake's rules (tests/fakes/gemini.py) plus
`generationConfig.imageConfig` and `responseModalities`.

Videos: `POST /v1beta/models/{model}:predictLongRunning` starts an operation; each
`GET /v1beta/{operation name}` poll advances it (MediaReply.polls_before_done), and a
pending operation is just `{"name"}` (proto3 JSON leaves `done: false` out). The done
operation's video URI is a download on the API's own origin that needs the key, as
upstream's is. `generateAudio` is refused (a Vertex-only parameter), durations are 4, 6
or 8 seconds, and 1080p and 4k need 8 seconds. There is no cancel, as the Gemini API
documents none for these operations: `POST {name}:cancel` is an unknown method here.

Scripts (MediaReply): `fail="blocked:<REASON>"` blocks the prompt (promptFeedback),
another `fail` on an image is its finishReason (e.g. "IMAGE_SAFETY"); on a video,
`fail="filtered:<reason>"` is Veo's RAI filter and another `fail` an operation error.
`result_origin` puts video URIs on another origin (a CDN, no key); `redirect_downloads`
makes the API's download answer a redirect to that origin instead.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from aiohttp import web

from .gemini import (  # the chat fake's checks and error shape
    GENERATION_KEYS,
    PROTO,
    TOP_KEYS,
    check_auth,
    check_contents,
    check_generation_config,
    check_keys,
    error_body,
    error_response,
    field_violation,
    invalid_value,
    need_list,
    need_object,
    unknown_name,
)
from .media_script import FAILED, PENDING, SUCCEEDED, Job, MediaReply, MediaUpstream, base_url, png_base64, sniff_image
from .script import Invalid, RecordedRequest, json_response, new_id

# Image models: how many reference images each takes.
IMAGE_MODELS = {"gemini-3.1-flash-image": 14, "gemini-3-pro-image": 14}
ASPECT_RATIOS = ("1:1", "2:3", "3:2", "3:4", "4:3", "4:5", "5:4", "9:16", "16:9", "21:9")
IMAGE_SIZES = ("1K", "2K", "4K")  # upper-case K: "1k" is refused
MODALITIES = ("TEXT", "IMAGE")
INPUT_IMAGE_TYPES = ("image/png", "image/jpeg", "image/webp", "image/heic", "image/heif")

# Veo models: the resolutions each renders.
VIDEO_MODELS = {
    "veo-3.1-generate-001": ("720p", "1080p", "4k"),
    "veo-3.1-fast-generate-001": ("720p", "1080p", "4k"),
    "veo-3.1-lite-generate-001": ("720p", "1080p"),
}
DURATIONS = (4, 6, 8)
VIDEO_ASPECT_RATIOS = ("16:9", "9:16")
INSTANCE_KEYS = {"prompt", "image", "lastFrame", "referenceImages", "video"}
PARAMETER_KEYS = {"aspectRatio", "durationSeconds", "resolution", "negativePrompt", "personGeneration", "sampleCount"}
VERTEX_ONLY = {"generateAudio", "fps", "seed", "outputGcsUri", "compressionQuality"}
FRAME_TYPES = ("image/png", "image/jpeg")
CLIP = (Path(__file__).resolve().parents[2] / "providers" / "assets" / "demo-clip-0.mp4").read_bytes()
BLOCKED, FILTERED = "blocked:", "filtered:"


class FakeGeminiMedia(MediaUpstream):
    """Serves image generateContent, Veo's predictLongRunning, its operations and downloads."""

    def __init__(self, api_key: str = "gemini-test-key") -> None:
        super().__init__(api_key)
        self.redirect_downloads: str | None = None
        router = self.app.router
        router.add_post("/v1beta/models/{target}", self._models)
        router.add_get("/v1beta/models/{model}/operations/{id}", self._operation)
        router.add_get("/v1beta/files/{target}", self._download)
        router.add_route("*", "/{tail:.*}", self._unknown_route)

    # ---- handlers

    async def _models(self, request: web.Request) -> web.Response:
        recorded = await self.record(request)
        model, _, method = request.match_info["target"].partition(":")
        try:
            check_auth(recorded, self.api_key)
            if method == "generateContent" and model in IMAGE_MODELS:
                body = checked_image_body(recorded, model)
            elif method == "predictLongRunning" and model in VIDEO_MODELS:
                body = checked_video_body(recorded, model)
            else:
                raise Invalid(f"models/{model} is not found for API version v1beta, or is not supported for "
                              f"{method}.", status=404)  # fmt: skip
        except Invalid as exc:
            return refuse(recorded, exc)
        reply = self.next_reply()
        if reply.error_status is not None:
            return json_response(error_body(reply.error_status, reply.fail or "fake upstream error"),
                                 status=reply.error_status)  # fmt: skip
        if method == "generateContent":
            if reply.hang:
                await self.hold()
            return json_response(image_answer(model, reply, body))
        job = self.new_job(new_id("", 12).lower(), reply, body, route=model)
        return json_response({"name": operation_name(job)})

    async def _operation(self, request: web.Request) -> web.Response:
        recorded = await self.record(request)
        try:
            check_auth(recorded, self.api_key)
            job = self.jobs.get(request.match_info["id"])
            if job is None or job.route != request.match_info["model"]:
                raise Invalid("Operation not found.", status=404)
        except Invalid as exc:
            return refuse(recorded, exc)
        progress = job.poll()
        if progress.phase == PENDING:
            return json_response({"name": operation_name(job)})
        return json_response(self.finished(request, job, progress.phase))

    async def _download(self, request: web.Request) -> web.Response:
        recorded = await self.record(request)
        file_id, _, method = request.match_info["target"].partition(":")
        try:
            check_auth(recorded, self.api_key)
            media = self.files.get(f"{file_id}.mp4")
            if method != "download" or media is None:
                raise Invalid(f"File files/{file_id} was not found.", status=404)
            if recorded.query.get("alt") != "media":
                raise Invalid("The download of a file needs alt=media.")
        except Invalid as exc:
            return refuse(recorded, exc)
        if self.redirect_downloads:
            raise web.HTTPFound(f"{self.redirect_downloads}/files/{media.name}")
        self.downloads.append(media.name)
        return web.Response(body=media.data, content_type=media.content_type)

    async def _serve_file(self, request: web.Request) -> web.Response:
        await self.record(request)  # the CDN: tests check that no key arrives here
        return await super()._serve_file(request)

    async def _unknown_route(self, request: web.Request) -> web.Response:
        recorded = await self.record(request)
        return refuse(recorded, Invalid(f"Method not found: {request.method} {request.path}", status=404))

    # ---- results

    def finished(self, request: web.Request, job: Job, phase: str) -> dict:
        done: dict[str, Any] = {"name": operation_name(job), "done": True}
        fail = job.reply.fail or ""
        if phase == FAILED and not fail.startswith(FILTERED):
            done["error"] = {"code": 13, "message": fail}
            return done
        answer: dict[str, Any] = {}
        if phase == SUCCEEDED:
            if not job.outputs:
                job.outputs = [self.add_file(f"{job.id}.mp4", CLIP, "video/mp4")]
            media = job.outputs[0]
            uri = (f"{self.result_origin}/files/{media.name}" if self.result_origin
                   else f"{base_url(request)}/v1beta/files/{job.id}:download?alt=media")  # fmt: skip
            answer["generatedSamples"] = [{"video": {"uri": uri}}]
        else:
            answer.update(raiMediaFilteredCount=1, raiMediaFilteredReasons=[fail.removeprefix(FILTERED)])
        done["response"] = {"@type": PROTO + "PredictLongRunningResponse", "generateVideoResponse": answer}
        return done


def operation_name(job: Job) -> str:
    return f"models/{job.route}/operations/{job.id}"


def refuse(recorded: RecordedRequest, exc: Invalid) -> web.Response:
    recorded.rejected = exc.message
    return error_response(exc)


def image_answer(model: str, reply: MediaReply, body: dict) -> dict:
    """One candidate: an inline PNG (with a line of text when TEXT was asked for too), or
    the scripted refusal."""
    usage = {"promptTokenCount": 12, "candidatesTokenCount": 1290, "totalTokenCount": 1302}
    answer: dict[str, Any] = {"usageMetadata": usage, "modelVersion": model, "responseId": new_id("", 22)}
    fail = reply.fail or ""
    if fail.startswith(BLOCKED):
        answer["promptFeedback"] = {"blockReason": fail.removeprefix(BLOCKED)}
        return answer
    if fail:
        answer["candidates"] = [{"finishReason": fail, "index": 0}]
        return answer
    modalities = body["generationConfig"]["responseModalities"]
    parts = [{"text": "Here is the image."}] if "TEXT" in modalities else []
    if "IMAGE" in modalities:
        parts += [{"inlineData": {"mimeType": "image/png", "data": png_base64()}}] * (1 if reply.images is None else reply.images)
    answer["candidates"] = [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}]
    return answer


# ---------------------------------------------------------------- image requests


def checked_image_body(recorded: RecordedRequest, model: str) -> dict:
    body = recorded.body
    if body is None:
        raise Invalid("Invalid JSON payload received. Unexpected token.")
    check_keys(body, TOP_KEYS, "")
    check_contents(body.get("contents"), model)
    images = [part["inlineData"] for content in body["contents"] for part in content["parts"] if "inlineData" in part]
    for index, blob in enumerate(images):
        check_input_image(blob["mimeType"], blob["data"], INPUT_IMAGE_TYPES, f"inline_data[{index}]")
    if len(images) > IMAGE_MODELS[model]:
        raise Invalid(f"Too many input images: {len(images)} given, {model} takes at most {IMAGE_MODELS[model]}.")
    config = need_object(body.get("generationConfig", {}), "", "generationConfig", PROTO + "GenerationConfig")
    check_keys(config, GENERATION_KEYS | {"imageConfig"}, "generation_config")
    check_generation_config({k: v for k, v in config.items() if k != "imageConfig"})
    modalities = need_list(config.get("responseModalities", ["TEXT", "IMAGE"]), "generation_config.response_modalities",
                           PROTO + "GenerationConfig.Modality")  # fmt: skip
    for index, modality in enumerate(modalities):
        if modality not in MODALITIES:
            raise invalid_value(f"generation_config.response_modalities[{index}]", PROTO + "GenerationConfig.Modality",
                                modality)  # fmt: skip
    config["responseModalities"] = modalities
    if "imageConfig" in config:
        check_image_config(config["imageConfig"])
    body["generationConfig"] = config
    return body


def check_image_config(value: Any) -> None:
    at = "generation_config.image_config"
    image_config = need_object(value, "generation_config", "imageConfig", PROTO + "ImageConfig")
    check_keys(image_config, {"aspectRatio", "imageSize"}, at)
    if "aspectRatio" in image_config and image_config["aspectRatio"] not in ASPECT_RATIOS:
        raise field_violation(f"{at}.aspect_ratio", f"aspect ratio {image_config['aspectRatio']!r} is not supported; "
                                                    f"use one of {', '.join(ASPECT_RATIOS)}")  # fmt: skip
    if "imageSize" in image_config and image_config["imageSize"] not in IMAGE_SIZES:
        raise field_violation(f"{at}.image_size", f"image size {image_config['imageSize']!r} is not supported; "
                                                  f"use one of {', '.join(IMAGE_SIZES)}")  # fmt: skip


def check_input_image(mime_type: str, data: str, allowed: tuple[str, ...], at: str) -> None:
    """A supported MIME type, and bytes that are that image (upstream cannot decode others)."""
    if mime_type not in allowed:
        raise Invalid(f"Unsupported MIME type: {mime_type}", param=at)
    raw = base64.b64decode(data + "=" * (-len(data) % 4), altchars=b"-_")
    if sniff_image(raw) != mime_type:
        raise Invalid("Unable to process input image. Please retry or report in "
                      "https://developers.generativeai.google/guide/troubleshooting", param=at)  # fmt: skip


# ---------------------------------------------------------------- video requests


def checked_video_body(recorded: RecordedRequest, model: str) -> dict:
    body = recorded.body
    if body is None:
        raise Invalid("Invalid JSON payload received. Unexpected token.")
    check_keys(body, {"instances", "parameters"}, "")
    instances = need_list(body.get("instances"), "instances", "google.protobuf.Value")
    if len(instances) != 1:
        raise Invalid("Exactly one instance is supported.", param="instances")
    instance = need_object(instances[0], "", "instances", "google.protobuf.Struct")
    for name in instance:
        if name not in INSTANCE_KEYS:
            raise Invalid(f"`{name}` isn't supported by this model. Please remove it or refer to the Gemini API "
                          "documentation for supported usage.", param=f"instances[0].{name}")  # fmt: skip
    if not isinstance(instance.get("prompt"), str) or not instance["prompt"].strip():
        raise Invalid("A text prompt is required.", param="instances[0].prompt")
    if "image" in instance:
        image = need_object(instance["image"], "instances[0]", "image", "google.protobuf.Struct")
        check_keys(image, {"bytesBase64Encoded", "mimeType"}, "instances[0].image")
        if not isinstance(image.get("bytesBase64Encoded"), str):
            raise Invalid("The image needs bytesBase64Encoded.", param="instances[0].image")
        check_input_image(image.get("mimeType"), image["bytesBase64Encoded"], FRAME_TYPES, "instances[0].image")
    check_parameters(need_object(body.get("parameters", {}), "", "parameters", "google.protobuf.Struct"), model)
    return body


def check_parameters(parameters: dict, model: str) -> None:
    for name in parameters:
        if name in VERTEX_ONLY:
            raise Invalid(f"`{name}` isn't supported by the Gemini API (it is a Vertex AI parameter).", param=name)
        if name not in PARAMETER_KEYS:
            raise unknown_name(name, "parameters")
    seconds = parameters.get("durationSeconds", 8)
    if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds not in DURATIONS:
        raise Invalid(f"Unsupported video duration {seconds!r} seconds; {model} renders "
                      f"{', '.join(map(str, DURATIONS))} seconds.", param="durationSeconds")  # fmt: skip
    resolution = parameters.get("resolution", "720p")
    if resolution not in VIDEO_MODELS[model]:
        raise Invalid(f"Unsupported resolution {resolution!r} for {model}.", param="resolution")
    if resolution != "720p" and seconds != 8:
        raise Invalid(f"{resolution} videos are 8 seconds long; {seconds} seconds was asked.", param="durationSeconds")
    if parameters.get("aspectRatio", "16:9") not in VIDEO_ASPECT_RATIOS:
        raise Invalid(f"Unsupported aspect ratio {parameters['aspectRatio']!r}.", param="aspectRatio")
    if parameters.get("sampleCount", 1) != 1:
        raise Invalid("sampleCount must be 1.", param="sampleCount")
