"""What media providers share: building the model input from a job, running a queued job
to completion (submit, poll with back-off until done, fail, or the deadline, then cancel
on timeout), and downloading results. fal, Replicate and Gemini's Veo differ only in URLs
and field names."""
from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from typing import Any, AsyncIterator, Awaitable, Callable
from urllib.parse import urljoin, urlsplit

import aiohttp
import orjson

from config.schema import Seconds

from .base import RemoteProvider, RemoteSettings, UpstreamError
from .guard import read_capped
from .media_types import ImageJob, MediaFile, VideoJob

MB = 1_000_000
MAX_RESULT_BYTES = {"image": 50 * MB, "video": 500 * MB}   # one rendered file
MAX_REDIRECTS = 3


def job_input(job: ImageJob | VideoJob, model, *, duration_text: bool,
              renames: dict[str, str | None] | None = None) -> dict[str, Any]:
    """The model's input from a job. Canonical names (prompt, num_images, image_url,
    image_urls, video_url, duration, aspect_ratio, resolution, quality, generate_audio) are
    adapted per model by the catalog: `upstream_fields` renames (null drops the field; a
    name ending in `_urls` always gets a list), `upstream_values` maps values (Veo's "8s",
    Ideogram's TURBO, size presets), and `upstream_input` adds fixed fields. `renames` are
    the provider's own names, which the catalog's override."""
    body: dict[str, Any] = {"prompt": job.prompt}
    if isinstance(job, ImageJob):
        body["num_images"] = job.n
        if job.references:
            body["image_url"] = job.references[0]
            if len(job.references) > 1:
                body["image_urls"] = job.references
        for name in ("aspect_ratio", "quality", "resolution"):
            if getattr(job, name):
                body[name] = getattr(job, name)
    else:
        seconds = int(job.duration) if float(job.duration).is_integer() else job.duration
        body["duration"] = str(seconds) if duration_text else seconds
        for name in ("image_url", "video_url", "aspect_ratio", "resolution"):
            if getattr(job, name):
                body[name] = getattr(job, name)
        if job.references:
            body["image_urls"] = job.references
        if job.audio is not None:
            body["generate_audio"] = job.audio
    out: dict[str, Any] = {}
    fields = {**(renames or {}), **model.upstream_fields}
    for name, value in body.items():
        target = fields.get(name, name)
        if target is None or (target in out and name == "image_url"):
            continue
        value = model.upstream_values.get(name, {}).get(str(value), value)
        out[target] = [value] if target.endswith("_urls") and isinstance(value, str) else value
    out.update(model.upstream_input)
    return out


# Set by the caller around a render: called with (provider, method, url) how to cancel the
# job once it is queued upstream, and with None once it ended, so that a process dying
# mid-render leaves a record another process can cancel (plugins/media/renders.py).
RENDER_TRACKER: contextvars.ContextVar[Callable[[dict | None], Awaitable[None]] | None] = \
    contextvars.ContextVar("render_tracker", default=None)


def origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or {"https": 443, "http": 80}.get(parts.scheme)


class QueueSettings(RemoteSettings):
    poll_seconds: Seconds = 1.0


class QueueProvider(RemoteProvider):
    """A provider whose jobs run on a queue the gateway polls.

    Credentials go only to the provider's configured origin (`base_url`). A URL the
    upstream hands back on another host (a status or result URL) is followed without
    credentials, through `foreign_http`: the session whose resolver refuses non-global
    addresses (set by the media plugin); without it such a URL is not followed at all."""
    Settings = QueueSettings

    def __init__(self, config, http):
        super().__init__(config, http)
        self.poll_seconds = self.settings.poll_seconds
        self.origins = {origin(self.base_url)}
        self.foreign_http: aiohttp.ClientSession | None = None

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def _session_for(self, url: str) -> tuple[aiohttp.ClientSession, dict[str, str]]:
        if origin(url) in self.origins:
            return self.http, self.auth()
        if self.foreign_http is None:
            raise UpstreamError(502, f"{self.name} pointed the gateway at another host; it was not followed")
        return self.foreign_http, {}

    @contextlib.asynccontextmanager
    async def _open(self, method: str, url: str, body: dict | None = None, *, extra: dict | None = None,
                    timeout: float | None = None) -> AsyncIterator[aiohttp.ClientResponse]:
        """One request, credentials only on the provider's origin. Redirects are not
        followed: a header such as an API key would go along to wherever they point."""
        session, auth = self._session_for(url)
        headers = {**auth, **(extra or {})}
        if body is not None:
            headers["Content-Type"] = "application/json"
        limit = self.limits.client_timeout()
        if timeout is not None:
            limit = aiohttp.ClientTimeout(total=min(timeout, self.limits.total), sock_connect=self.limits.connect)
        try:
            async with session.request(method, url, data=orjson.dumps(body) if body is not None else None,
                                       headers=headers, timeout=limit, allow_redirects=False) as resp:
                yield resp
        except asyncio.TimeoutError:
            raise UpstreamError(502, f"{self.name} did not answer in time", code="upstream_timeout") from None
        except aiohttp.ClientError as exc:
            raise UpstreamError(502, f"could not reach {self.name}: {exc.__class__.__name__}") from None

    async def call(self, method: str, url: str, body: dict | None = None, *, extra: dict | None = None,
                   timeout: float | None = None) -> dict:
        async with self._open(method, url, body, extra=extra, timeout=timeout) as resp:
            raw = await read_capped(self, resp)
            try:
                data = orjson.loads(raw) if raw else {}
            except orjson.JSONDecodeError:
                data = {}
            if resp.status >= 400:
                raise self.upstream_error(self.error_status(resp.status, data), self.error_text(data, raw),
                                          resp.headers.get("Retry-After"))
            if not isinstance(data, dict):
                raise UpstreamError(502, f"{self.name} answered with JSON that is not an object",
                                    code="upstream_malformed")
            return data

    async def result_file(self, url: str, kind: str, content_type: str) -> MediaFile:
        """A result link. On the provider's origin it is downloaded here, with the
        credentials, redirects followed by hand so the credentials stay on that origin;
        a link elsewhere is handed back for the media plugin to fetch without them."""
        for _ in range(MAX_REDIRECTS + 1):
            if origin(url) not in self.origins:
                return MediaFile(url=url, content_type=content_type)
            async with self._open("GET", url) as resp:
                if resp.status in (301, 302, 303, 307, 308) and resp.headers.get("Location"):
                    url = urljoin(url, resp.headers["Location"])
                    continue
                data = await read_capped(self, resp, MAX_RESULT_BYTES[kind])
                if resp.status != 200:
                    raise UpstreamError(502, f"{self.name} answered HTTP {resp.status} to the download of the "
                                             "result; nothing was charged", code="render_failed")
                sent = resp.content_type
                return MediaFile(data=data, content_type=sent if sent.startswith(kind + "/") else content_type)
        raise UpstreamError(502, f"{self.name} redirected the download of the result too often", code="render_failed")

    def error_text(self, data: Any, raw: bytes) -> str:
        if isinstance(data, dict):
            detail = data.get("detail") or data.get("error") or data.get("title")
            if isinstance(detail, dict) and isinstance(detail.get("message"), str):
                return detail["message"]          # Google's {"error": {"code", "message", "status"}}
            if detail:
                return detail if isinstance(detail, str) else orjson.dumps(detail).decode()[:300]
        return raw[:200].decode("utf-8", "replace") or "no detail"

    async def wait(self, poll, cancel: tuple[str, str] | None, timeout: float) -> dict:
        """Poll until `poll()` returns a finished job; cancel (method, URL) and fail at the
        deadline. The job is tracked while it runs (RENDER_TRACKER), when it can be
        cancelled: an upstream without a cancel call gets `cancel=None`."""
        track = RENDER_TRACKER.get() if cancel is not None else None
        if track is not None:
            await track({"provider": self.name, "method": cancel[0], "url": cancel[1]})
        try:
            return await self._poll_until_done(poll, cancel, timeout)
        finally:
            if track is not None:
                await asyncio.shield(track(None))

    async def cancel_job(self, method: str, url: str) -> None:
        """Ask the upstream to stop a render; failures are ignored (it may be over)."""
        try:
            await self.call(method, url)
        except UpstreamError:
            pass

    async def _poll_until_done(self, poll, cancel: tuple[str, str] | None, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        delay = self.poll_seconds
        while True:
            done = await poll()
            if done is not None:
                return done
            if time.monotonic() + delay > deadline:
                if cancel is not None:
                    await self.cancel_job(*cancel)
                raise UpstreamError(502, f"{self.name} did not finish the render within {timeout:g} s; "
                                         f"{'it was cancelled and ' if cancel else ''}nothing was charged",
                                    code="render_timeout")
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, max(self.poll_seconds, 5.0))

    async def generate_images(self, job: ImageJob, model) -> list[MediaFile]:
        raise NotImplementedError

    async def render_video(self, job: VideoJob, model) -> MediaFile:
        raise NotImplementedError
