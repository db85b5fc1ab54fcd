"""The one address check for every URL the gateway did not configure itself.

A URL a client gave us (media references, chat `image_url`) or an upstream handed back
(fal's status and result URLs on another host) may point into the operator's network.
The rule, used everywhere: resolve the host, then refuse it unless every address is
global. "Global" is Python's `ipaddress.is_global` (which already excludes loopback,
private, link-local, the shared 100.64.0.0/10 range and reserved space), minus multicast,
and an IPv6 address that embeds an IPv4 one (IPv4-mapped, IPv4-compatible, 6to4, Teredo,
NAT64) is judged by the IPv4 address inside. Legacy literal forms (`127.1`, `2130706433`,
`0x7f000001`, `0177.0.0.1`) are read the way the C resolver reads them, and `localhost`
names (with or without the final dot) never leave the machine, so they are refused
without a lookup.
"""
from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import urlsplit

from plugins.errors import bad_request

NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
LOOKUP_SECONDS = 5.0


class UnsafeAddress(ValueError):
    """A host that leads to an address the gateway must not reach."""


def _embedded_v4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    found = [a for a in (ip.ipv4_mapped, ip.sixtofour) if a is not None]
    if ip.teredo:
        found += list(ip.teredo)
    if any(ip in net for net in NAT64) or (int(ip) >> 32 == 0 and int(ip) > 0xFFFF):  # NAT64, ::a.b.c.d
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return found


def blocked_ip(address: str | ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """True for any address that is not plainly global (see the module docstring)."""
    ip = ipaddress.ip_address(str(address).split("%", 1)[0]) if not isinstance(
        address, (ipaddress.IPv4Address, ipaddress.IPv6Address)) else address
    if ip.is_multicast or not ip.is_global:
        return True
    return isinstance(ip, ipaddress.IPv6Address) and any(blocked_ip(v4) for v4 in _embedded_v4(ip))


def literal_ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address a host names literally, in any form the C resolver accepts, or None."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))     # 127.1, 2130706433, 0x7f.1, 0177.0.0.1
    except (OSError, UnicodeError, ValueError):
        return None


def local_name(host: str) -> bool:
    name = host.rstrip(".").lower()
    return name == "localhost" or name.endswith(".localhost")


def check_host(host: str) -> None:
    """What can be refused without the network; raises UnsafeAddress."""
    if not host:
        raise UnsafeAddress("the URL has no host")
    if local_name(host):
        raise UnsafeAddress(f"{host} is this machine")
    literal = literal_ip(host)
    if literal is not None and blocked_ip(literal):
        raise UnsafeAddress(f"{host} is a private, loopback, link-local or reserved address")


async def resolve_checked(host: str, port: int = 443) -> list[str]:
    """Every address `host` resolves to, refusing the host if any of them is not global.
    Raises UnsafeAddress, or OSError when the name does not resolve."""
    check_host(host)
    loop = asyncio.get_running_loop()
    infos = await asyncio.wait_for(loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), LOOKUP_SECONDS)
    addresses = [info[4][0] for info in infos]
    if any(blocked_ip(a) for a in addresses):
        raise UnsafeAddress(f"{host} resolves to a private, loopback or reserved address")
    return addresses


def check_url(url: str, field: str, *, allow_private: bool) -> None:
    """Refuse what can be refused without the network: a scheme other than https (or
    data:), and hosts that are local by name or by literal address. 400 naming `field`."""
    if url.startswith("data:"):
        return
    parts = urlsplit(url)
    if parts.scheme != "https" and not (allow_private and parts.scheme == "http"):
        raise bad_request(f"{field}: only https and data: URLs are accepted", param=field)
    if allow_private:
        if not parts.hostname:
            raise bad_request(f"{field}: the URL has no host", param=field)
        return
    try:
        check_host(parts.hostname or "")
    except UnsafeAddress as exc:
        raise bad_request(f"{field}: {exc}; private, loopback and link-local addresses are not fetched",
                          param=field) from None


async def check_url_resolved(url: str, field: str, *, allow_private: bool) -> None:
    """`check_url`, then resolve the host and refuse it if it leads anywhere non-global.
    For URLs the gateway passes on rather than fetches: a name that does not resolve here
    cannot reach our network either, so it passes (whoever fetches it will fail)."""
    check_url(url, field, allow_private=allow_private)
    if allow_private or url.startswith("data:"):
        return
    parts = urlsplit(url)
    try:
        await resolve_checked(parts.hostname or "", parts.port or 443)
    except UnsafeAddress as exc:
        raise bad_request(f"{field}: {exc}; private, loopback and link-local addresses are not fetched",
                          param=field) from None
    except (OSError, asyncio.TimeoutError):
        return
