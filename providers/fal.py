"""fal.ai queue: submit to `{base}/{app}`, poll the returned `status_url`, fetch the
`response_url` (both drop the app's subpath, so always use the URLs fal returns).
Auth is `Authorization: Key <FAL_KEY>`. Settings: api_key, base_url, poll_seconds."""
from __future__ import annotations

from .base import UpstreamError
from .media_base import QueueProvider, job_input
from .media_types import ImageJob, MediaFile, VideoJob

MAX_PER_REQUEST = 4      # most fal image apps return at most 4 images a request


class FalProvider(QueueProvider):
    type_name = "fal"
    default_base_url = "https://queue.fal.run"

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Key {self.api_key}"}

    async def run(self, app_id: str, body: dict, timeout: float) -> dict:
        job = await self.call("POST", f"{self.base_url}/{app_id}", body)
        status_url, response_url = job.get("status_url"), job.get("response_url")
        if not status_url or not response_url:
            raise UpstreamError(502, f"{self.name} accepted the job without status and response URLs")

        async def poll():
            status = await self.call("GET", status_url)
            state = status.get("status")
            if state == "COMPLETED" and status.get("error"):
                raise UpstreamError(502, f"{self.name} render failed: {status['error']}", code="render_failed")
            if state in ("FAILED", "CANCELED", "CANCELLED", "ERROR"):
                raise UpstreamError(502, f"{self.name} render failed: {status.get('error') or state}",
                                    code="render_failed")
            if state not in ("IN_QUEUE", "IN_PROGRESS", "COMPLETED"):
                raise ValueError(f"unknown job status {state!r}")
            return status if state == "COMPLETED" else None

        await self.wait(poll, ("PUT", job.get("cancel_url") or f"{response_url}/cancel"), timeout)
        return await self.call("GET", response_url)

    async def generate_images(self, job: ImageJob, model) -> list[MediaFile]:
        upstream = model.upstream[job.operation]
        files: list[MediaFile] = []
        counted = "num_images" in job_input(job, model, duration_text=True)
        for _ in range(job.n):             # fal caps images per request, some apps make one: ask again
            if len(files) >= job.n:
                break
            body = job_input(job, model, duration_text=True)
            if counted:
                body["num_images"] = min(job.n - len(files), MAX_PER_REQUEST)
            result = await self.run(upstream, body, model.timeout_seconds)
            files += [MediaFile(url=i.get("url"), content_type=i.get("content_type") or "image/png")
                      for i in result.get("images") or [] if i.get("url")]
        return files[:job.n]

    async def render_video(self, job: VideoJob, model) -> MediaFile:
        result = await self.run(model.upstream[job.operation], job_input(job, model, duration_text=True), model.timeout_seconds)
        video = result.get("video") or {}
        if not video.get("url"):
            raise UpstreamError(502, f"{self.name} finished without a video", code="render_failed")
        return MediaFile(url=video["url"], content_type=video.get("content_type") or "video/mp4")
