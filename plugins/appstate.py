"""Typed application state (aiohttp AppKeys) shared by the core and plugins, kept out of
gateway.py so plugins never import the core (which may be running as __main__)."""
from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import date, datetime, timezone

import aiohttp
from aiohttp import web

import config as config_mod

from .storage import Storage

CONFIG = web.AppKey("config", config_mod.Config)
PM = web.AppKey("pm", object)
STORE = web.AppKey("store", Storage)
HTTP = web.AppKey("http", aiohttp.ClientSession)
PROVIDERS = web.AppKey("providers", dict)
PROVIDER_TYPES = web.AppKey("provider_types", dict)
FORMATS = web.AppKey("formats", dict)
BACKGROUND = web.AppKey("background", set)
REQUEST_ID = web.RequestKey("request_id", str)
# Plain functions request -> a response or None, asked in order for an OPTIONS request
# before its handler (in the core's middleware); the first response is the answer.
OPTIONS_ANSWERS = web.AppKey("options_answers", list)
CLOCK = web.AppKey("clock", object)      # a callable -> Unix time; tests replace it to move the date


def now(app: web.Application) -> float:
    """The app's clock: what day it is for the free allowance and for retired models."""
    return app.get(CLOCK, time.time)()


def utc_today(app: web.Application) -> date:
    return datetime.fromtimestamp(now(app), timezone.utc).date()


class Spans:
    """Where the pipeline opens a span per stage (plugins.tracing replaces it when traces
    are on). This default opens none: a stage costs one shared no-op `with`."""
    _none = contextlib.nullcontext()

    def stage(self, name: str):
        """Around one pipeline stage ("authenticate", "reserve", "settle", ...)."""
        return self._none

    def call(self, ctx):
        """Around the upstream work of a call (the provider, the relay)."""
        return self._none

    def client_trace_configs(self) -> list:
        """aiohttp TraceConfigs for the upstream session (a span per upstream request)."""
        return []


NO_SPANS = Spans()
SPANS = web.AppKey("spans", Spans)


def spawn(app: web.Application, coro) -> asyncio.Task:
    """A background task the app tracks and drains at shutdown."""
    task = asyncio.get_running_loop().create_task(coro)
    app[BACKGROUND].add(task)
    task.add_done_callback(app[BACKGROUND].discard)
    return task
