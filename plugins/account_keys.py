"""Account self-service for keys, with the account's own key:

- `GET /api/v1/account/keys`: the account's keys (never another account's), newest first,
  each as the admin API shows it (prefix, name, created, revoked, last used, spend, policy);
- `POST /api/v1/account/keys {"name": "ci"}`: another key for the same account, shown once;
- `DELETE /api/v1/account/keys/{id}`: revoke one; every gateway process refuses it within a
  second (plugins/keycache.py). A key may revoke itself.

A key id outside the caller's account is a 404, exactly like one that does not exist, so
the routes tell nothing about other accounts.
"""
from __future__ import annotations

from aiohttp import web

from . import hookimpl
from .admin import render
from .accounts import require_key
from .appstate import STORE
from .auth import display_prefix, hash_key, key_changed, new_key
from .errors import GatewayError, bad_request
from .formats.base import json_response, read_json
from .storage import reports

MAX_NAME = 60


async def list_keys(request: web.Request) -> web.Response:
    p = await require_key(request)
    rows = await reports.keys(request.app[STORE], p.account_id)
    return json_response({"object": "list", "data": [{**render.key(r), "current": r["id"] == p.key_id}
                                                     for r in reversed(rows)]})


async def create_key(request: web.Request) -> web.Response:
    p = await require_key(request)
    body = await read_json(request) if request.can_read_body else {}
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object, e.g. {\"name\": \"ci\"}")
    name = body.get("name")
    if name is not None and (not isinstance(name, str) or len(name.strip()) > MAX_NAME):
        raise bad_request(f"name: a string of at most {MAX_NAME} characters", param="name")
    name = (name.strip() or None) if name else None
    key = new_key()
    key_id = await request.app[STORE].keys.create(p.account_id, hash_key(key), display_prefix(key), name)
    return json_response({"id": key_id, "key": key, "prefix": display_prefix(key), "name": name,
                          "note": "the key is shown once: store it now (only its hash is kept)"}, status=201)


async def revoke_key(request: web.Request) -> web.Response:
    p = await require_key(request)
    try:
        key_id = int(request.match_info["key_id"])
    except ValueError:
        raise bad_request("the key id is a number, as listed by GET /api/v1/account/keys") from None
    store = request.app[STORE]
    found = await reports.key(store, key_id)
    if found is None or found["account_id"] != p.account_id:
        raise GatewayError(404, f"no key {key_id} on this account (GET /api/v1/account/keys lists them)",
                           code="key_not_found")
    if found["revoked_at"] is None:
        await store.keys.revoke(key_id)
        await key_changed(request.app)            # every process drops what it cached
        found = await reports.key(store, key_id)
    return json_response({"id": key_id, "prefix": found["prefix"], "revoked_at": found["revoked_at"]})


@hookimpl
def gateway_register_routes(register, config):
    register("GET", "/api/v1/account/keys", list_keys)
    register("POST", "/api/v1/account/keys", create_key)
    register("DELETE", "/api/v1/account/keys/{key_id}", revoke_key)
