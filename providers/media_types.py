"""Canonical media jobs and results, between the media endpoints and media providers."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class ImageJob:
    prompt: str
    n: int
    operation: str                      # generate | edit
    references: list[str] = field(default_factory=list)   # https or data: URLs; the first is edited
    aspect_ratio: str | None = None
    quality: str | None = None
    resolution: str | None = None
    size: str | None = None
    reference_files: list[tuple[bytes, str]] = field(default_factory=list)   # for upstreams that want uploads


@dataclass(slots=True)
class VideoJob:
    prompt: str
    operation: str                      # text_to_video | image_to_video | reference_to_video
    duration: float
    image_url: str | None = None
    references: list[str] = field(default_factory=list)
    video_url: str | None = None
    resolution: str | None = None
    aspect_ratio: str | None = None
    audio: bool | None = None
    image_file: tuple[bytes, str] | None = None    # the start frame, for upstreams that want it inline


@dataclass(slots=True)
class MediaFile:
    """A produced file: bytes in hand, or a URL to download from the upstream."""
    url: str | None = None
    data: bytes | None = None
    content_type: str = "image/png"
    meta: dict[str, Any] = field(default_factory=dict)
