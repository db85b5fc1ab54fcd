"""The gateway's log output: JSON lines on stderr (coloured lines on a terminal).

Every call writes one line, so that line is on the hot path: `info_line` renders it with
orjson straight from its fields (no processor chain, no copies), and the JSON writer
gathers lines and writes whole lines in one system call, at most `FLUSH_SECONDS` after the
first waiting line (outside an event loop, at once). A warning or an error goes out at once
with every line before it, and whatever waits is written when `gateway run` ends and at
exit, so a clean shutdown loses nothing (a killed process, at most the last moment's lines). A write is at most `PIPE_BUF` bytes of whole lines (one longer line goes alone), so
two workers sharing stderr never split or interleave each other's lines.

The request's own fields (`request_id`, `path`, `client_request_id`) are set once per request
in `REQUEST_FIELDS` and appear on every line logged while serving it."""
from __future__ import annotations

import atexit
import contextvars
import logging
import os
import select
import sys
import threading
import time
from asyncio import events

import orjson
import structlog

FLUSH_SECONDS = 0.1
PIPE_BUF = getattr(select, "PIPE_BUF", 4096)     # writes of at most this many bytes to a pipe are never split
LEVEL_NAMES = {"warn": "warning", "exception": "error"}     # as structlog's add_log_level names them

REQUEST_FIELDS: contextvars.ContextVar[dict | None] = contextvars.ContextVar("log_request_fields", default=None)

_running_loop = events._get_running_loop          # the C helper asyncio itself uses: None outside a loop


class LineWriter:
    """Whole lines to a file descriptor, gathered and written at most `delay` seconds late."""

    def __init__(self, fd: int, delay: float = FLUSH_SECONDS):
        self.fd, self.delay = fd, delay
        self.pending = bytearray()
        self.loop = None                       # the loop a flush is scheduled on, if any
        self.lock = threading.RLock()          # a signal handler that logs mid-write must not hang

    def write(self, line: bytes) -> None:
        """Queue one line (ending in a newline); written at once when no event loop runs here."""
        with self.lock:
            if len(self.pending) + len(line) > PIPE_BUF:
                self._write_pending()
            self.pending += line
            loop = _running_loop()
            if loop is None:
                self._write_pending()
            elif self.loop is not loop:        # one flush scheduled per loop at a time
                self.loop = loop
                loop.call_later(self.delay, self._scheduled_flush)

    def write_now(self, line: bytes) -> None:
        """A line that must not wait (a warning, an error): out at once, after what waits."""
        with self.lock:
            if len(self.pending) + len(line) > PIPE_BUF:
                self._write_pending()
            self.pending += line
            self._write_pending()

    def flush(self) -> None:
        with self.lock:
            self._write_pending()

    def _scheduled_flush(self) -> None:
        with self.lock:
            self.loop = None
            self._write_pending()

    def _write_pending(self) -> None:
        if not self.pending:
            return
        data, self.pending = self.pending, bytearray()
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.fd, view):]
        except OSError:          # a reader that left, a full disk: the gateway keeps serving
            pass


class LineLogger:
    """structlog's logger for JSON lines: info and debug lines wait for the writer's next
    flush, anything louder goes out at once."""

    def __init__(self, writer: LineWriter):
        self.writer = writer
        self.msg = self.info = self.debug = writer.write
        self.warning = self.warn = self.error = self.err = self.critical = self.fatal = self.exception = \
            self.failure = writer.write_now


class JsonOut:
    """Where JSON lines go, and whether info lines are on."""

    def __init__(self, writer: LineWriter, info: bool):
        self.writer, self.info = writer, info


JSON_OUT: JsonOut | None = None       # set by `configure` for JSON lines; None: every line goes through structlog


def info_line(logger, event: str, fields: dict) -> None:
    """Log `event` at info level with `fields` (taken over: not to be used after). The same
    line as `logger.info(event, **fields)`, rendered straight to the JSON writer when that is
    where lines go."""
    out = JSON_OUT
    if out is None:
        logger.info(event, **fields)
        return
    if not out.info:
        return
    fields["event"] = event
    # structlog's own processors for JSON lines (below), called directly: no chain, no copies
    out.writer.write(json_line(None, "info", level_and_time(None, "info", request_fields(None, "info", fields))))


def flush() -> None:
    """Write every line that waits (at the end of serving and at exit)."""
    if JSON_OUT is not None:
        JSON_OUT.writer.flush()


# ---- structlog's processors ------------------------------------------------------

def request_fields(_logger, _method: str, event: dict) -> dict:
    request = REQUEST_FIELDS.get()
    if request:
        for key, value in request.items():
            event.setdefault(key, value)
    return event


def level_and_time(_logger, method: str, event: dict) -> dict:
    """JSON logs carry the level and a Unix timestamp (a terminal gets ISO time)."""
    event["level"] = LEVEL_NAMES.get(method, method)
    event["timestamp"] = time.time()
    return event


def json_line(_logger, _method: str, event: dict) -> bytes:
    return orjson.dumps(event, default=str, option=orjson.OPT_APPEND_NEWLINE)


def configure(level: str = "info", json_logs: bool | None = None) -> None:
    global JSON_OUT
    if json_logs is None:
        json_logs = not sys.stderr.isatty()
    number = getattr(logging, level.upper(), logging.INFO)
    wrapper = structlog.make_filtering_bound_logger(number)
    flush()
    JSON_OUT = None
    if json_logs and hasattr(sys.stderr, "fileno"):
        try:
            fd = sys.stderr.fileno()
        except (OSError, ValueError):           # a stderr without a file (captured in tests)
            fd = None
        if fd is not None:
            sys.stderr.flush()
            # Our own descriptor of the same stderr: should that file object be closed (a
            # test's capture), its number reused can never receive these lines. Kept open.
            writer = LineWriter(os.dup(fd))
            JSON_OUT = JsonOut(writer, number <= logging.INFO)
            structlog.configure(
                processors=[request_fields, level_and_time, structlog.processors.format_exc_info, json_line],
                wrapper_class=wrapper, logger_factory=lambda *_: LineLogger(writer), cache_logger_on_first_use=True)
            return
    renderer = structlog.processors.JSONRenderer(serializer=lambda o, **_: orjson.dumps(o, default=str).decode()) \
        if json_logs else structlog.dev.ConsoleRenderer()
    stamper = structlog.processors.TimeStamper(fmt=None if json_logs else "iso", utc=True)
    structlog.configure(
        processors=[request_fields, structlog.processors.add_log_level, stamper,
                    structlog.processors.format_exc_info, renderer],
        wrapper_class=wrapper, logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True)


atexit.register(flush)
