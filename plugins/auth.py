"""API-key authentication: `Authorization: Bearer chk_...` or `x-api-key: chk_...`.

Keys are stored only as their SHA-256. A key is 32 random bytes, so a fast hash is
enough: there is nothing to guess, and the lookup stays cheap on the hot path. Found
keys are cached for a few seconds so a busy key does not cost a query per call.
"""
from __future__ import annotations

import hashlib
import secrets
import time

from . import hookimpl
from .appstate import STORE
from .context import CallContext, Principal
from .errors import GatewayError
from .keypolicy import policy_of

KEY_PREFIX = "chk_"
CACHE_SECONDS = 1.0         # another process (the CLI) revoking a key is seen within a second
_cache: dict[str, tuple[float, Principal]] = {}


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def display_prefix(key: str) -> str:
    return key[:12]


def credential(request) -> str | None:
    """The key a client sent, from either header, or None."""
    auth = request.headers.get("Authorization")
    if auth:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    key = request.headers.get("x-api-key")
    return key.strip() if key and key.strip() else None


async def principal_for(store, key: str) -> Principal | None:
    digest = hash_key(key)
    hit = _cache.get(digest)
    if hit and hit[0] > time.monotonic():
        return hit[1]
    found = await store.keys.get(digest)
    if found is None or found.revoked:
        _cache.pop(digest, None)
        return None
    principal = Principal(account_id=found.account_id, key_id=found.id, key_prefix=found.prefix,
                          agent_id=found.agent_id, policy=policy_of(found))
    _cache[digest] = (time.monotonic() + CACHE_SECONDS, principal)
    return principal


def forget(key_hash: str | None = None) -> None:
    """Drop cached keys (all, or one) after a change such as revocation or re-attachment."""
    if key_hash is None:
        _cache.clear()
    else:
        _cache.pop(key_hash, None)


async def authenticate_request(request) -> Principal | None:
    key = credential(request)
    if key is None:
        return None
    principal = await principal_for(request.app[STORE], key) if key.startswith(KEY_PREFIX) else None
    if principal is None:
        raise GatewayError(401, f"invalid API key {key[:8]}...: keys start with {KEY_PREFIX} and "
                                "come from the gateway operator", code="invalid_api_key")
    return principal


@hookimpl(trylast=True)
async def gateway_authenticate(ctx: CallContext):
    return await authenticate_request(ctx.request)
