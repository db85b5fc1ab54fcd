"""`POST /api/v1/account/agents/register {name}`: name the agent that holds a key.

Names are unique within an account: the same name always returns the same agent (201
when new, 200 after). The calling key is attached to the agent unless it already belongs
to another one (then `key_attached` is false); calls on an attached key are recorded
under the agent.
"""
from __future__ import annotations

from aiohttp import web

from . import hookimpl
from .appstate import STORE
from .accounts import require_key
from .auth import credential, hash_key, key_changed
from .errors import bad_request
from .formats.base import json_response, read_json
from .ratelimit import admit_request


async def register_agent(request: web.Request) -> web.Response:
    principal = await require_key(request)
    limit_headers = await admit_request(request, principal)
    body = await read_json(request)
    name = body.get("name") if isinstance(body, dict) else None
    if not isinstance(name, str) or not name.strip():
        raise bad_request("name: required, 1 to 60 characters", param="name")
    name = name.strip()
    if len(name) > 60:
        raise bad_request(f"name: at most 60 characters, got {len(name)}", param="name")
    done = await request.app[STORE].agents.register(principal.account_id, principal.key_id, name)
    agent_id, created, attached = done.agent_id, done.created, done.attached
    await key_changed(request.app, hash_key(credential(request)))     # cached principals carry the old agent
    note = ("key attached: usage on this key shows under the agent" if attached else
            "this key already belongs to another agent and stays with it")
    return json_response({"agent": {"id": agent_id, "name": name}, "key_attached": attached, "note": note},
                         status=201 if created else 200, headers=limit_headers)


@hookimpl
def gateway_register_routes(register, config):
    register("POST", "/api/v1/account/agents/register", register_agent)
