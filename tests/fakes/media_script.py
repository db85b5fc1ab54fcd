"""Scripted media jobs and the plumbing the image and video fakes share.

A test describes *how a generation job goes* once, as a provider-neutral
`MediaReply`; each fake renders it in its own wire format (fal's queue,
Replicate's predictions, OpenAI's synchronous Images API). What must behave
the same across those fakes lives here: the result bytes, the file server the
result URLs point at, job ids, and how status polls advance a job.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
import struct
import uuid
import zlib
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, NamedTuple

from aiohttp import web

from .script import FakeUpstream


@dataclass
class MediaReply:
    images: int | None = None  # images to return; None = as many as the request asked for
    video: bool = False  # return a video result instead of images
    fail: str | None = None  # the job fails with this message (see each fake for the rendering)
    error_status: int | None = None  # answer the SUBMIT with the provider's error body at this status
    polls_before_done: int = 1  # status polls that still report "in progress" before completion
    hang: bool = False  # never complete, to test the gateway's timeouts


# ---------------------------------------------------------------- result bytes

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
IMAGE_SIZE = 8  # side of the square PNG every fake returns; responses report this size


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


@lru_cache(maxsize=None)
def png_bytes(width: int = IMAGE_SIZE, height: int = IMAGE_SIZE) -> bytes:
    """A valid RGB PNG with a fixed gradient, so results are real images and byte-identical."""
    rows = b"".join(
        b"\x00" + bytes(channel for x in range(width) for channel in (x * 32 % 256, y * 32 % 256, 128))
        for y in range(height)
    )
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit truecolour
    return (
        PNG_MAGIC
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", zlib.compress(rows, 9))
        + _png_chunk(b"IEND", b"")
    )


@lru_cache(maxsize=None)
def mp4_bytes() -> bytes:
    """An `ftyp` box then a small `mdat`: enough for sniffers and players' type checks."""
    ftyp = struct.pack(">I", 24) + b"ftyp" + b"isom" + struct.pack(">I", 512) + b"isom" + b"mp41"
    payload = b"fake video frames " * 4
    return ftyp + struct.pack(">I", 8 + len(payload)) + b"mdat" + payload


def png_base64() -> str:
    return base64.b64encode(png_bytes()).decode()


def sniff_image(data: bytes) -> str | None:
    """The image type by magic bytes (what the real APIs check), or None for anything else."""
    if data.startswith(PNG_MAGIC):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


# ---------------------------------------------------------------- ids

_BASE32 = "abcdefghijklmnopqrstuvwxyz234567"


def uuid_id() -> str:
    """fal's request ids are UUIDs."""
    return str(uuid.uuid4())


def base32_id(length: int = 26) -> str:
    """Replicate's prediction ids: lower-case base32, 26 characters."""
    return "".join(secrets.choice(_BASE32) for _ in range(length))


# ---------------------------------------------------------------- jobs

PENDING, SUCCEEDED, FAILED, CANCELED = "pending", "succeeded", "failed", "canceled"


class Progress(NamedTuple):
    """Where a job stands. `remaining` counts the "in progress" polls still to come after
    this one (None while hanging), so a fake can say "queued" early and "running" last."""

    phase: str
    remaining: int | None = 0


@dataclass
class MediaFile:
    name: str
    data: bytes
    content_type: str


@dataclass
class Job:
    """One submitted generation. Only status polls move it forward, so tests are
    deterministic: the gateway must poll, and a job never finishes behind its back."""

    id: str
    reply: MediaReply
    body: dict
    route: str = ""  # what the fake needs to find the job again (fal: owner/app; replicate: model)
    polls: int = 0
    canceled: bool = False
    outputs: list[MediaFile] = field(default_factory=list)

    def peek(self) -> Progress:
        if self.canceled:
            return Progress(CANCELED)
        if self.reply.hang:
            return Progress(PENDING, None)
        left = self.reply.polls_before_done - self.polls
        if left > 0:
            return Progress(PENDING, left - 1)
        return Progress(FAILED if self.reply.fail is not None else SUCCEEDED)

    def poll(self) -> Progress:
        """A status poll: report where the job stands, then count it."""
        progress = self.peek()
        if progress.phase == PENDING:
            self.polls += 1
        return progress

    @property
    def done(self) -> bool:
        return self.peek().phase != PENDING


# ---------------------------------------------------------------- base fake


def base_url(request: web.Request) -> str:
    """Absolute URLs are built from the request, so they point back at this very server."""
    return f"{request.scheme}://{request.host}"


class MediaUpstream(FakeUpstream):
    """Reply queue, job table and result-file server shared by the media fakes.

    Result files are served without auth at GET /files/<name>, as the providers'
    CDNs serve them; every download is logged in `.downloads`."""

    def __init__(self, api_key: str) -> None:
        super().__init__(api_key)
        self.jobs: dict[str, Job] = {}
        self.files: dict[str, MediaFile] = {}
        self.downloads: list[str] = []
        self.result_origin: str | None = None   # serve result links from another origin (a CDN)
        self._closing = asyncio.Event()
        self.app.router.add_get("/files/{name}", self._serve_file)
        self.app.on_shutdown.append(self._release_held)

    # ---- script

    def check_reply(self, reply: Any) -> None:
        if not isinstance(reply, MediaReply):
            raise TypeError(f"media fakes take MediaReply, got {type(reply).__name__}")
        if reply.images is not None and reply.images < 0:
            raise ValueError("MediaReply.images must be >= 0")
        if reply.polls_before_done < 0:
            raise ValueError("MediaReply.polls_before_done must be >= 0")
        if reply.error_status is not None and not 400 <= reply.error_status <= 599:
            raise ValueError("MediaReply.error_status must be an HTTP error status (4xx/5xx)")

    def next_reply(self) -> MediaReply:  # type: ignore[override]
        return self._replies.popleft() if self._replies else MediaReply()  # type: ignore[return-value]

    def new_job(self, job_id: str, reply: MediaReply, body: dict, route: str = "") -> Job:
        job = Job(id=job_id, reply=reply, body=body, route=route)
        self.jobs[job_id] = job
        return job

    # ---- results

    def outputs(self, job: Job, image_count: int) -> list[MediaFile]:
        """The job's result files, made once so every fetch returns the same URLs."""
        if not job.outputs:
            if job.reply.video:
                job.outputs = [self.add_file(f"{job.id}.mp4", mp4_bytes(), "video/mp4")]
            else:
                count = job.reply.images if job.reply.images is not None else image_count
                job.outputs = [
                    self.add_file(f"{job.id}-{index}.png", png_bytes(), "image/png") for index in range(count)
                ]
        return job.outputs

    def add_file(self, name: str, data: bytes, content_type: str) -> MediaFile:
        media = MediaFile(name, data, content_type)
        self.files[name] = media
        return media

    def file_url(self, request: web.Request, media: MediaFile) -> str:
        return f"{self.result_origin or base_url(request)}/files/{media.name}"

    async def _serve_file(self, request: web.Request) -> web.Response:
        media = self.files.get(request.match_info["name"])
        if media is None:
            return web.Response(status=404, text="Not Found")
        self.downloads.append(media.name)
        return web.Response(body=media.data, content_type=media.content_type)

    # ---- hanging synchronous requests

    async def hold(self) -> None:
        """Never answer (until the server shuts down): a synchronous upstream that hangs."""
        await self._closing.wait()

    async def _release_held(self, _app: web.Application) -> None:
        self._closing.set()
