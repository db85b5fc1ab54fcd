"""Fetching URLs that clients gave us, safely.

Only https and data: URLs. Host names are resolved by a resolver that refuses every
address plugins/netguard.py does not call global, and the connection goes to the
address it checked, so DNS rebinding cannot slip past the check. Sizes and times are
capped. `media.allow_private_urls: true` lifts the address rule (for tests on loopback).
"""
from __future__ import annotations

import base64
import binascii
import socket

import aiohttp
from aiohttp.abc import AbstractResolver
from aiohttp.resolver import ThreadedResolver

from plugins.errors import GatewayError, bad_request
from plugins.netguard import UnsafeAddress, blocked_ip, check_host, check_url

__all__ = ["GuardedResolver", "guarded_session", "check_url", "decode_data_url", "fetch"]


class GuardedResolver(AbstractResolver):
    """Resolves like the system, but refuses names that lead to internal addresses."""

    def __init__(self):
        self.inner = ThreadedResolver()

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET):
        try:
            check_host(host)
        except UnsafeAddress:
            raise OSError(f"{host} resolves to a private or local address") from None
        results = await self.inner.resolve(host, port, family)
        if any(blocked_ip(r["host"]) for r in results):
            raise OSError(f"{host} resolves to a private or local address")
        return results

    async def close(self) -> None:
        await self.inner.close()


def guarded_session(allow_private: bool) -> aiohttp.ClientSession:
    """The session for client-given and upstream-result URLs (its own resolver policy)."""
    resolver = ThreadedResolver() if allow_private else GuardedResolver()
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(resolver=resolver, limit=100),
                                 timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))


def decode_data_url(url: str, field: str, max_bytes: int) -> tuple[bytes, str]:
    header, _, data = url.partition(",")
    if ";base64" not in header:
        raise bad_request(f"{field}: data: URLs must be base64", param=field)
    if len(data) * 3 // 4 > max_bytes:
        raise bad_request(f"{field}: larger than {max_bytes // 1_000_000} MB", param=field)
    try:
        return base64.b64decode(data, validate=True), header[5:].split(";", 1)[0] or "application/octet-stream"
    except (binascii.Error, ValueError):
        raise bad_request(f"{field}: the data: URL is not valid base64", param=field) from None


async def fetch(session: aiohttp.ClientSession, url: str, field: str, *, max_bytes: int, timeout: float,
                allow_private: bool, status: int = 400) -> tuple[bytes, str]:
    """-> (bytes, content type). Failures are `status` errors naming the field."""
    if url.startswith("data:"):
        return decode_data_url(url, field, max_bytes)
    try:
        check_url(url, field, allow_private=allow_private)
    except GatewayError as err:        # a bad result URL is the upstream's fault, not the client's
        raise GatewayError(status, err.message, param=field) from None
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout), allow_redirects=False) as resp:
            if resp.status != 200:
                raise GatewayError(status, f"{field}: fetching it answered HTTP {resp.status}", param=field)
            chunks, size = [], 0
            async for chunk in resp.content.iter_chunked(65536):
                size += len(chunk)
                if size > max_bytes:
                    raise GatewayError(status, f"{field}: larger than {max_bytes // 1_000_000} MB", param=field)
                chunks.append(chunk)
            return b"".join(chunks), resp.headers.get("Content-Type", "application/octet-stream").split(";")[0]
    except TimeoutError:
        raise GatewayError(status, f"{field}: fetching it took longer than {timeout:g} s", param=field) from None
    except aiohttp.ClientError as exc:
        raise GatewayError(status, f"{field}: could not fetch it ({exc})", param=field) from None
