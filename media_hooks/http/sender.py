"""One destination's HTTP sender: the request exactly as the contract says (docs/contract.md),
and its outcome.

A ``Sender`` owns one aiohttp session, a pool of at most ``max_in_flight`` keep-alive
connections, for one destination URL. Its requests run on a ``SendLoop`` that the whole
delivery run shares (media_hooks.http.send_loop says why an event loop); ``submit`` may be called
from any thread and returns a future at once, ``send`` waits for it. Neither raises for a
failed delivery: every answer, timeout or refused connection comes back as an
``AttemptResult`` classified by ``media_hooks.http.outcomes``.

What the environment configures is read once, at construction, with ``requests``' own rules:
the proxy (``http_proxy``, ``no_proxy``...) and the CA bundle (``REQUESTS_CA_BUNDLE``,
``CURL_CA_BUNDLE``, else certifi's). Nothing else of the environment is used (no .netrc, no
cookies kept between deliveries, no redirect followed, no body decompressed).

The SSRF guard judges each address a connection is about to be made to, after DNS resolution:
the connector makes its sockets through ``_guarded_socket``, so a name that was public when
the destination was added but resolves to a private address now is refused before a packet
leaves. Addresses are tried in turn, and the first refused one ends the attempt. Through an
egress proxy the peer is the proxy, which resolves the name itself; there the destination's
name is resolved and checked before each request instead.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import urlsplit

import aiohttp
import certifi
import requests.utils

from media_hooks.core import crashpoints
from media_hooks.http import outcomes, ssrf
from media_hooks.http.send_loop import SendLoop
from media_hooks.http.signing import decode_secret, sign

log = logging.getLogger("media_hooks")

USER_AGENT = "media-hooks/0.1"
MAX_RESPONSE_READ_BYTES = 64 * 1024
MAX_EXCERPT_CHARS = 4 * 1024
_READ_CHUNK = 16 * 1024
_PROXY_SCHEMES = ("http", "https")


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


_TLS_LOCK = threading.Lock()


def _tls_context(cafile: str | None, capath: str | None) -> ssl.SSLContext:
    # Loading a bundle costs 20-35 ms of CPU: one context per bundle serves every destination,
    # and the lock keeps a run's workers, starting together, from each loading it.
    with _TLS_LOCK:
        return _loaded_tls_context(cafile, capath)


@functools.cache
def _loaded_tls_context(cafile: str | None, capath: str | None) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=cafile, capath=capath)


def _tls_trust() -> tuple[str | None, str | None]:
    """Certificates as ``requests`` finds them: a bundle (file or folder) named by the
    environment, else certifi's. (file, folder)."""
    bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    if bundle and os.path.isdir(bundle):
        return None, bundle
    return bundle or certifi.where(), None


def _environment_proxy(url: str) -> str | None:
    proxy = requests.utils.select_proxy(url, requests.utils.get_environ_proxies(url))
    return requests.utils.prepend_scheme_if_needed(proxy, "http") if proxy else None


def _unusable_proxy(proxy: str | None) -> str | None:
    """Why the environment's proxy cannot carry a request (a SOCKS proxy), without its
    credentials; None when it can, or when there is none."""
    if proxy is None:
        return None
    scheme = urlsplit(proxy).scheme
    if scheme in _PROXY_SCHEMES:
        return None
    return f"the environment's proxy is a {scheme} proxy; only http and https proxies are supported"


def _now() -> datetime:
    return datetime.now(UTC)


def _storable(text: str) -> str:
    # PostgreSQL text cannot hold NUL, and a receiver chooses its body and reason phrase.
    return text.replace("\x00", "\ufffd")


def _excerpt(data: bytes) -> str | None:
    if not data:
        return None
    return _storable(data.decode("utf-8", errors="replace"))[:MAX_EXCERPT_CHARS]


# Everything a request can fail with that says something about the receiver or the network;
# anything else is a bug in the sender (see Sender._attempt).
_TRANSPORT_FAILURES = (aiohttp.ClientError, asyncio.TimeoutError, OSError, ssrf.ForbiddenAddress)


class Sender:
    """Posts deliveries to one destination URL, signed with its active secrets."""

    def __init__(
        self,
        url: str,
        secrets: Sequence[str],
        timeout_seconds: float,
        allow_private: bool,
        max_in_flight: int = 4,
        loop: SendLoop | None = None,
    ) -> None:
        for secret in secrets:
            decode_secret(secret)  # a malformed secret fails here, not on every send
        self.url = url
        self.timeout_seconds = timeout_seconds
        self._secrets = tuple(secrets)
        self._host = urlsplit(url).hostname or url
        self._proxy = _environment_proxy(url)
        # A proxy the transport cannot use is each send's outcome, not a failure to build the
        # sender: the worker records it instead of failing its batch.
        self._unusable = _unusable_proxy(self._proxy)
        self._guard_sockets = not allow_private and self._proxy is None
        self._check_name_each_send = not allow_private and self._proxy is not None
        # Built here, on the caller's thread: loading a bundle on the loop would hold up every
        # request in flight there (the first sends of a run arrived 20-60 ms late, bunched
        # against the destinations' rate envelopes).
        self._tls = _tls_context(*_tls_trust())
        self._max_in_flight = max(1, max_in_flight)
        self._owns_loop = loop is None
        self._loop = loop or SendLoop(name="send-loop-" + self._host)
        # Made on the loop by the first request (aiohttp sessions belong to their loop).
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    @property
    def worst_case_seconds(self) -> float:
        """The longest one ``send`` can take: connect, wait for the answer, read the body.

        A lease on a delivery must outlast this. (Each socket read is bounded by the timeout;
        a receiver trickling its status line and headers a byte at a time could stretch the
        wait further, which is why an expired lease is fenced, not trusted.)
        """
        return 3 * self.timeout_seconds

    def submit(self, delivery_id: str, body: bytes) -> Future[AttemptResult]:
        """Start one attempt on the loop; its future never holds an exception."""
        return self._loop.submit(self._attempt(delivery_id, body))

    def send(self, delivery_id: str, body: bytes) -> AttemptResult:
        """One attempt, waited for: POST the body, classify the answer."""
        return self.submit(delivery_id, body).result()

    def close(self) -> None:
        """Close the connections (after the requests in flight: callers wait for them)."""
        if self._closed:
            return
        self._closed = True
        self._loop.run(self._close_session())
        if self._owns_loop:
            self._loop.close()

    def __enter__(self) -> Sender:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # On the loop ---------------------------------------------------------------------------

    async def _close_session(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _open_session(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=self._max_in_flight,
            ssl=self._tls,
            # Addresses in turn rather than raced, so that the guard's refusal of one ends the
            # attempt with its reason instead of being folded into the others' errors.
            happy_eyeballs_delay=None,
            socket_factory=self._guarded_socket if self._guard_sockets else None,
        )
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self.timeout_seconds, sock_read=self.timeout_seconds
        )
        return aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            skip_auto_headers=("Accept",),
        )

    def _guarded_socket(self, addr_info: tuple) -> socket.socket:
        """The connector's socket for one resolved address, if the guard allows the address."""
        family, kind, proto, _, address = addr_info
        try:
            ssrf.check_address(address[0], allow_private=False)
        except ssrf.ForbiddenAddress as exc:
            raise ssrf.ForbiddenAddress(f"connecting to {self._host}: {exc}") from None
        return socket.socket(family, kind, proto)

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

    async def _attempt(self, delivery_id: str, body: bytes) -> AttemptResult:
        started_at = _now()
        try:
            return await self._post(delivery_id, body, started_at)
        except Exception as exc:
            # A bug, not the receiver: the request may have gone out, so the attempt is
            # ambiguous (retried with the same key) and says why.
            log.exception("sending %s failed", delivery_id)
            error = f"sender failed: {type(exc).__name__}: {exc}"[:500]
            return _failed(outcomes.Failure(outcomes.AMBIGUOUS, True, error), started_at)

    async def _post(self, delivery_id: str, body: bytes, started_at: datetime) -> AttemptResult:
        deadline = time.monotonic() + 2 * self.timeout_seconds
        if self._unusable is not None:
            return _failed(outcomes.unsendable(self._unusable), started_at)
        if self._session is None:
            self._session = self._open_session()
        try:
            if self._check_name_each_send:
                await asyncio.to_thread(ssrf.check_url, self.url, False)
            response = await self._session.post(
                self.url,
                data=body,
                headers=self._headers(delivery_id, body),
                proxy=self._proxy,
                allow_redirects=False,
            )
        except _TRANSPORT_FAILURES as exc:
            return _failed(outcomes.classify_failure(exc), started_at)
        crashpoints.hit(crashpoints.AFTER_RECEIVER_ACCEPTED)
        data, read_error = await _read_limited(response, deadline)
        return _answered(response, data, read_error, started_at)


def _failed(failure: outcomes.Failure, started_at: datetime) -> AttemptResult:
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


def _answered(
    response: aiohttp.ClientResponse, data: bytes, read_error: str | None, started_at: datetime
) -> AttemptResult:
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


async def _read_limited(
    response: aiohttp.ClientResponse, deadline: float
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
            chunk = await response.content.read(min(_READ_CHUNK, MAX_RESPONSE_READ_BYTES - size))
            if not chunk:
                ended = True
                break
            chunks.append(chunk)
            size += len(chunk)
    except _TRANSPORT_FAILURES as exc:
        return b"".join(chunks), f"response body read failed: {type(exc).__name__}"
    finally:
        if ended:
            response.release()
        else:
            response.close()
    return b"".join(chunks), None
