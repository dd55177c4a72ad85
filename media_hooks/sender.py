"""One destination's HTTP sender: the request exactly as CONTRACT.md says, and its outcome.

A ``Sender`` owns one pool of keep-alive connections for one destination URL and is safe to
call from the destination's worker threads at once. It never raises for a failed delivery:
every answer, timeout or refused connection comes back as an ``AttemptResult`` classified by
``media_hooks.outcomes``.

Requests go straight to urllib3's connection pool, the transport that ``requests`` itself
drives: a delivery needs none of the layers ``requests`` adds above it (sessions, cookies,
hooks, redirects, the proxy and certificate lookups redone on every send), and they cost
about as much CPU as the pool's own work (``bench/http_send.py``: about 200 µs of CPU a
request through ``requests``' adapter, about 115 µs through the pool). What the environment
configures is read once, at construction, with ``requests``' own rules: the proxy (``http_proxy``,
``no_proxy``...) and the CA bundle (``REQUESTS_CA_BUNDLE``, ``CURL_CA_BUNDLE``).

The SSRF guard runs on the address actually connected to, after DNS resolution, before a byte
is sent: a name that was public when the destination was added may resolve to a private
address now. Through an egress proxy the peer is the proxy, which resolves the name itself;
there the destination's name is resolved and checked before each request instead.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import certifi
import requests.utils
import urllib3
import urllib3.connection
import urllib3.connectionpool
import urllib3.exceptions
import urllib3.response

from media_hooks import crashpoints, outcomes, ssrf
from media_hooks.signing import decode_secret, sign

USER_AGENT = "media-hooks/0.1"
MAX_RESPONSE_READ_BYTES = 64 * 1024
MAX_EXCERPT_CHARS = 4 * 1024
_READ_CHUNK = 16 * 1024


@dataclass(frozen=True)
class AttemptResult:
    """What one HTTP attempt did: the row ``delivery_attempt`` records."""

    outcome: str
    http_status: int | None
    error: str | None
    response_excerpt: str | None
    retry_after_seconds: float | None
    disable_destination: bool
    started_at: datetime
    finished_at: datetime
    # False only when nothing can have reached the receiver (refused, DNS, SSRF guard...).
    request_sent: bool
    # The destination's configuration is at fault, not the delivery (the SSRF guard refused
    # the address): the worker disables the destination and spares the delivery's budget.
    configuration_fault: bool = False
    # When the attempt ended on this process's monotonic clock (the database stores its finish
    # time on its own clock, from how long ago this was).
    finished_monotonic: float = field(default_factory=time.monotonic)


class ForbiddenPeer(urllib3.exceptions.NewConnectionError, ssrf.ForbiddenAddress):
    """The connected address is one the SSRF guard refuses; the socket is closed unused."""

    def __init__(self, conn: Any, detail: str) -> None:
        super().__init__(conn, detail)
        self.detail = detail

    def __str__(self) -> str:
        return self.detail


class _PeerCheckedConnection:
    """Mixin for urllib3 connections: check the peer right after the TCP connect."""

    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()  # type: ignore[misc]
        address = sock.getpeername()[0]
        try:
            ssrf.check_address(address, allow_private=False)
        except ssrf.ForbiddenAddress as exc:
            sock.close()
            raise ForbiddenPeer(self, f"connected to {self.host}: {exc}") from None  # type: ignore[arg-type]
        return sock


class _CheckedHTTPConnection(_PeerCheckedConnection, urllib3.connection.HTTPConnection):
    pass


class _CheckedHTTPSConnection(_PeerCheckedConnection, urllib3.connection.HTTPSConnection):
    pass


class _CheckedHTTPPool(urllib3.connectionpool.HTTPConnectionPool):
    ConnectionCls = _CheckedHTTPConnection


class _CheckedHTTPSPool(urllib3.connectionpool.HTTPSConnectionPool):
    ConnectionCls = _CheckedHTTPSConnection


_GUARDED_POOLS = {"http": _CheckedHTTPPool, "https": _CheckedHTTPSPool}


def _tls_options() -> dict[str, str]:
    """Certificates as ``requests`` finds them: a bundle (file or folder) named by the
    environment, else certifi's."""
    bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    if bundle and os.path.isdir(bundle):
        return {"cert_reqs": "CERT_REQUIRED", "ca_cert_dir": bundle}
    return {"cert_reqs": "CERT_REQUIRED", "ca_certs": bundle or certifi.where()}


class _Route:
    """Where a destination's requests go: straight to its host's pool (the peer checked at
    connect unless private addresses are allowed), or through the environment's proxy.

    The proxy is looked up here, once; the transport is made on first use, so that a URL or a
    proxy setting urllib3 cannot use (a SOCKS proxy, no scheme) is each send's outcome, not a
    failure of the worker building its sender.
    """

    def __init__(self, url: str, allow_private: bool, max_in_flight: int) -> None:
        self.url = url
        self._proxy = requests.utils.select_proxy(url, requests.utils.get_environ_proxies(url))
        self.proxied = self._proxy is not None
        self._allow_private = allow_private
        self._max_in_flight = max(1, max_in_flight)
        self._lock = threading.Lock()
        self._manager: urllib3.PoolManager | None = None
        self._pool: urllib3.connectionpool.HTTPConnectionPool | None = None
        self._target = ""

    def _connect(self) -> urllib3.PoolManager:
        with self._lock:  # the destination's threads all send at once when a run starts
            if self._manager is None:
                options: dict[str, Any] = {"num_pools": 1, "maxsize": self._max_in_flight}
                options.update(_tls_options())
                if self.proxied:
                    manager = urllib3.ProxyManager(self._proxy, **options)
                else:
                    manager = urllib3.PoolManager(**options)
                    if not self._allow_private:
                        manager.pool_classes_by_scheme = _GUARDED_POOLS
                    self._target = urllib3.util.parse_url(self.url).request_uri
                    self._pool = manager.connection_from_url(self.url)
                self._manager = manager  # last: it says the pool and target are set
            return self._manager

    def open(self, body: bytes, headers: dict[str, str], timeout: urllib3.Timeout):
        """POST ``body``; the answer's body is left unread. Raises urllib3's errors."""
        manager = self._manager or self._connect()
        options = {
            "body": body,
            "headers": headers,
            "retries": False,
            "redirect": False,
            "timeout": timeout,
            "preload_content": False,
            "decode_content": False,
        }
        if self.proxied:
            return manager.urlopen("POST", self.url, **options)
        return self._pool.urlopen("POST", self._target, assert_same_host=False, **options)

    def close(self) -> None:
        if self._manager is not None:
            self._manager.clear()


def _now() -> datetime:
    return datetime.now(UTC)


def _storable(text: str) -> str:
    # PostgreSQL text cannot hold NUL, and a receiver chooses its body and reason phrase.
    return text.replace("\x00", "\ufffd")


def _excerpt(data: bytes) -> str | None:
    if not data:
        return None
    return _storable(data.decode("utf-8", errors="replace"))[:MAX_EXCERPT_CHARS]


class Sender:
    """Posts deliveries to one destination URL, signed with its active secrets."""

    def __init__(
        self,
        url: str,
        secrets: Sequence[str],
        timeout_seconds: float,
        allow_private: bool,
        max_in_flight: int = 4,
    ) -> None:
        for secret in secrets:
            decode_secret(secret)  # a malformed secret fails here, not on every send
        self.url = url
        self.timeout_seconds = timeout_seconds
        self._secrets = tuple(secrets)
        self._timeout = urllib3.Timeout(connect=timeout_seconds, read=timeout_seconds)
        self._route = _Route(url, allow_private, max_in_flight)
        self._check_name_each_send = not allow_private and self._route.proxied

    @property
    def worst_case_seconds(self) -> float:
        """The longest one ``send`` can take: connect, wait for the answer, read the body.

        A lease on a delivery must outlast this. (Each socket read is bounded by the timeout;
        a receiver trickling its status line and headers a byte at a time could stretch the
        wait further, which is why an expired lease is fenced, not trusted.)
        """
        return 3 * self.timeout_seconds

    def _headers(self, delivery_id: str, body: bytes) -> dict[str, str]:
        timestamp = int(time.time())
        headers = {
            "User-Agent": USER_AGENT,
            "Content-Type": "application/json",
            "webhook-id": delivery_id,
            "Idempotency-Key": delivery_id,
            "webhook-timestamp": str(timestamp),
        }
        if self._secrets:
            headers["webhook-signature"] = sign(self._secrets, delivery_id, timestamp, body)
        return headers

    def send(self, delivery_id: str, body: bytes) -> AttemptResult:
        """One attempt: POST the body, classify the answer. Never raises for a failed send."""
        started_at = _now()
        deadline = time.monotonic() + 2 * self.timeout_seconds
        try:
            if self._check_name_each_send:
                ssrf.check_url(self.url, allow_private=False)
            response = self._route.open(body, self._headers(delivery_id, body), self._timeout)
        except (urllib3.exceptions.HTTPError, ssrf.ForbiddenAddress) as exc:
            failure = outcomes.classify_failure(exc)
            return AttemptResult(
                outcome=failure.outcome,
                http_status=None,
                error=_storable(failure.error),
                response_excerpt=None,
                retry_after_seconds=None,
                disable_destination=False,
                started_at=started_at,
                finished_at=_now(),
                request_sent=failure.request_sent,
                configuration_fault=failure.configuration_fault,
            )
        crashpoints.hit(crashpoints.AFTER_RECEIVER_ACCEPTED)
        return self._answered(response, started_at, deadline)

    def _answered(
        self, response: urllib3.response.HTTPResponse, started_at: datetime, deadline: float
    ) -> AttemptResult:
        data, read_error = _read_limited(response, deadline)
        classification = outcomes.classify_response(response.status, response.headers)
        error = None
        if classification.outcome != outcomes.SUCCESS:
            error = _storable(f"HTTP {response.status} {response.reason or ''}".rstrip())
        if read_error:
            # The status line is the receiver's answer; a broken body does not change it.
            error = f"{error}; {read_error}" if error else read_error
        return AttemptResult(
            outcome=classification.outcome,
            http_status=response.status,
            error=error,
            response_excerpt=_excerpt(data),
            retry_after_seconds=classification.retry_after_seconds,
            disable_destination=classification.disable_destination,
            started_at=started_at,
            finished_at=_now(),
            request_sent=True,
        )

    def close(self) -> None:
        self._route.close()

    def __enter__(self) -> Sender:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _read_limited(
    response: urllib3.response.HTTPResponse, deadline: float
) -> tuple[bytes, str | None]:
    """At most 64 KiB of the body, stopping at the deadline; and why reading stopped early.

    A body read to its end hands the connection back to the pool (keep-alive); one cut short
    is closed, and its place in the pool freed.
    """
    chunks: list[bytes] = []
    size = 0
    ended = False
    try:
        while size < MAX_RESPONSE_READ_BYTES:
            if time.monotonic() > deadline:
                return b"".join(chunks), "response body read stopped at the deadline"
            chunk = response.read(min(_READ_CHUNK, MAX_RESPONSE_READ_BYTES - size))
            if not chunk:
                ended = True
                break
            chunks.append(chunk)
            size += len(chunk)
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        return b"".join(chunks), f"response body read failed: {type(exc).__name__}"
    finally:
        if not ended:
            response.close()
        response.release_conn()
    return b"".join(chunks), None
