"""Replicate predictions: `POST /v1/models/{owner}/{name}/predictions {input}`, then poll
`urls.get` until succeeded, failed or canceled. `output` is a URL or a list of URLs.
Settings: api_key, base_url (default https://api.replicate.com), poll_seconds."""
from __future__ import annotations

from .base import UpstreamError
from .media_base import QueueProvider, job_input
from .media_types import ImageJob, MediaFile, VideoJob


class ReplicateProvider(QueueProvider):
    type_name = "replicate"
    default_base_url = "https://api.replicate.com"

    async def run(self, model_id: str, body: dict, timeout: float) -> list[str]:
        prediction = await self.call("POST", f"{self.base_url}/v1/models/{model_id}/predictions", {"input": body})
        urls = prediction.get("urls") or {}
        get_url = urls.get("get") or f"{self.base_url}/v1/predictions/{prediction.get('id')}"
        cancel_url = urls.get("cancel") or f"{get_url}/cancel"

        async def poll():
            current = await self.call("GET", get_url)
            state = current.get("status")
            if state in ("failed", "canceled"):
                raise UpstreamError(502, f"{self.name} render {state}: {current.get('error') or 'no detail'}",
                                    code="render_failed")
            if state not in ("starting", "processing", "succeeded"):
                raise ValueError(f"unknown prediction status {state!r}")
            return current if state == "succeeded" else None

        done = prediction if prediction.get("status") == "succeeded" else \
            await self.wait(poll, ("POST", cancel_url), timeout)
        output = done.get("output")
        urls_out = [output] if isinstance(output, str) else [u for u in output or [] if isinstance(u, str)]
        if not urls_out:
            raise UpstreamError(502, f"{self.name} finished without output", code="render_failed")
        return urls_out

    async def generate_images(self, job: ImageJob, model) -> list[MediaFile]:
        urls: list[str] = []
        for _ in range(job.n):             # models that make one image a prediction: ask again
            if len(urls) >= job.n:
                break
            body = job_input(job, model, duration_text=False)
            if "num_images" in body:
                body["num_outputs"] = job.n - len(urls)
                del body["num_images"]
            urls += await self.run(model.upstream[job.operation], body, model.timeout_seconds)
        return [MediaFile(url=u) for u in urls[:job.n]]

    async def render_video(self, job: VideoJob, model) -> MediaFile:
        urls = await self.run(model.upstream[job.operation], job_input(job, model, duration_text=False), model.timeout_seconds)
        return MediaFile(url=urls[0], content_type="video/mp4")
