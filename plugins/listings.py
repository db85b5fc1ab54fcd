"""Model listings (no key): `GET /api/v1/models` (format A's list) and
`GET /api/v1/chat/models` (prices). Built once at start-up: the catalog is static."""
from __future__ import annotations

import time

import orjson
from aiohttp import web

from config import Config, usd

from . import hookimpl
from .formats.chat_completions import DEFAULT_MAX_TOKENS, MAX_TOKENS_CAP

SPECIAL_IDS = {"svc/free": ("free", "featured"), "svc/smart": ("router", "tiers")}


def special_ids(cfg: Config) -> list[str]:
    """svc/free and svc/smart, listed only when the config enables them."""
    return [mid for mid, (section, key) in SPECIAL_IDS.items() if cfg.section(section).get(key)]


def served_model_ids(app) -> set[str]:
    """Every id a client may send: chat models, svc/free and svc/smart, media models."""
    from .appstate import CONFIG
    from .media import MEDIA
    cfg = app[CONFIG]
    return {*cfg.chat_models, *special_ids(cfg), *(app[MEDIA].catalog if MEDIA in app else ())}


def model_list(cfg: Config) -> dict:
    created = int(time.time())
    data = [{"id": m.id, "object": "model", "created": created, "owned_by": m.provider}
            for m in cfg.chat_models.values()]
    data += [{"id": mid, "object": "model", "created": created, "owned_by": "svc"} for mid in special_ids(cfg)]
    return {"object": "list", "data": data}


def chat_listing(cfg: Config) -> dict:
    models = []
    for m in cfg.chat_models.values():
        entry = {"id": m.id, "label": m.label, "provider": m.provider, "pricing": m.pricing,
                 "input_usd_per_mtok": usd(m.input_micro), "output_usd_per_mtok": usd(m.output_micro),
                 "list_input_usd_per_mtok": usd(m.list_input_micro),
                 "list_output_usd_per_mtok": usd(m.list_output_micro)}
        if m.pricing == "per_request":
            entry["usd_per_request"] = usd(m.request_micro)
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


def _static(body: dict):
    payload = orjson.dumps(body)

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=payload, content_type="application/json")
    return handler


@hookimpl
def gateway_register_routes(register, config):
    register("GET", "/api/v1/models", _static(model_list(config)))
    register("GET", "/api/v1/chat/models", _static(chat_listing(config)))
