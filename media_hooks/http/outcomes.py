"""The contract's outcome table (docs/contract.md) as code: what a receiver's answer (or its
silence) means.

| receiver answer                                      | outcome        |
|------------------------------------------------------|----------------|
| 2xx                                                  | success        |
| 429 (Retry-After optional), 503 with Retry-After     | rate_limited   |
| 408, 425, other 5xx                                  | retryable      |
| connection refused, DNS failure, connect timeout,    | retryable      |
| TLS handshake, proxy failure                         |                |
| SSRF-forbidden peer address                          | retryable, a configuration fault |
| read timeout, connection lost after the request went | ambiguous      |
| 410                                                  | rejected + disable the destination |
| other 4xx, 3xx                                       | rejected       |

Failures before any byte of the request left are ``retryable``: the receiver cannot have acted.
A forbidden peer address is a configuration fault, not a delivery failure (docs/contract.md,
"Outcomes"): the destination's address is one this worker may not reach (it resolves to a
private address, or the worker runs without the MEDIA_HOOKS_ALLOW_PRIVATE_URLS=1 it was added
with). The attempt is recorded as ``retryable`` with the guard's words, and the worker disables
the destination with them instead of spending the delivery's retry budget.
Anything after the request may have reached the receiver is ``ambiguous``: it may have acted,
so the retry reuses the same idempotency key and the attempt is recorded as such.
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import aiohttp

from media_hooks.http.ssrf import ForbiddenAddress

SUCCESS = "success"
RATE_LIMITED = "rate_limited"
RETRYABLE = "retryable"
AMBIGUOUS = "ambiguous"
REJECTED = "rejected"

OUTCOMES = (SUCCESS, RATE_LIMITED, RETRYABLE, AMBIGUOUS, REJECTED)

DEFAULT_RETRY_AFTER_CAP_SECONDS = 3600.0

_RETRYABLE_4XX = frozenset({408, 425})
_DELTA_SECONDS = re.compile(r"^\d+(\.\d+)?$")


@dataclass(frozen=True)
class Classification:
    outcome: str
    retry_after_seconds: float | None = None
    disable_destination: bool = False


@dataclass(frozen=True)
class Failure:
    """A request that got no HTTP answer."""

    outcome: str
    request_sent: bool
    error: str
    # The destination's configuration, not the delivery, is at fault (the SSRF guard).
    configuration_fault: bool = False


def parse_retry_after(
    value: str | None,
    now: datetime | None = None,
    cap_seconds: float = DEFAULT_RETRY_AFTER_CAP_SECONDS,
) -> float | None:
    """Seconds to wait from a Retry-After value (delta-seconds or HTTP-date).

    Capped at ``cap_seconds`` so a receiver cannot park a destination for a year; a date in
    the past is 0; anything unparseable is None (the caller falls back to its backoff).
    """
    if value is None:
        return None
    text = value.strip()
    if _DELTA_SECONDS.match(text):
        seconds = float(text)
    else:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            # RFC 9110 dates are GMT; "-0000" parses as naive.
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    return min(max(seconds, 0.0), cap_seconds)


def _header(headers: Mapping[str, str], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name:
            return value
    return None


def classify_response(
    status: int,
    headers: Mapping[str, str],
    now: datetime | None = None,
    cap_seconds: float = DEFAULT_RETRY_AFTER_CAP_SECONDS,
) -> Classification:
    """The outcome of an HTTP answer, with its Retry-After when it carries one.

    A 429 without a usable Retry-After is still ``rate_limited`` (retry_after None: the caller
    picks the pause). A 503 whose Retry-After does not parse cannot be honoured, so it is an
    ordinary ``retryable`` 5xx.
    """
    if 200 <= status <= 299:
        return Classification(SUCCESS)
    if status in (429, 503):
        retry_after = parse_retry_after(_header(headers, "retry-after"), now, cap_seconds)
        if status == 429 or retry_after is not None:
            return Classification(RATE_LIMITED, retry_after_seconds=retry_after)
        return Classification(RETRYABLE)
    if status in _RETRYABLE_4XX or 500 <= status <= 599:
        return Classification(RETRYABLE)
    if status == 410:
        return Classification(REJECTED, disable_destination=True)
    if 300 <= status <= 499:
        return Classification(REJECTED)
    # 1xx as a final answer, or a code outside HTTP's range: a broken server, try again later.
    return Classification(RETRYABLE)


def _causes(exc: BaseException) -> list[BaseException]:
    """The exception and everything it wraps (aiohttp -> ssl -> socket)."""
    seen: list[BaseException] = []
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or any(current is s for s in seen):
            continue
        seen.append(current)
        # aiohttp keeps the OS error it wraps; ssl's errors have a reason too, a string: only
        # exceptions are followed.
        links = [current.__cause__, current.__context__, getattr(current, "os_error", None)]
        links.extend(current.args)
        pending.extend(link for link in links if isinstance(link, BaseException))
    return seen


def _first(causes: list[BaseException], kind: type | tuple[type, ...]) -> BaseException | None:
    return next((c for c in causes if isinstance(c, kind)), None)


def unsendable(why: str) -> Failure:
    """A request the transport cannot make (an unusable URL or proxy): nothing was sent, and an
    operator can fix it within the retry budget."""
    return Failure(RETRYABLE, False, f"invalid request: {why}")


def classify_failure(exc: BaseException) -> Failure:
    """The outcome of a request that raised instead of answering."""
    causes = _causes(exc)
    forbidden = _first(causes, ForbiddenAddress)
    if forbidden is not None:
        if _first(causes, (socket.gaierror, UnicodeError)):
            # The guard could not resolve the name (before a request through a proxy).
            return Failure(RETRYABLE, False, f"DNS failure: {forbidden}")
        return Failure(RETRYABLE, False, f"refused by the SSRF guard: {forbidden}", True)
    if _first(causes, aiohttp.ClientConnectorDNSError):
        return Failure(RETRYABLE, False, f"DNS failure: {_innermost_text(causes)}")
    if _first(causes, (aiohttp.ClientProxyConnectionError, aiohttp.ClientHttpProxyError)):
        return Failure(RETRYABLE, False, f"proxy failure: {_innermost_text(causes)}")
    if _first(causes, aiohttp.ClientSSLError):
        # The connector's handshake, before the request: nothing was sent.
        return Failure(RETRYABLE, False, f"TLS failure: {_innermost_text(causes)}")
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return Failure(RETRYABLE, False, f"connect timeout: {_innermost_text(causes)}")
    if isinstance(exc, asyncio.TimeoutError):
        return Failure(AMBIGUOUS, True, "read timeout: the receiver may have acted")
    if isinstance(exc, (aiohttp.InvalidURL, aiohttp.NonHttpUrlClientError)):
        return unsendable(_innermost_text(causes))
    if isinstance(exc, aiohttp.ClientConnectorError):
        return Failure(RETRYABLE, False, f"connection failed: {_innermost_text(causes)}")
    # Anything else happened with the request (possibly) on the wire: the receiver may have
    # acted on it, so it must be retried with the same key and recorded as ambiguous.
    return Failure(
        AMBIGUOUS, True, f"connection lost after the request was sent: {_innermost_text(causes)}"
    )


def _innermost_text(causes: list[BaseException]) -> str:
    """The most specific cause, e.g. "ConnectionRefusedError: [Errno 111] ..."."""
    innermost = next(
        (c for c in reversed(causes) if isinstance(c, OSError) and not _is_wrapper(c)),
        causes[-1],
    )
    text = str(innermost) or type(innermost).__name__
    return f"{type(innermost).__name__}: {text}"[:500]


def _is_wrapper(exc: BaseException) -> bool:
    return isinstance(exc, aiohttp.ClientError)
