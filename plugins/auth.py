"""API-key authentication: `Authorization: Bearer chk_...` or `x-api-key: chk_...`.

Keys are stored only as their SHA-256. A key is 32 random bytes, so a fast hash is
enough: there is nothing to guess, and the lookup stays cheap on the hot path. Found
keys are cached (plugins/keycache.py), and a change to a key reaches every process's
cache within a second.
"""
from __future__ import annotations

import hashlib
import secrets

from . import hookimpl, keycache
from .appstate import STORE
from .context import CallContext, Principal
from .errors import GatewayError
from .keycache import KEYCACHE
from .keypolicy import policy_of

KEY_PREFIX = "chk_"


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def display_prefix(key: str) -> str:
    return key[:12]


def credential(request) -> str | None:
    """The key a client sent, from either header, or None."""
    auth = request.headers.get("Authorization")
    key = request.headers.get("x-api-key")
    if auth:
        scheme, _, value = auth.strip().partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        if not (key and key.strip()):      # a key sent the wrong way is not "no key" (402 / x402)
            raise GatewayError(401, "send the API key as `Authorization: Bearer chk_...` or `x-api-key: chk_...`; "
                                    "this Authorization header has no Bearer scheme", code="invalid_authorization")
    return key.strip() if key and key.strip() else None


async def _load(store, digest: str) -> Principal | None:
    found = await store.keys.get(digest)
    if found is None or found.revoked:
        return None
    return Principal(account_id=found.account_id, key_id=found.id, key_prefix=found.prefix, agent_id=found.agent_id,
                     policy=policy_of(found))


async def principal_for(app, key: str) -> Principal | None:
    digest = hash_key(key)
    return await app[KEYCACHE].get(digest, lambda: _load(app[STORE], digest))


async def key_changed(app, key_hash: str | None = None) -> None:
    """After a change to a key (revoked, given an agent; None: possibly any key): every
    process stops using what it cached."""
    await app[KEYCACHE].changed(key_hash)


@hookimpl
def gateway_configure(app, config):
    keycache.install(app)


async def authenticate_request(request) -> Principal | None:
    key = credential(request)
    if key is None:
        return None
    principal = await principal_for(request.app, key) if key.startswith(KEY_PREFIX) else None
    if principal is None:
        raise GatewayError(401, f"invalid API key {key[:8]}...: keys start with {KEY_PREFIX} and "
                                "come from the gateway operator", code="invalid_api_key")
    return principal


@hookimpl(trylast=True)
def gateway_authenticate(ctx: CallContext):
    return authenticate_request(ctx.request)        # its coroutine, awaited by the pipeline
