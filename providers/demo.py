"""The offline demo provider: deterministic answers with no network and no key, so a new
install works at once. Images are real PNGs and
videos real MP4 clips, chosen from the prompt. It is a demo, not a model: it restates the last user message,
calls a tool when the message names it or a word of its name ("weather" for get_weather)
or when tool_choice demands one, and
acknowledges tool results. Streams come word by word. Usage counts words as tokens.
"""
from __future__ import annotations

import asyncio
import hashlib
import struct
import zlib
from pathlib import Path
from typing import Any, AsyncIterator

import orjson
from pydantic import Field

from config.schema import Section

from .base import Provider
from .media_types import ImageJob, MediaFile, VideoJob
from .types import (
    END, MAX_TOKENS, TOOL_USE, ChatRequest, ChatResponse, StreamEnd, StreamEvent, StreamStart, TextDelta,
    TextPart, ToolCall, ToolCallDelta, ToolCallStart, ToolResult, Usage, estimate_tokens,
)


CLIPS = sorted((Path(__file__).parent / "assets").glob("demo-clip-*.mp4"))


def png(width: int, height: int, seed: bytes) -> bytes:
    """A real PNG: a two-colour gradient whose colours come from `seed`."""
    a, b = seed[:3], seed[3:6]
    rows = []
    for y in range(height):
        t = y / max(1, height - 1)
        colour = bytes(int(a[i] + (b[i] - a[i]) * t) for i in range(3))
        rows.append(b"\x00" + colour * width)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"".join(rows)))
            + chunk(b"IEND", b""))


def _placeholder(schema: dict[str, Any]) -> Any:
    return {"string": "demo", "integer": 1, "number": 1, "boolean": True,
            "array": [], "object": {}}.get(schema.get("type", "string"), "demo")


class DemoSettings(Section):
    stream_delay_seconds: float = Field(0, ge=0)    # pause between streamed words
    render_seconds: float = Field(0, ge=0)          # how long a media render takes


class DemoProvider(Provider):
    type_name = "demo"
    Settings = DemoSettings

    def __init__(self, config, http):
        super().__init__(config, http)
        self.delay = self.settings.stream_delay_seconds

    def _answer(self, req: ChatRequest) -> tuple[list, str]:
        last = req.messages[-1] if req.messages else None
        results = [p for p in last.parts if isinstance(p, ToolResult)] if last else []
        if results:
            return [TextPart(f"Demo received the tool result: {results[-1].text()[:200]}")], END
        said = last.text().strip() if last else ""
        tool = self._tool_to_call(req, said)
        if tool is not None:
            props = (tool.parameters or {}).get("properties", {})
            required = (tool.parameters or {}).get("required", list(props))
            args = {name: _placeholder(props.get(name, {})) for name in required}
            call_id = "call_demo_" + hashlib.sha256(said.encode()).hexdigest()[:12]
            return [ToolCall(call_id, tool.name, orjson.dumps(args).decode())], TOOL_USE
        words = (f"This is the offline demo model. You said: {said[:500]}. "
                 f"Configure a real provider to get real answers.").split(" ")
        if len(words) > req.max_tokens:
            return [TextPart(" ".join(words[:req.max_tokens]))], MAX_TOKENS
        return [TextPart(" ".join(words))], END

    @staticmethod
    def _tool_to_call(req: ChatRequest, said: str):
        if not req.tools or (req.tool_choice and req.tool_choice.mode == "none"):
            return None
        if req.tool_choice and req.tool_choice.mode == "tool":
            return next((t for t in req.tools if t.name == req.tool_choice.name), None)
        words = said.lower()
        named = next((t for t in req.tools if t.name in said
                      or any(len(w) > 3 and w in words for w in t.name.lower().split("_"))), None)
        if named or (req.tool_choice and req.tool_choice.mode == "required"):
            return named or req.tools[0]
        return None

    @staticmethod
    def _usage(req: ChatRequest, content: list) -> Usage:
        chars = sum(len(m.text()) for m in req.messages)
        produced = sum(len(p.text.split(" ")) if isinstance(p, TextPart) else estimate_tokens(len(p.arguments))
                       for p in content)
        return Usage(input_tokens=estimate_tokens(chars), output_tokens=produced)

    async def complete(self, req: ChatRequest, model) -> ChatResponse:
        self.refuse_foreign_parts(req)
        content, stop = self._answer(req)
        return ChatResponse(id="demo-" + hashlib.sha256(repr(content).encode()).hexdigest()[:16],
                            model=model.upstream, content=content, stop_reason=stop,
                            usage=self._usage(req, content))

    async def stream(self, req: ChatRequest, model) -> AsyncIterator[StreamEvent]:
        self.refuse_foreign_parts(req)
        content, stop = self._answer(req)
        yield StreamStart(id="demo-stream", model=model.upstream)
        for part in content:
            if isinstance(part, TextPart):
                words = part.text.split(" ")
                for i, word in enumerate(words):
                    await asyncio.sleep(self.delay)
                    yield TextDelta(word if i == 0 else " " + word)
            else:
                yield ToolCallStart(0, part.id, part.name)
                half = len(part.arguments) // 2
                for fragment in (part.arguments[:half], part.arguments[half:]):
                    await asyncio.sleep(self.delay)
                    yield ToolCallDelta(0, fragment)
        yield StreamEnd(stop_reason=stop, usage=self._usage(req, content))

    # ---- media: real files, deterministic from the prompt ------------------------------

    async def generate_images(self, job: ImageJob, model) -> list[MediaFile]:
        await asyncio.sleep(self.delay)
        return [MediaFile(data=png(64, 64, hashlib.sha256(f"{job.prompt}|{i}".encode()).digest()))
                for i in range(job.n)]

    async def render_video(self, job: VideoJob, model) -> MediaFile:
        await asyncio.sleep(self.settings.render_seconds)
        clip = CLIPS[hashlib.sha256(job.prompt.encode()).digest()[0] % len(CLIPS)]
        return MediaFile(data=await asyncio.to_thread(clip.read_bytes), content_type="video/mp4")
