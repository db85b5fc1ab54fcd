"""Model listings (no key): `GET /api/v1/models` (format A's list) and
`GET /api/v1/chat/models` (prices). Built once at start-up: the catalog is static."""
from __future__ import annotations

import time

import orjson
from aiohttp import web

from config import Config, usd

from . import hookimpl
from .appstate import CONFIG, PROVIDERS
from .formats.chat_completions import DEFAULT_MAX_TOKENS, MAX_TOKENS_CAP

SPECIAL_IDS = {"svc/free": ("free", "featured"), "svc/smart": ("router", "tiers")}


def special_ids(cfg: Config) -> list[str]:
    """svc/free and svc/smart, listed only when the config enables them."""
    return [mid for mid, (section, key) in SPECIAL_IDS.items() if getattr(cfg.settings(section), key)]


def served_model_ids(app) -> set[str]:
    """Every id a client may send: chat models, svc/free and svc/smart, media models."""
    from .media import MEDIA
    cfg = app[CONFIG]
    return {*cfg.chat_models, *special_ids(cfg), *(app[MEDIA].catalog if MEDIA in app else ())}


def available(app, provider: str) -> bool:
    """False while the model's provider cannot serve (e.g. no API key set)."""
    return app[PROVIDERS][provider].unavailable_reason() is None


def model_list(app) -> dict:
    """Format A's list: only the models that can answer now (clients pick from it)."""
    cfg: Config = app[CONFIG]
    created = int(time.time())
    data = [{"id": m.id, "object": "model", "created": created, "owned_by": m.provider}
            for m in cfg.chat_models.values() if available(app, m.provider)]
    data += [{"id": mid, "object": "model", "created": created, "owned_by": "svc"} for mid in special_ids(cfg)]
    return {"object": "list", "data": data}


def chat_listing(app) -> dict:
    cfg: Config = app[CONFIG]
    models = []
    for m in cfg.chat_models.values():
        entry = {"id": m.id, "label": m.label, "provider": m.provider, "available": available(app, m.provider),
                 "pricing": m.pricing,
                 "input_usd_per_mtok": usd(m.input_micro), "output_usd_per_mtok": usd(m.output_micro),
                 "list_input_usd_per_mtok": usd(m.list_input_micro),
                 "list_output_usd_per_mtok": usd(m.list_output_micro)}
        if m.pricing == "per_request":
            entry["usd_per_request"] = usd(m.request_micro)
        entry["context_length"], entry["max_output_tokens"] = m.context_length, m.max_output_tokens
        entry.update(m.lifecycle.listing())
        if m.note:
            entry["note"] = m.note
        models.append(entry)
    for mid in special_ids(cfg):
        models.append({"id": mid, "label": mid, "provider": "svc", "pricing": "auto",
                       "note": "priced as the model that answers"})
    return {"endpoint": "/api/v1/chat/completions", "pricing": "per_token",
            "how": "A call reserves its input (about 4 characters per token) plus max_tokens at the model's "
                   "rates, then is charged for the tokens used; the rest is refunded. Prices are USD per "
                   "million tokens; list_* are the provider's list prices.",
            "max_tokens": {"default": DEFAULT_MAX_TOKENS, "cap": MAX_TOKENS_CAP}, "models": models}


def _static(build):
    """A handler answering `build(app)`, built once on first use (the providers exist then)."""
    payload: list[bytes] = []

    async def handler(request: web.Request) -> web.Response:
        if not payload:
            payload.append(orjson.dumps(build(request.app)))
        return web.Response(body=payload[0], content_type="application/json")
    return handler


async def api_root(request: web.Request) -> web.Response:
    """Clients probe the base URL at start (HEAD or GET): say it is here and where to go."""
    return web.json_response({"object": "gateway", "api": "/api/v1", "models": "/api/v1/models"})


@hookimpl
def gateway_register_routes(register, config):
    register("GET", "/api/v1/models", _static(model_list))
    register("GET", "/api/v1/chat/models", _static(chat_listing))
    for path in ("/api", "/api/", "/api/v1", "/api/v1/"):
        register("GET", path, api_root)
        register("HEAD", path, api_root)
