"""Strict fake of the OpenAI Images API for GPT image models.

`POST /v1/images/generations` takes JSON; `POST /v1/images/edits` takes
multipart/form-data with one `image` or repeated `image[]` file parts. Both
answer synchronously with base64 PNGs (GPT image models never return URLs,
and refuse `response_format`). Errors use OpenAI's error shape, shared with
the chat fake.
"""

from __future__ import annotations

import math
import re
import time
from email.message import Message
from email.parser import HeaderParser
from email.utils import collapse_rfc2231_value
from typing import Any, NamedTuple

from aiohttp import web

from .media_script import MediaReply, MediaUpstream, png_base64, sniff_image
from .openai_chat import (
    PARSE_ERROR,
    bad_value,
    check_auth,
    error_object,
    error_response,
    is_int,
    missing,
    request_id_header,
    scripted_error,
    wrong_type,
)
from .script import Invalid, RecordedRequest, Reply, json_response

COMMON_PARAMS = frozenset(
    """model prompt n size quality output_format output_compression background user
    partial_images stream safety_identifier""".split()
)
GENERATE_PARAMS = COMMON_PARAMS | {"moderation"}
FILE_FIELDS = ("image", "image[]", "mask")
EDIT_PARAMS = COMMON_PARAMS | {"input_fidelity", *FILE_FIELDS}
ENUMS = {
    "size": ("auto", "1024x1024", "1536x1024", "1024x1536"),
    "quality": ("low", "medium", "high", "auto"),
    "output_format": ("png", "jpeg", "webp"),
    "background": ("transparent", "opaque", "auto"),
    "moderation": ("low", "auto"),
    "input_fidelity": ("high", "low"),
}
INTEGER_RANGES = {"n": (1, 10), "output_compression": (0, 100), "partial_images": (0, 3)}
KNOWN_MODELS = ("gpt-image-1", "gpt-image-1-mini", "gpt-image-1.5", "gpt-image-2")
GPT_IMAGE_MODEL = re.compile(r"^(gpt-image-|chatgpt-image-)")
FREE_SIZE_MODEL = re.compile(r"^gpt-image-[2-9]")  # gpt-image-2 and later take any WxH in steps of 16
MAX_PROMPT = 32000
MAX_EDIT_IMAGES = 16
MAX_IMAGE_BYTES = 50 * 1024 * 1024
# Output tokens per image (gpt-image-1 price table); other sizes scale with the area.
OUTPUT_TOKENS = {
    "low": {"1024x1024": 272, "1024x1536": 408, "1536x1024": 400},
    "medium": {"1024x1024": 1056, "1024x1536": 1584, "1536x1024": 1568},
    "high": {"1024x1024": 4160, "1024x1536": 6240, "1536x1024": 6208},
}
INPUT_IMAGE_TOKENS = 194  # per edited input image; a fixed count keeps usage predictable
MODERATION_MESSAGE = (
    "Your request was rejected by the safety system. If you believe this is an error, "
    "contact us at help.openai.com and include the request ID in your message."
)
WRONG_CONTENT_TYPE = (
    "Invalid Content-Type header ({0}), expected multipart/form-data. (HINT: If you're using curl, "
    "you can pass -H 'Content-Type: multipart/form-data')"
)


class FormPart(NamedTuple):
    name: str
    filename: str | None  # None for a plain text field
    content_type: str | None
    data: bytes


class FakeOpenAIImages(MediaUpstream):
    """Serves generations and edits; any other path gets OpenAI's 404 body."""

    def __init__(self, api_key: str = "sk-test-upstream") -> None:
        super().__init__(api_key)
        self.app.router.add_post("/v1/images/generations", self._generations)
        self.app.router.add_post("/v1/images/edits", self._edits)
        self.app.router.add_route("*", "/{tail:.*}", self._unknown_route)

    def check_reply(self, reply: Any) -> None:
        super().check_reply(reply)
        if reply.video:
            raise ValueError("the OpenAI Images API returns images only; video=True is a scripting mistake")

    async def _generations(self, request: web.Request) -> web.Response:
        recorded = await self.record(request)
        try:
            check_auth(recorded.headers, self.api_key)
            if recorded.body is None:
                raise Invalid(PARSE_ERROR)
            params = checked_params(recorded.body, GENERATE_PARAMS)
        except Invalid as exc:
            return refuse(recorded, exc)
        return await self.answer(params, input_images=0)

    async def _edits(self, request: web.Request) -> web.Response:
        recorded = await self.record(request)
        try:
            check_auth(recorded.headers, self.api_key)
            parts = form_parts(request.headers.get("content-type", ""), await request.read())
            recorded.body = form_summary(parts)
            params, images = checked_edit(parts)
        except Invalid as exc:
            return refuse(recorded, exc)
        return await self.answer(params, input_images=len(images))

    async def _unknown_route(self, request: web.Request) -> web.Response:
        recorded = await self.record(request)
        return refuse(recorded, Invalid(f"Invalid URL ({request.method} {request.path})", status=404))

    async def answer(self, params: dict, input_images: int) -> web.Response:
        """The scripted outcome for a request that passed validation."""
        reply = self.next_reply()
        if reply.hang:
            await self.hold()
            return web.Response(status=503, text="server shutting down")
        if reply.fail == "moderation":
            body = {"error": error_object(MODERATION_MESSAGE, "image_generation_user_error", "", "moderation_blocked")}
            return json_response(body, status=reply.error_status or 400, headers=request_id_header())
        if reply.error_status is not None or reply.fail is not None:
            message = reply.fail or "fake upstream error"
            return scripted_error(Reply(error_status=reply.error_status or 500, error_message=message))
        return json_response(images_response(params, reply, input_images), headers=request_id_header())


def refuse(recorded: RecordedRequest, exc: Invalid) -> web.Response:
    recorded.rejected = exc.message
    return error_response(exc)


# ---------------------------------------------------------------- responses


def images_response(params: dict, reply: MediaReply, input_images: int) -> dict:
    """b64_json only, one entry per image, with the settings actually used and token usage."""
    count = reply.images if reply.images is not None else params.get("n", 1)
    quality = resolved(params, "quality", "high")
    size = resolved(params, "size", "1024x1024")
    return {
        "created": int(time.time()),
        "background": resolved(params, "background", "opaque"),
        "output_format": params.get("output_format", "png"),
        "quality": quality,
        "size": size,
        "data": [{"b64_json": png_base64()} for _ in range(count)],
        "usage": usage(params["prompt"], count, quality, size, input_images),
    }


def resolved(params: dict, name: str, auto: str) -> str:
    value = params.get(name, "auto")
    return auto if value == "auto" else value


def usage(prompt: str, count: int, quality: str, size: str, input_images: int) -> dict:
    text_tokens = max(1, math.ceil(len(prompt) / 4))
    image_tokens = INPUT_IMAGE_TOKENS * input_images
    output = output_tokens(quality, size) * count
    return {
        "input_tokens": text_tokens + image_tokens,
        "input_tokens_details": {"text_tokens": text_tokens, "image_tokens": image_tokens},
        "output_tokens": output,
        "output_tokens_details": {"image_tokens": output, "text_tokens": 0},
        "total_tokens": text_tokens + image_tokens + output,
    }


def output_tokens(quality: str, size: str) -> int:
    table = OUTPUT_TOKENS[quality]
    if size in table:
        return table[size]
    width, height = (int(side) for side in size.split("x"))
    return round(table["1024x1024"] * width * height / (1024 * 1024))


# ---------------------------------------------------------------- validation


def checked_params(body: dict, allowed: frozenset[str]) -> dict:
    """Parameters the endpoint knows, with the right types and values; null means unset."""
    for name in body:
        if name not in allowed:  # includes response_format: GPT image models always answer b64_json
            raise Invalid(f"Unknown parameter: '{name}'.", param=name, code="unknown_parameter")
    params = {name: value for name, value in body.items() if value is not None}
    check_model(params)
    check_prompt(params)
    for name, (low, high) in INTEGER_RANGES.items():
        if name in params:
            check_range(name, params[name], low, high)
    for name, values in ENUMS.items():
        if name in params and not (name == "size" and free_size(params)):
            check_enum(name, params[name], values)
    for name in ("user", "safety_identifier"):
        if name in params and not isinstance(params[name], str):
            raise wrong_type(name, "a string", params[name])
    if params.get("stream") is not None and not isinstance(params["stream"], bool):
        raise wrong_type("stream", "a boolean", params["stream"])
    if params.get("stream"):
        raise Invalid("The fake upstream does not stream images; send stream=false.", param="stream")
    return params


def check_model(params: dict) -> None:
    if "model" not in params:
        raise missing("model")
    model = params["model"]
    if not isinstance(model, str):
        raise wrong_type("model", "a string", model)
    if model.startswith("dall-e"):
        raise Invalid("The fake upstream serves GPT image models only.", param="model", code="invalid_value")
    if not GPT_IMAGE_MODEL.match(model):
        raise bad_value("model", model, KNOWN_MODELS)


def check_prompt(params: dict) -> None:
    if "prompt" not in params:
        raise missing("prompt")
    prompt = params["prompt"]
    if not isinstance(prompt, str):
        raise wrong_type("prompt", "a string", prompt)
    if not prompt:
        raise Invalid(
            "Invalid 'prompt': empty string. Expected a string with minimum length 1, but got an empty string instead.",
            param="prompt",
            code="empty_string",
        )
    if len(prompt) > MAX_PROMPT:
        raise Invalid(
            f"Invalid 'prompt': string too long. Expected a string with maximum length {MAX_PROMPT}, "
            f"but got a string with length {len(prompt)} instead.",
            param="prompt",
            code="string_above_max_length",
        )


def check_range(name: str, value: Any, low: int, high: int) -> None:
    if not is_int(value):
        raise wrong_type(name, "an integer", value)
    if value < low:
        raise Invalid(
            f"Invalid '{name}': integer below minimum value. Expected a value >= {low}, but got {value} instead.",
            param=name,
            code="integer_below_min_value",
        )
    if value > high:
        raise Invalid(
            f"Invalid '{name}': integer above maximum value. Expected a value <= {high}, but got {value} instead.",
            param=name,
            code="integer_above_max_value",
        )


def check_enum(name: str, value: Any, values: tuple[str, ...]) -> None:
    if not isinstance(value, str):
        raise wrong_type(name, "a string", value)
    if value not in values:
        raise bad_value(name, value, values)


def free_size(params: dict) -> bool:
    """gpt-image-2 and later accept any WxH with both sides divisible by 16."""
    match = re.fullmatch(r"(\d+)x(\d+)", str(params.get("size", "")))
    return bool(
        match
        and FREE_SIZE_MODEL.match(str(params.get("model", "")))
        and all(int(side) > 0 and int(side) % 16 == 0 for side in match.groups())
    )


# ---- multipart edits


def form_parts(content_type: str, raw: bytes) -> list[FormPart]:
    """Split a multipart/form-data body; the edits endpoint takes nothing else."""
    header = Message()
    header["content-type"] = content_type
    boundary = header.get_param("boundary")
    if header.get_content_type() != "multipart/form-data" or not boundary:
        raise Invalid(WRONG_CONTENT_TYPE.format(content_type.split(";")[0] or "none"))
    parts: list[FormPart] = []
    for chunk in raw.split(b"--" + str(boundary).encode())[1:]:
        if chunk.startswith(b"--"):
            break
        head, separator, data = chunk.removeprefix(b"\r\n").partition(b"\r\n\r\n")
        if not separator:
            raise Invalid("Could not parse multipart form.")
        part_headers = HeaderParser().parsestr(head.decode("utf-8", "replace"))
        name = part_headers.get_param("name", header="content-disposition")
        filename = part_headers.get_filename()
        parts.append(
            FormPart(
                collapse_rfc2231_value(name) if name else "",
                filename,
                part_headers.get_content_type() if part_headers["content-type"] else None,
                data.removesuffix(b"\r\n"),
            )
        )
    return parts


def form_summary(parts: list[FormPart]) -> dict:
    """What the request log keeps of a form: text fields as text, files as their description;
    a field sent several times (image[]) becomes a list."""
    summary: dict[str, Any] = {}
    for part in parts:
        value: Any = part.data.decode("utf-8", "replace")
        if part.filename is not None:
            value = {"filename": part.filename, "content_type": part.content_type, "size": len(part.data)}
        if part.name.endswith("[]"):
            summary.setdefault(part.name, []).append(value)
        else:
            summary[part.name] = value
    return summary


def checked_edit(parts: list[FormPart]) -> tuple[dict, list[bytes]]:
    """Text fields validated like the JSON endpoint (numbers arrive as text); image parts must
    be real PNG/JPEG/WEBP files."""
    files = [part for part in parts if part.name in FILE_FIELDS]
    fields = {part.name: part.data.decode("utf-8", "replace") for part in parts if part.name not in FILE_FIELDS}
    for name in ("n", "output_compression", "partial_images"):
        if name in fields:
            fields[name] = form_integer(name, fields[name])
    if "stream" in fields:
        fields["stream"] = fields["stream"].lower() == "true"
    params = checked_params(fields, EDIT_PARAMS)
    images = [part for part in files if part.name != "mask"]
    if not images:
        raise missing("image")
    if len(images) > MAX_EDIT_IMAGES:
        raise Invalid(
            f"Invalid 'image': too many images. Expected at most {MAX_EDIT_IMAGES}, but got {len(images)} instead.",
            param="image",
            code="array_above_max_length",
        )
    for index, part in enumerate(images, start=1):
        check_image_part(part, f"image {index}", ("image/png", "image/jpeg", "image/webp"))
    for part in files:
        if part.name == "mask":
            check_image_part(part, "mask", ("image/png",))
    return params, [part.data for part in images]


def form_integer(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise wrong_type(name, "an integer", text) from None


def check_image_part(part: FormPart, label: str, kinds: tuple[str, ...]) -> None:
    """Files only, judged by their bytes (a .png name on a text file is still refused)."""
    if part.filename is None:
        raise wrong_type(part.name, "a file", part.data.decode("utf-8", "replace"))
    if len(part.data) > MAX_IMAGE_BYTES:
        raise Invalid(f"Invalid image file: {label} is larger than 50 MB.", param=part.name, code="file_too_large")
    if sniff_image(part.data) not in kinds:
        raise Invalid(
            f"Invalid image file or mode for {label}, please check your image file.",
            param=part.name,
            code="invalid_image_file",
        )
