"""Images and videos: `POST /api/v1/images/generations`, `POST /api/v1/videos/generations`,
`GET /api/v1/media/models` and `GET /api/v1/media/artifacts/<name>`.

A media call runs the same stages as chat (authenticate, admit, moderate, route, reserve,
then settle), priced by a MediaPricer. Routing builds the job and validates it against
the model, so every bad option is a 400 before any money is held.
"""
from __future__ import annotations

import asyncio
import base64
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import structlog
from aiohttp import web

from config import ConfigError, parse_section, usd
from config.schema import Count, Seconds, Section
from plugins import hookimpl
from plugins.appstate import CONFIG, HTTP, PM, PROVIDERS
from plugins.context import CallContext, Route
from plugins.errors import GatewayError, bad_request
from plugins.formats.base import ClientFormat, json_response, openai_error_body
from plugins.netguard import check_url, check_url_resolved
from plugins.pipeline import run_call, succeeded
from providers.guard import answer_shape, check_files
from providers.media_base import MAX_RESULT_BYTES, origin
from providers.media_types import ImageJob, MediaFile, VideoJob

from . import requests as parse
from .artifacts import PREFIX
from .catalog import MediaModel, load_media
from .fetch import fetch, guarded_session
from .mp4 import duration_seconds
from .pricing import MediaPricer
from .renders import keep_cancelling, tracked

log = structlog.get_logger("media")
MB = 1_000_000


class MediaSection(Section):
    """`media:` in the YAML."""
    artifacts: dict[str, Any] = {}        # {type: local, ...}: checked against the store type's Settings
    allow_private_urls: bool = False      # fetch client URLs on private networks (tests, closed setups)
    max_reference_mb: Count = 20
    reference_timeout_seconds: Seconds = 30


@dataclass
class Media:
    """Media state on the app: the catalog, settings, artifact store, fetch session."""
    catalog: dict[str, MediaModel]
    settings: MediaSection
    store: Any
    allow_private: bool
    fetcher: aiohttp.ClientSession | None = None
    listing: bytes = b""
    orphans: asyncio.Task | None = None      # cancels renders of calls whose process died


MEDIA = web.AppKey("media", Media)


class MediaEndpoint(ClientFormat):
    """The media endpoints' request policy and error shape (OpenAI's)."""
    key_required = False
    accepts_x402 = True
    max_input_chars = 200_000

    def __init__(self, kind: str):
        self.kind = kind
        self.name = f"{kind}s"
        self.path = f"/api/v1/{kind}s/generations"
        self.endpoint = f"{kind}s.generations"

    def error_body(self, err: GatewayError) -> dict[str, Any]:
        return openai_error_body(err)


IMAGES, VIDEOS = MediaEndpoint("image"), MediaEndpoint("video")


# ---- configuration and routing -----------------------------------------------------

@hookimpl
def gateway_register_settings(register):
    register("media", MediaSection)


@hookimpl
def gateway_configure(app, config):
    catalog = load_media(config)
    settings: MediaSection = config.settings("media")
    types: dict[str, type] = {}
    app[PM].hook.gateway_register_artifact_stores(register=lambda cls: types.setdefault(cls.type_name, cls))
    kind = settings.artifacts.get("type", "local")
    if kind not in types:
        raise ConfigError([f"{config.path}: media.artifacts.type: no artifact store {kind!r} "
                           f"(known: {', '.join(sorted(types))})"])
    store_settings = parse_section(config, types[kind].Settings, settings.artifacts, "media.artifacts")
    unable = [f"{config.path}: models.{m.kind}: {m.id}: provider {m.provider!r} has type "
              f"{config.providers[m.provider].type!r}, which makes no {m.kind}s"
              for m in catalog.values() if not _can_make(app, config, m)]
    if unable:
        raise ConfigError(unable)
    app[MEDIA] = Media(catalog, settings, types[kind](store_settings, config.base_dir), settings.allow_private_urls)
    app.cleanup_ctx.append(_media_context)
    app.on_shutdown.append(_stop_cancelling)


def _can_make(app, config, model: MediaModel) -> bool:
    from plugins.appstate import PROVIDER_TYPES
    cls = app[PROVIDER_TYPES].get(config.providers[model.provider].type)
    method = "generate_images" if model.kind == "image" else "render_video"
    return cls is not None and callable(getattr(cls, method, None))


def _client_urls(job: ImageJob | VideoJob, fields) -> list[tuple[str, str]]:
    """(request field, URL) of every URL the client gave for this job. An image job's
    references start with its image_url, when given."""
    refs = list(getattr(job, "references", []) or [])
    out = [(name, getattr(job, name)) for name in ("image_url", "video_url") if getattr(job, name, None)]
    if isinstance(job, ImageJob) and refs and fields.get("image_url"):
        out.append(("image_url", refs.pop(0)))
    return out + [(f"input_images[{i}]", url) for i, url in enumerate(refs)]


def media_route(ctx: CallContext, model_id: str, requested: str | None = None) -> Route:
    """A Route to catalog media model `model_id`, with its validated job and its pricer."""
    app = ctx.app
    endpoint: MediaEndpoint = ctx.format
    model = app[MEDIA].catalog.get(model_id)
    if model is None or model.kind != endpoint.kind:
        raise bad_request(f"model {model_id!r} is not a{'n' if endpoint.kind == 'image' else ''} {endpoint.kind} "
                          "model here; GET /api/v1/media/models lists them", param="model", code="model_not_found")
    provider = app[PROVIDERS][model.provider]
    f, prompt = ctx.media_fields, ctx.prompt
    job = parse.image_job(f, prompt, model) if endpoint.kind == "image" else parse.video_job(f, prompt, model)
    for field, url in _client_urls(job, f):
        check_url(url, field, allow_private=app[MEDIA].allow_private)
    ctx.media, ctx.pricer = job, MediaPricer(model, job)
    return Route(model=model, provider=provider, requested_model=requested or model_id)


@hookimpl(trylast=True)
def gateway_select_route(ctx: CallContext):
    if not isinstance(ctx.format, MediaEndpoint):
        return None
    return media_route(ctx, ctx.model_id)


# ---- the endpoints -----------------------------------------------------------------

def prepare_media(ctx: CallContext, body) -> None:
    ctx.media_fields, ctx.model_id, ctx.prompt = parse.parse_common(body)
    ctx.input_chars = len(ctx.prompt)


async def serve_media(ctx: CallContext) -> web.StreamResponse:
    ctx.media_files = await _produce(ctx)
    await succeeded(ctx)
    return json_response(_render(ctx, ctx.format, ctx.media_files), headers=ctx.response_headers)


async def _produce(ctx: CallContext) -> list[dict[str, Any]]:
    app, job, model, provider = ctx.app, ctx.media, ctx.route.model, ctx.route.provider
    settings, allow = app[MEDIA].settings, app[MEDIA].allow_private
    cap = settings.max_reference_mb * MB
    wait = settings.reference_timeout_seconds
    for field, url in _client_urls(job, ctx.media_fields):   # the provider fetches these: same rule
        await check_url_resolved(url, field, allow_private=allow)
    inline = getattr(provider, "wants_reference_files", False)    # the upstream takes bytes, not URLs
    if isinstance(job, ImageJob):
        if job.references and inline:
            job.reference_files = [await fetch(app[MEDIA].fetcher, url, "input_images", max_bytes=cap, timeout=wait,
                                               allow_private=allow) for url in job.references]
        with answer_shape(provider), tracked(ctx):
            files = check_files(await provider.generate_images(job, model))
    else:
        if job.image_url and inline:
            job.image_file = await fetch(app[MEDIA].fetcher, job.image_url, "image_url", max_bytes=cap, timeout=wait,
                                         allow_private=allow)
        if job.video_url:
            clip, _ = await fetch(app[MEDIA].fetcher, job.video_url, "video_url", max_bytes=10 * cap, timeout=wait,
                                  allow_private=allow)
            length = duration_seconds(clip)
            if length is None:
                raise bad_request("video_url: not an MP4 or MOV clip", param="video_url")
            if length > model.reference_max_seconds + 0.05:
                raise bad_request(f"video_url: the clip is {length:.1f} s; {model.id} takes at most "
                                  f"{model.reference_max_seconds:g} s", param="video_url")
        with answer_shape(provider), tracked(ctx):
            files = check_files([await provider.render_video(job, model)])
    if not files:
        raise GatewayError(502, f"{provider.name} produced nothing", code="render_failed")
    return [await _keep(ctx, f, allow) for f in files]


async def _keep(ctx: CallContext, file: MediaFile, allow: bool) -> dict[str, Any]:
    """Copy a result into the artifact store (or keep its bytes for b64_json)."""
    app, endpoint = ctx.app, ctx.format
    data, content_type = file.data, file.content_type
    if data is None:
        limit = MAX_RESULT_BYTES[endpoint.kind]
        # A link on the provider's own configured origin (a self-hosted server on the operator's
        # network, say) is fetched as that provider is reached; other links follow the address rules.
        own = origin(file.url) == origin(getattr(ctx.route.provider, "base_url", ""))
        data, fetched_type = await fetch(app[HTTP] if own else app[MEDIA].fetcher, file.url, "result",
                                         max_bytes=limit, timeout=120, allow_private=allow or own, status=502)
        content_type = fetched_type if fetched_type.startswith(("image/", "video/")) else content_type
        return {"path": await app[MEDIA].store.save(data, content_type)}
    if endpoint.kind == "image" and ctx.media_fields.get("response_format") != "url":
        return {"b64_json": base64.b64encode(data).decode()}
    return {"path": await app[MEDIA].store.save(data, content_type)}


def _render(ctx: CallContext, endpoint: MediaEndpoint, files: list[dict[str, Any]]) -> dict[str, Any]:
    base = ctx.app[CONFIG].server.public_url
    if endpoint.kind == "image":
        data = [{"b64_json": f["b64_json"]} if "b64_json" in f else {"url": base + f["path"]} for f in files]
        return {"created": int(time.time()), "data": data, "billing": ctx.billing}
    return {"status": "succeeded", "results": [{"url": f["path"]} for f in files], "billing": ctx.billing}


async def images(request: web.Request) -> web.StreamResponse:
    return await run_call(request, IMAGES, prepare_media, serve_media)


async def videos(request: web.Request) -> web.StreamResponse:
    return await run_call(request, VIDEOS, prepare_media, serve_media)


async def artifact(request: web.Request) -> web.StreamResponse:
    found = await request.app[MEDIA].store.open(request.match_info["name"])
    if found is None:
        raise GatewayError(404, "no such artifact, or its link has expired; render it again", code="artifact_gone")
    content, content_type = found
    headers = {"Content-Type": content_type, "Cache-Control": "private, max-age=300"}
    if isinstance(content, bytes):
        return web.Response(body=content, headers=headers)
    return web.FileResponse(content, headers=headers)


async def listing(request: web.Request) -> web.Response:
    media = request.app[MEDIA]
    if not media.listing:            # built on first use: the providers (and their keys) exist then
        media.listing = orjson.dumps(media_listing(request.app))
    return web.Response(body=media.listing, content_type="application/json")


def media_listing(app) -> dict[str, Any]:
    models = []
    for m in app[MEDIA].catalog.values():
        entry = {"id": m.id, "label": m.label, "provider": m.provider, "kind": m.kind, "operations": m.operations,
                 "max_references": m.max_references, "options": m.options_listing,
                 f"usd_per_{m.per}": usd(m.service_micro), f"list_usd_per_{m.per}": usd(m.list_micro),
                 "available": app[PROVIDERS][m.provider].unavailable_reason() is None}
        if m.free_tier:
            entry["free_tier"] = m.free_tier
        if m.note:
            entry["note"] = m.note
        entry.update(m.lifecycle.listing())
        models.append(entry)
    from plugins.router import ROUTER
    return {"models": models, "smart": app[ROUTER].media,
            "how": "Images: price per image at the default quality and resolution, scaled by the listed "
                   "multiplier for other tiers; a call holds price x n and is charged for images produced. "
                   "Videos: price per second (or per video at the default length), scaled by length, resolution "
                   "tier and audio off; a call holds the list price and is charged the service price. Failed "
                   "renders are not charged. aspect_ratio is free."}


# ---- app wiring ----------------------------------------------------------------------

@hookimpl
def gateway_register_routes(register, config):
    register("POST", IMAGES.path, images)
    register("POST", VIDEOS.path, videos)
    register("GET", "/api/v1/media/models", listing)
    register("GET", PREFIX + "{name}", artifact)


@hookimpl
def gateway_startup(app):
    """Queue providers follow URLs on other hosts through the guarded fetch session; the
    renders of calls whose process died are cancelled upstream (now, and from then on)."""
    if MEDIA in app:
        for provider in app[PROVIDERS].values():
            if hasattr(provider, "foreign_http"):
                provider.foreign_http = app[MEDIA].fetcher
        app[MEDIA].orphans = asyncio.get_running_loop().create_task(keep_cancelling(app))


async def _stop_cancelling(app) -> None:
    if app[MEDIA].orphans is not None:        # before the database closes
        app[MEDIA].orphans.cancel()


async def _media_context(app):
    """The fetch session for client and result URLs, and the artifact sweeper."""
    media = app[MEDIA]
    media.fetcher = guarded_session(media.allow_private)

    async def sweep_forever():
        while True:
            await asyncio.sleep(max(60.0, media.store.ttl / 4))
            removed = await media.store.sweep()
            if removed:
                log.info("artifacts_swept", removed=removed)

    sweeper = asyncio.get_running_loop().create_task(sweep_forever())
    yield
    sweeper.cancel()
    await media.fetcher.close()
