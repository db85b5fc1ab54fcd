"""OpenAI Images for the `openai` provider: generations (JSON) and edits (multipart,
references as `image[]` files). GPT image models always answer base64 PNGs."""
from __future__ import annotations

import base64

import aiohttp
import orjson

from .base import UpstreamError
from .guard import read_capped
from .media_types import ImageJob, MediaFile

SIZES = {"1:1": "1024x1024", "3:2": "1536x1024", "2:3": "1024x1536", "16:9": "1536x1024", "9:16": "1024x1536",
         "4:3": "1536x1024", "3:4": "1024x1536"}


async def generate_images(provider, job: ImageJob, model) -> list[MediaFile]:
    upstream = model.upstream[job.operation]
    fields = {"model": upstream, "prompt": job.prompt, "n": str(job.n)}
    if job.aspect_ratio in SIZES:
        fields["size"] = SIZES[job.aspect_ratio]
    if job.quality:
        fields["quality"] = job.quality
    timeout = aiohttp.ClientTimeout(total=min(model.timeout_seconds, provider.limits.total),
                                    sock_connect=provider.limits.connect)
    headers = provider.headers()
    if job.operation == "edit":
        form = aiohttp.FormData()
        for name, value in fields.items():
            form.add_field(name, value)
        for i, (data, content_type) in enumerate(job.reference_files):
            form.add_field("image[]", data, filename=f"image-{i}.{content_type.rsplit('/', 1)[-1]}",
                           content_type=content_type)
        request = provider.http.post(f"{provider.base_url}/images/edits", data=form, headers=headers,
                                     timeout=timeout)
    else:
        body = {**fields, "n": job.n, "output_format": "png"}
        request = provider.http.post(f"{provider.base_url}/images/generations", data=orjson.dumps(body),
                                     headers={**headers, "Content-Type": "application/json"}, timeout=timeout)
    try:
        async with request as resp:
            raw = await read_capped(provider, resp)
            if resp.status != 200:
                raise provider._error(resp, raw)
    except (aiohttp.ClientError, TimeoutError):
        raise UpstreamError(502, f"could not reach {provider.name} for images") from None
    try:
        data = orjson.loads(raw).get("data") or []
    except orjson.JSONDecodeError:
        raise UpstreamError(502, f"{provider.name} answered with a body that is not JSON") from None
    return [MediaFile(data=base64.b64decode(d["b64_json"]), content_type="image/png") for d in data if d.get("b64_json")]
