"""The SSRF guard: destinations may not reach loopback, private, link-local or unspecified
addresses unless ``MEDIA_HOOKS_ALLOW_PRIVATE_URLS=1``.

Checked when a destination is added (every address its host resolves to) and again at send
time against the address actually connected to, since DNS can change in between.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class ForbiddenAddress(Exception):
    """The destination resolves to an address the guard refuses."""


def is_forbidden(address: IPAddress | str) -> bool:
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return (
        ip.is_loopback
        or ip.is_private
        or ip.is_link_local
        or ip.is_unspecified
        or ip.is_multicast
        or ip.is_reserved
    )


def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (raises socket.gaierror when it does not)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({info[4][0] for info in infos})


def check_address(address: str, allow_private: bool) -> None:
    if not allow_private and is_forbidden(address):
        raise ForbiddenAddress(
            f"{address} is a loopback, private, link-local or unspecified address; "
            "set MEDIA_HOOKS_ALLOW_PRIVATE_URLS=1 to allow it"
        )


def check_url(url: str, allow_private: bool) -> None:
    """Refuse a URL whose host resolves to any forbidden address."""
    parts = urlsplit(url)
    if allow_private or parts.hostname is None:
        return
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        addresses = resolve(parts.hostname, port)
    except (socket.gaierror, UnicodeError) as exc:
        raise ForbiddenAddress(f"host {parts.hostname!r} does not resolve ({exc})") from None
    for address in addresses:
        try:
            check_address(address, allow_private)
        except ForbiddenAddress as exc:
            raise ForbiddenAddress(f"{parts.hostname} resolves to {exc}") from None
