"""The SSRF guard: a destination may reach only globally reachable addresses, unless it was
added with ``--allow-private-url`` (it alone) or ``MEDIA_HOOKS_ALLOW_PRIVATE_URLS=1`` (all).

Refused: every range of the IANA IPv4 and IPv6 Special-Purpose Address Registries that is not
globally reachable (private, shared/CGN, loopback, link-local, documentation, benchmarking, the
IETF protocol blocks, ...), multicast, the reserved IPv4 space, the deprecated site-local IPv6
range, and IPv6 outside global unicast (2000::/3). An IPv6 address that carries an IPv4 address
is judged by the address it carries: IPv4-mapped (::ffff:a.b.c.d), the NAT64 well-known prefix
(64:ff9b::/96) and 6to4 (2002::/16), whose traffic ends up at that IPv4 host; Teredo
(2001::/32) and the deprecated IPv4-compatible form (::a.b.c.d) are refused outright, and the
message names what they carry. The few special-purpose addresses the registry marks globally
reachable (anycast services such as 192.0.0.9 or 2001:1::1) are allowed.

Checked when a destination is added (every address its host resolves to: ``getaddrinfo`` reads
``2130706433``, ``0x7f.1`` or ``127.1`` as 127.0.0.1 just as the connection would) and again at
send time against the address actually connected to, since DNS can change in between.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import unquote, urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
SETTING = "MEDIA_HOOKS_ALLOW_PRIVATE_URLS"


class ForbiddenAddress(Exception):
    """The destination resolves to an address the guard refuses."""


def _table(rows: list[tuple[str, str]]) -> list[tuple[ipaddress._BaseNetwork, str]]:
    return [(ipaddress.ip_network(network), name) for network, name in rows]


# IANA IPv4 Special-Purpose Address Registry, the rows not globally reachable; plus multicast.
_IPV4_REFUSED = _table(
    [
        ("0.0.0.0/8", '"this network", RFC 791'),
        ("10.0.0.0/8", "private use, RFC 1918"),
        ("100.64.0.0/10", "shared address space, carrier-grade NAT, RFC 6598"),
        ("127.0.0.0/8", "loopback, RFC 1122"),
        ("169.254.0.0/16", "link-local, cloud metadata services, RFC 3927"),
        ("172.16.0.0/12", "private use, RFC 1918"),
        ("192.0.0.0/24", "IETF protocol assignments, RFC 6890"),
        ("192.0.2.0/24", "documentation, TEST-NET-1, RFC 5737"),
        ("192.88.99.0/24", "deprecated 6to4 relay anycast, RFC 7526"),
        ("192.168.0.0/16", "private use, RFC 1918"),
        ("198.18.0.0/15", "benchmarking, RFC 2544"),
        ("198.51.100.0/24", "documentation, TEST-NET-2, RFC 5737"),
        ("203.0.113.0/24", "documentation, TEST-NET-3, RFC 5737"),
        ("224.0.0.0/4", "multicast, RFC 5771"),
        ("240.0.0.0/4", "reserved, including the limited broadcast address, RFC 1112"),
    ]
)
# Inside refused IPv4 blocks, the registry's globally reachable exceptions.
_IPV4_ALLOWED = _table(
    [
        ("192.0.0.9/32", "port control protocol anycast, RFC 7723"),
        ("192.0.0.10/32", "traversal using relays around NAT anycast, RFC 8155"),
    ]
)
# IANA IPv6 Special-Purpose Address Registry, the rows not globally reachable, the deprecated
# site-local range and multicast; everything outside 2000::/3 is refused as well.
_IPV6_REFUSED = _table(
    [
        ("::1/128", "loopback, RFC 4291"),
        ("::/128", "unspecified, RFC 4291"),
        ("64:ff9b:1::/48", "local-use IPv4/IPv6 translation, RFC 8215"),
        ("100::/64", "discard-only, RFC 6666"),
        ("100:0:0:1::/64", "dummy prefix, RFC 9780"),
        ("2001::/23", "IETF protocol assignments, RFC 2928"),
        ("2001:db8::/32", "documentation, RFC 3849"),
        ("3fff::/20", "documentation, RFC 9637"),
        ("5f00::/16", "segment routing SIDs, RFC 9602"),
        ("fc00::/7", "unique local, RFC 4193"),
        ("fe80::/10", "link-local, RFC 4291"),
        ("fec0::/10", "site-local, deprecated, RFC 3879"),
        ("ff00::/8", "multicast, RFC 4291"),
    ]
)
_IPV6_ALLOWED = _table(
    [
        ("2001:1::1/128", "port control protocol anycast, RFC 7723"),
        ("2001:1::2/128", "traversal using relays around NAT anycast, RFC 8155"),
        ("2001:1::3/128", "DNS-SD service registration protocol anycast, RFC 9665"),
        ("2001:3::/32", "AMT, RFC 7450"),
        ("2001:4:112::/48", "AS112-v6, RFC 7535"),
        ("2001:20::/28", "ORCHIDv2, RFC 7343"),
        ("2001:30::/28", "drone remote ID protocol entity tags, RFC 9374"),
    ]
)
_GLOBAL_UNICAST = ipaddress.ip_network("2000::/3")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
_TEREDO = ipaddress.ip_network("2001::/32")


def _match(ip: IPAddress, table: list[tuple[ipaddress._BaseNetwork, str]]) -> str | None:
    for network, name in table:
        if ip in network:
            return f"{network} ({name})"
    return None


def _ipv4_range(ip: ipaddress.IPv4Address) -> str | None:
    """The refused range ``ip`` is in, named."""
    if _match(ip, _IPV4_ALLOWED):
        return None
    return _match(ip, _IPV4_REFUSED)


def _carried(ip: ipaddress.IPv6Address) -> tuple[str, ipaddress.IPv4Address] | None:
    """The IPv4 address an IPv6 address delivers to, and how it carries it."""
    if ip.ipv4_mapped is not None:
        return "an IPv4-mapped address", ip.ipv4_mapped
    if ip in _NAT64:
        return "a NAT64 address (64:ff9b::/96)", ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.sixtofour is not None:
        return "a 6to4 address (2002::/16)", ip.sixtofour
    return None


def _ipv6_verdict(ip: ipaddress.IPv6Address) -> str | None:
    carried = _carried(ip)
    if carried is not None:
        how, inner = carried
        found = _ipv4_range(inner)
        return f"{ip} is {how} of {inner}, which is in {found}" if found else None
    if ip in _TEREDO:
        server, client = ip.teredo
        return f"{ip} is a Teredo tunnel address (2001::/32) of server {server}, client {client}"
    if ip in _IPV4_COMPATIBLE:
        found = _match(ip, _IPV6_REFUSED)
        if found:
            return f"{ip} is in {found}"
        inner = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        return f"{ip} is a deprecated IPv4-compatible address (::/96, RFC 4291) of {inner}"
    if _match(ip, _IPV6_ALLOWED):
        return None
    found = _match(ip, _IPV6_REFUSED)
    if found:
        return f"{ip} is in {found}"
    if ip not in _GLOBAL_UNICAST:
        return f"{ip} is outside IPv6 global unicast (2000::/3)"
    return None


def refusal(address: IPAddress | str) -> str | None:
    """Why the guard refuses ``address``, or None when it is globally reachable."""
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    if isinstance(ip, ipaddress.IPv6Address):
        return _ipv6_verdict(ip.__class__(int(ip)))  # without any %zone
    found = _ipv4_range(ip)
    return f"{ip} is in {found}" if found else None


def is_forbidden(address: IPAddress | str) -> bool:
    return refusal(address) is not None


def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (raises socket.gaierror when it does not)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({info[4][0] for info in infos})


def check_address(address: str, allow_private: bool) -> None:
    if allow_private:
        return
    why = refusal(address)
    if why is not None:
        raise ForbiddenAddress(
            f"{why}: not globally reachable; to allow it for this destination only, add it with "
            f"--allow-private-url (or set {SETTING}=1 for every destination)"
        )


def check_url(url: str, allow_private: bool) -> None:
    """Refuse a URL whose host resolves to any forbidden address."""
    parts = urlsplit(url)
    if allow_private or parts.hostname is None:
        return
    port = parts.port or (443 if parts.scheme == "https" else 80)
    # Percent-encoding is decoded as the HTTP client decodes it (an IPv6 zone is "%25eth0").
    host = unquote(parts.hostname)
    try:
        addresses = resolve(host, port)
    except (socket.gaierror, UnicodeError) as exc:
        raise ForbiddenAddress(f"host {parts.hostname!r} does not resolve ({exc})") from None
    for address in addresses:
        try:
            check_address(address, allow_private)
        except ForbiddenAddress as exc:
            if ipaddress.ip_address(address) == _literal(host):
                raise  # an address given as itself: "X resolves to X" says nothing more
            raise ForbiddenAddress(f"{parts.hostname} resolves to {exc}") from None


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def describe_setting(allow_private: bool, allowed_destinations: list[str] | None = None) -> str:
    """The guard's effective setting, in one line (``media-hooks dev`` prints it), naming the
    destinations added with ``--allow-private-url``."""
    if allow_private:
        return (
            f"SSRF guard: off ({SETTING}=1): destinations may reach loopback, private and "
            "link-local addresses"
        )
    lines = [
        "SSRF guard: on: destinations may reach only globally reachable addresses (checked when "
        "added and when a run connects)",
        "  local destinations (a receiver on 127.0.0.1, a private network) will be refused, and "
        "disabled by the run that tries them: allow one with `media-hooks destination add ID "
        f"--url URL --allow-private-url`, or every one with {SETTING}=1 (development only)",
    ]
    if allowed_destinations:
        lines.append(f"  allowed private addresses: {', '.join(allowed_destinations)}")
    return "\n".join(lines)
