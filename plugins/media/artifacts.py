"""Where rendered files live until the client downloads them.

The gateway copies every upstream result here when the render completes, so the link it
returns does not depend on the upstream. Links are unguessable (24 random bytes) and
short-lived (`media.artifacts.ttl_seconds`, default one hour). Stores are plugins by
`type`; `local` keeps files in a directory and sweeps expired ones.
"""
from __future__ import annotations

import asyncio
import os
import re
import secrets
import time
from pathlib import Path
from typing import ClassVar

from config.schema import Seconds, Section
from plugins import hookimpl

PREFIX = "/api/v1/media/artifacts/"
EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/webp": "webp", "image/gif": "gif",
              "video/mp4": "mp4", "video/webm": "webm", "video/quicktime": "mov"}
NAME = re.compile(r"^[A-Za-z0-9_-]{20,64}\.(png|jpg|webp|gif|mp4|webm|mov)$")


class ArtifactSettings(Section):
    type: str = "local"
    ttl_seconds: Seconds = 3600          # how long a link works


class LocalSettings(ArtifactSettings):
    dir: str = "artifacts"               # relative to the config file's folder


class ArtifactStore:
    type_name: ClassVar[str] = ""
    Settings: ClassVar[type[ArtifactSettings]] = ArtifactSettings   # `media.artifacts` for this type

    def __init__(self, settings: ArtifactSettings, base_dir: Path):
        self.ttl = settings.ttl_seconds

    async def save(self, data: bytes, content_type: str) -> str:
        """Keep `data`; return the link's path (under /api/v1/media/artifacts/)."""
        raise NotImplementedError

    async def open(self, name: str) -> tuple[Path | bytes, str] | None:
        """-> (file path or bytes, content type), or None if unknown or expired."""
        raise NotImplementedError

    async def sweep(self) -> int:
        return 0


class LocalArtifacts(ArtifactStore):
    type_name = "local"
    Settings = LocalSettings

    def __init__(self, settings: LocalSettings, base_dir: Path):
        super().__init__(settings, base_dir)
        self.directory = base_dir / settings.dir

    def _write(self, name: str, data: bytes) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f".{name}.part"
        tmp.write_bytes(data)
        os.replace(tmp, self.directory / name)     # never serve a half-written file

    async def save(self, data: bytes, content_type: str) -> str:
        name = f"{secrets.token_urlsafe(24)}.{EXTENSIONS.get(content_type, 'bin')}"
        await asyncio.to_thread(self._write, name, data)
        return PREFIX + name

    async def open(self, name: str):
        if not NAME.match(name):
            return None
        path = self.directory / name
        try:
            age = time.time() - (await asyncio.to_thread(path.stat)).st_mtime
        except FileNotFoundError:
            return None
        if age > self.ttl:
            await asyncio.to_thread(path.unlink, True)
            return None
        content_type = next((t for t, e in EXTENSIONS.items() if name.endswith("." + e)), "application/octet-stream")
        return path, content_type

    def _sweep(self) -> int:
        if not self.directory.exists():
            return 0
        cutoff, removed = time.time() - self.ttl, 0
        for path in self.directory.iterdir():
            if path.is_file() and path.stat().st_mtime < cutoff:
                path.unlink(missing_ok=True)
                removed += 1
        return removed

    async def sweep(self) -> int:
        return await asyncio.to_thread(self._sweep)


@hookimpl
def gateway_register_artifact_stores(register):
    register(LocalArtifacts)
