"""The SSRF guard (media_hooks.http.ssrf): every special-purpose range that is not globally
reachable, every embedding of one, under every spelling a URL can give it (issue 11, part 2).

Spellings are resolved the way the connection resolves them (getaddrinfo, numeric only here:
these tests make no DNS query), so a refusal at add time is a refusal of what would be
connected to.
"""

from __future__ import annotations

import ipaddress
import socket

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from media_hooks.http import ssrf
from media_hooks.http.ssrf import ForbiddenAddress, check_url, is_forbidden, refusal

FAST = settings(max_examples=300, deadline=None)


@pytest.fixture(autouse=True)
def numeric_only(monkeypatch):
    """getaddrinfo parses literals only: a spelling that needed DNS would fail loudly here."""
    real = socket.getaddrinfo

    def numeric(host, port, *args, **kwargs):
        kwargs["flags"] = kwargs.get("flags", 0) | socket.AI_NUMERICHOST
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(ssrf.socket, "getaddrinfo", numeric)


REFUSED_V4 = (
    st.sampled_from(ssrf._IPV4_REFUSED)
    .flatmap(
        lambda row: st.integers(0, row[0].num_addresses - 1).map(
            lambda offset: row[0].network_address + offset
        )
    )
    .filter(lambda ip: not any(ip in net for net, _ in ssrf._IPV4_ALLOWED))
)
REFUSED_V6 = (
    st.sampled_from(ssrf._IPV6_REFUSED)
    .flatmap(
        lambda row: st.integers(0, min(row[0].num_addresses, 2**64) - 1).map(
            lambda offset: row[0].network_address + offset
        )
    )
    .filter(lambda ip: not any(ip in net for net, _ in ssrf._IPV6_ALLOWED))
)
GLOBAL_V4 = (
    st.integers(0, 2**32 - 1)
    .map(ipaddress.IPv4Address)
    .filter(lambda ip: not any(ip in net for net, _ in ssrf._IPV4_REFUSED))
)


def _spellings_v4(ip: ipaddress.IPv4Address) -> st.SearchStrategy[str]:
    """Host spellings an inet_aton-style parser (getaddrinfo, so the connection) reads as ip."""
    n = int(ip)
    a, b, c, d = ip.packed

    def part(value: int, style: str) -> str:
        return {"dec": str(value), "hex": hex(value), "HEX": f"0X{value:X}", "oct": f"0{value:o}"}[
            style
        ]

    style = st.sampled_from(["dec", "hex", "HEX", "oct"])
    return st.one_of(
        st.just(str(ip)),
        style.map(lambda s: part(n, s)),  # one 32-bit number
        st.tuples(style, style).map(lambda s: f"{part(a, s[0])}.{part(n & 0xFFFFFF, s[1])}"),
        st.tuples(style, style, style).map(
            lambda s: f"{part(a, s[0])}.{part(b, s[1])}.{part(n & 0xFFFF, s[2])}"
        ),
        st.tuples(style, style, style, style).map(
            lambda s: ".".join(part(v, x) for v, x in zip((a, b, c, d), s, strict=True))
        ),
    )


def _embeddings(ip: ipaddress.IPv4Address) -> st.SearchStrategy[str]:
    """IPv6 addresses that deliver to ip (mapped, NAT64, 6to4), spelled in several ways."""
    n = int(ip)
    hi, lo = n >> 16, n & 0xFFFF
    forms = [
        f"::ffff:{ip}",
        f"::ffff:{hi:x}:{lo:x}",
        f"0:0:0:0:0:FFFF:{hi:04X}:{lo:04X}",
        f"64:ff9b::{ip}",
        f"64:ff9b::{hi:x}:{lo:x}",
        f"0064:FF9B:0000:0000:0000:0000:{hi:04x}:{lo:04x}",
        f"2002:{hi:x}:{lo:x}::",
        f"2002:{hi:04X}:{lo:04X}:1:2:3:4:5",
    ]
    return st.sampled_from(forms)


def _url(host: str) -> str:
    return f"http://[{host}]:8080/hook" if ":" in host else f"http://{host}:8080/hook"


def _refused(url: str) -> str:
    with pytest.raises(ForbiddenAddress) as refused:
        check_url(url, allow_private=False)
    return str(refused.value)


@FAST
@given(REFUSED_V4.flatmap(_spellings_v4))
def test_every_spelling_of_a_refused_ipv4_address_is_refused(host):
    message = _refused(_url(host))
    assert "not globally reachable; to allow it for this destination only, add it with " in message
    assert "--allow-private-url (or set MEDIA_HOOKS_ALLOW_PRIVATE_URLS=1" in message


@FAST
@given(REFUSED_V4.flatmap(_embeddings))
def test_every_embedding_of_a_refused_ipv4_address_is_refused(host):
    assert "which is in" in _refused(_url(host))


@FAST
@given(GLOBAL_V4.flatmap(lambda ip: st.one_of(_spellings_v4(ip), _embeddings(ip))))
def test_globally_reachable_ipv4_addresses_pass_however_spelled(host):
    check_url(_url(host), allow_private=False)


@FAST
@given(REFUSED_V6, st.booleans())
def test_every_refused_ipv6_range_is_refused(ip, exploded):
    host = ip.exploded.upper() if exploded else ip.compressed
    assert is_forbidden(host)
    _refused(_url(host))


@FAST
@given(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.integers(0, 2**16 - 1))
def test_teredo_addresses_are_refused_naming_what_they_carry(server, client, flags):
    ip = ipaddress.IPv6Address((0x20010000 << 96) | (server << 64) | (flags << 48) | client)
    why = refusal(ip)
    assert why is not None and "Teredo" in why
    assert str(ipaddress.IPv4Address(server)) in why


@FAST
@given(st.integers(0, 2**128 - 1))
def test_ipv6_outside_global_unicast_is_refused_unless_it_carries_a_global_ipv4(n):
    ip = ipaddress.IPv6Address(n)
    assume(ip not in ssrf._GLOBAL_UNICAST)
    carried = ssrf._carried(ip)
    if carried is None:
        assert is_forbidden(ip)
    else:
        assert is_forbidden(ip) == is_forbidden(carried[1])


@FAST
@given(st.integers(0, 2**32 - 1))
def test_ipv4_compatible_addresses_are_refused(n):
    assert is_forbidden(ipaddress.IPv6Address(n))


@pytest.mark.parametrize(
    ("url", "why"),
    [
        # The addresses the issue reproduced.
        ("http://100.100.100.200/latest/meta-data/", "100.64.0.0/10 (shared address space"),
        ("http://100.64.0.1/", "carrier-grade NAT"),
        ("http://[2002:7f00:1::1]/", "6to4 address (2002::/16) of 127.0.0.1"),
        ("http://[2002:a9fe:a9fe::]/", "6to4 address (2002::/16) of 169.254.169.254"),
        ("http://[fec0::1]/", "fec0::/10 (site-local"),
        ("http://192.0.0.8/", "192.0.0.0/24 (IETF protocol assignments"),
        # And the classics.
        ("http://127.0.0.1:8080/hook", "loopback"),
        ("http://2130706433/", "127.0.0.1 is in 127.0.0.0/8"),
        ("http://0x7f.1/", "127.0.0.1 is in 127.0.0.0/8"),
        ("http://169.254.169.254/latest/meta-data", "link-local"),
        ("http://[::ffff:169.254.169.254]/", "IPv4-mapped address of 169.254.169.254"),
        ("http://[64:ff9b::10.0.0.1]/", "NAT64 address (64:ff9b::/96) of 10.0.0.1"),
        ("http://[::127.0.0.1]/", "IPv4-compatible"),
        ("http://[fe80::1%25lo]/", "fe80::/10 (link-local"),
        ("http://[fd00::1]/", "fc00::/7 (unique local"),
        ("http://[2001:db8::1]/", "2001:db8::/32 (documentation"),
        ("http://[3fff::1]/", "3fff::/20 (documentation"),
        ("http://0.0.0.0/", '"this network"'),
        ("http://255.255.255.255/", "limited broadcast"),
        ("http://224.0.0.1/", "multicast"),
        ("http://198.18.0.1/", "benchmarking"),
    ],
)
def test_refused_urls_name_the_range(url, why):
    message = _refused(url)
    assert why in message
    check_url(url, allow_private=True)


@pytest.mark.parametrize(
    "address",
    [
        "93.184.216.34",
        "8.8.8.8",
        "2606:4700:4700::1111",
        "192.0.0.9",
        "2001:1::1",
        "2002:808:808::",
    ],
)
def test_globally_reachable_addresses_are_allowed(address):
    assert refusal(address) is None


def test_public_ip_literal_needs_no_network():
    # The autouse fixture makes every lookup numeric-only: a literal passes without DNS.
    check_url("https://93.184.216.34/hooks", allow_private=False)


def test_unresolvable_host_is_refused(monkeypatch):
    with pytest.raises(ForbiddenAddress, match="does not resolve"):
        check_url("https://no-such-host.invalid/hook", allow_private=False)


def test_the_effective_setting_leads_and_a_guarded_one_says_how_local_destinations_pass():
    on, off = ssrf.describe_setting(False), ssrf.describe_setting(True)
    assert on.startswith("SSRF guard: on") and "\n" not in off
    assert "local destinations (a receiver on 127.0.0.1, a private network) will be refused" in on
    assert "--allow-private-url" in on and "MEDIA_HOOKS_ALLOW_PRIVATE_URLS=1" in on
    assert off.startswith("SSRF guard: off (MEDIA_HOOKS_ALLOW_PRIVATE_URLS=1)")
    named = ssrf.describe_setting(False, ["mine", "lab"])
    assert named.splitlines()[-1] == "  allowed private addresses: mine, lab"
