"""The length of an MP4/MOV clip, read from its `mvhd` box (no decoding, no tools)."""
from __future__ import annotations

import struct


def _boxes(data: bytes, start: int, end: int):
    pos = start
    while pos + 8 <= end:
        size, kind = struct.unpack(">I4s", data[pos:pos + 8])
        header = 8
        if size == 1 and pos + 16 <= end:
            size, header = struct.unpack(">Q", data[pos + 8:pos + 16])[0], 16
        elif size == 0:
            size = end - pos
        if size < header:
            return
        yield kind, pos + header, min(pos + size, end)
        pos += size


def duration_seconds(data: bytes) -> float | None:
    """Seconds, or None when the bytes are not an MP4/MOV with a movie header."""
    for kind, body, end in _boxes(data, 0, len(data)):
        if kind != b"moov":
            continue
        for inner, start, stop in _boxes(data, body, end):
            if inner == b"mvhd" and stop - start >= 20:
                version = data[start]
                if version == 1:
                    timescale, duration = struct.unpack(">IQ", data[start + 20:start + 32])
                else:
                    timescale, duration = struct.unpack(">II", data[start + 12:start + 20])
                return duration / timescale if timescale else None
    return None
