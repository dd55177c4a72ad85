"""The SSRF guard (media_hooks.ssrf): which addresses it refuses, and that IP literals need no DNS."""

from __future__ import annotations

import socket

import pytest

from media_hooks import ssrf
from media_hooks.ssrf import ForbiddenAddress, check_url, is_forbidden


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.8.9.10",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",  # cloud metadata
        "0.0.0.0",
        "::1",
        "::",
        "fe80::1",
        "fc00::1",
        "::ffff:127.0.0.1",  # IPv4-mapped loopback
        "::ffff:10.0.0.1",
        "224.0.0.1",
    ],
)
def test_forbidden_addresses(address):
    assert is_forbidden(address)


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111"])
def test_public_addresses_are_allowed(address):
    assert not is_forbidden(address)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/hook",
        "https://10.0.0.5/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://localhost:9000/",
        "http://[::1]:8000/",
        "http://0.0.0.0/",
    ],
)
def test_private_urls_refused_unless_allowed(url):
    with pytest.raises(ForbiddenAddress, match="MEDIA_HOOKS_ALLOW_PRIVATE_URLS=1"):
        check_url(url, allow_private=False)
    check_url(url, allow_private=True)


def test_public_ip_literal_needs_no_network(monkeypatch):
    # getaddrinfo on an IP literal is a parse, not a lookup: prove nothing else is reached.
    def no_dns(*_args, **_kwargs):
        raise AssertionError("a name lookup was attempted")

    real = socket.getaddrinfo

    def literal_only(host, *args, **kwargs):
        try:
            socket.inet_pton(socket.AF_INET, host)
        except OSError:
            return no_dns()
        return real(host, *args, **kwargs)

    monkeypatch.setattr(ssrf.socket, "getaddrinfo", literal_only)
    check_url("https://93.184.216.34/hooks", allow_private=False)


def test_unresolvable_host_is_refused():
    with pytest.raises(ForbiddenAddress, match="does not resolve"):
        check_url("https://no-such-host.invalid/hook", allow_private=False)
