"""Media request bodies -> jobs, validated against what the model really offers.

Every value a model does not list is a 400 that names the option and the allowed values,
before any money is held or any upstream is called.
"""
from __future__ import annotations

from typing import Any

from plugins.formats.base import Fields
from providers.media_types import ImageJob, VideoJob

from .catalog import MediaModel

MAX_IMAGES = 10


def _urls(f: Fields, name: str) -> list[str]:
    urls = f.array(name)
    for i, u in enumerate(urls):
        if not isinstance(u, str) or not u.startswith(("https://", "http://", "data:")):
            raise f.fail(f"{name}[{i}]", "must be an https URL or a data: URL")
    return urls


def _url(f: Fields, name: str) -> str | None:
    url = f.string(name)
    if url is not None and not url.startswith(("https://", "http://", "data:")):
        raise f.fail(name, "must be an https URL or a data: URL")
    return url


def _choice(f: Fields, name: str, allowed: list[str], model: MediaModel) -> str | None:
    value = f.string(name)
    if value is None:
        return None
    if value not in allowed:
        offered = ", ".join(allowed) if allowed else "none (the model has no such option)"
        raise f.fail(name, f"{value!r} is not offered by {model.id}; allowed: {offered}")
    return value


def parse_common(body: Any) -> tuple[Fields, str, str]:
    f = Fields(body)
    return f, f.string("model", required=True), f.string("prompt", required=True)


def image_job(f: Fields, prompt: str, model: MediaModel) -> ImageJob:
    refs = _urls(f, "input_images")
    first = _url(f, "image_url")
    if first:
        refs = [first, *refs]
    operation = "edit" if refs else "generate"
    if operation not in model.upstream:
        raise f.fail("image_url" if first else "input_images",
                     f"{model.id} cannot edit images (operations: {', '.join(model.operations)})")
    if len(refs) > model.max_references:
        raise f.fail("input_images", f"{model.id} takes at most {model.max_references} reference images")
    if f.get("response_format") not in (None, "url", "b64_json"):
        raise f.fail("response_format", "must be url or b64_json")
    return ImageJob(prompt=prompt, n=f.integer("n", default=1, minimum=1, maximum=MAX_IMAGES), operation=operation,
                    references=refs, aspect_ratio=_choice(f, "aspect_ratio", model.aspect_ratios, model),
                    quality=_choice(f, "quality", model.quality.values if model.quality else [], model),
                    resolution=_choice(f, "resolution", model.resolution.values if model.resolution else [], model),
                    size=f.string("size"))


def video_job(f: Fields, prompt: str, model: MediaModel) -> VideoJob:
    image_url, refs, video_url = _url(f, "image_url"), _urls(f, "input_images"), _url(f, "video_url")
    if f.get("quality") is not None:
        raise f.fail("quality", "quality picks a routing tier and is only for svc/smart")
    if video_url or len(refs) >= 2:
        operation = "reference_to_video"
    elif image_url or refs:
        if refs and not image_url:
            raise f.fail("input_images", "give two or more references, or one start frame as image_url")
        operation = "image_to_video"
    else:
        operation = "text_to_video"
    if operation not in model.upstream:
        raise f.fail("video_url" if video_url else "input_images" if refs else "image_url",
                     f"{model.id} has no {operation} (operations: {', '.join(model.operations)})")
    if video_url and model.reference_max_seconds is None:
        raise f.fail("video_url", f"{model.id} does not take a reference clip")
    if len(refs) > max(model.max_references, 0) and operation == "reference_to_video" and not video_url:
        raise f.fail("input_images", f"{model.id} takes at most {model.max_references} reference images")
    name = "seconds" if f.get("duration_seconds") is None else "duration_seconds"
    duration = f.number(name)            # a number, as every numeric field: "8" is refused like max_tokens: "8"
    if duration is None:
        duration = model.duration.default
    else:
        if not model.duration.allows(duration):
            raise f.fail("duration_seconds", f"{duration:g} is not offered by {model.id}; "
                                             f"allowed: {model.duration.describe()}")
    audio = f.get("audio")
    if audio is not None and not isinstance(audio, bool):
        raise f.fail("audio", "must be true or false")
    if audio and model.audio_default is None:
        raise f.fail("audio", f"{model.id} renders no soundtrack")
    return VideoJob(prompt=prompt, operation=operation, duration=duration, image_url=image_url, references=refs,
                    video_url=video_url,
                    resolution=_choice(f, "resolution", model.resolution.values if model.resolution else [], model),
                    aspect_ratio=_choice(f, "aspect_ratio", model.aspect_ratios, model),
                    audio=model.audio_default if audio is None and model.audio_default is not None else audio)

