"""Standard Webhooks signatures (docs/contract.md, "The HTTP request a receiver gets").

A request is signed with every active secret (several during a rotation): the
``webhook-signature`` header is space-separated ``v1,<base64 HMAC-SHA256>`` entries over
``"{webhook-id}.{webhook-timestamp}.".encode() + body``. A secret is ``whsec_<base64 key>``.
Secret values never appear in exception text: they would end up in logs and attempt rows.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Mapping, Sequence

from media_hooks.core.errors import UserError

SECRET_PREFIX = "whsec_"
SIGNATURE_VERSION = "v1"
DEFAULT_TOLERANCE_SECONDS = 300


class InvalidSecret(UserError):
    """A secret is not ``whsec_`` followed by non-empty base64."""


class VerificationError(Exception):
    """A request's signature headers do not verify; the text says why, never with a secret."""


def decode_secret(secret: str) -> bytes:
    """The HMAC key of a ``whsec_<base64>`` secret."""
    if not secret.startswith(SECRET_PREFIX):
        raise InvalidSecret(f"a webhook secret must start with {SECRET_PREFIX!r}")
    encoded = secret[len(SECRET_PREFIX) :]
    try:
        # Tolerate missing padding, as the reference implementation does.
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidSecret(
            f"a webhook secret must be {SECRET_PREFIX} followed by base64"
        ) from None
    if not key:
        raise InvalidSecret("a webhook secret's key must not be empty")
    return key


def _signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> bytes:
    return hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()


def sign(secrets: Sequence[str], msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header value: one ``v1,`` entry per secret."""
    return " ".join(
        f"{SIGNATURE_VERSION},{base64.b64encode(_signature(decode_secret(s), msg_id, timestamp, body)).decode()}"
        for s in secrets
    )


def _header(headers: Mapping[str, str], name: str) -> str:
    for key, value in headers.items():
        if key.lower() == name:
            return value
    raise VerificationError(f"missing {name} header")


def _check_timestamp(raw: str, tolerance_seconds: float, now: float) -> int:
    try:
        timestamp = int(raw)
    except ValueError:
        raise VerificationError(f"webhook-timestamp {raw[:40]!r} is not Unix seconds") from None
    if abs(now - timestamp) > tolerance_seconds:
        raise VerificationError(
            f"webhook-timestamp is {now - timestamp:+.0f}s from now, "
            f"outside the {tolerance_seconds:g}s tolerance"
        )
    return timestamp


def _offered_signatures(header: str) -> list[bytes]:
    offered = []
    for entry in header.split():
        version, _, encoded = entry.partition(",")
        if version != SIGNATURE_VERSION:
            continue
        try:
            offered.append(base64.b64decode(encoded, validate=True))
        except (binascii.Error, ValueError):
            continue
    return offered


def verify(
    secrets: Sequence[str],
    headers: Mapping[str, str],
    body: bytes,
    tolerance_seconds: float = DEFAULT_TOLERANCE_SECONDS,
    now: float | None = None,
) -> None:
    """Pass if any offered ``v1`` signature matches any secret; raise VerificationError if not.

    The timestamp must be within ``tolerance_seconds`` of ``now`` (Unix seconds), which
    bounds how long a captured request can be replayed.
    """
    msg_id = _header(headers, "webhook-id")
    timestamp = _check_timestamp(
        _header(headers, "webhook-timestamp"),
        tolerance_seconds,
        time.time() if now is None else now,
    )
    offered = _offered_signatures(_header(headers, "webhook-signature"))
    expected = [_signature(decode_secret(s), msg_id, timestamp, body) for s in secrets]
    # Compare every pair, so timing says nothing about which secret or entry matched.
    matched = False
    for candidate in offered:
        for wanted in expected:
            matched |= hmac.compare_digest(candidate, wanted)
    if not matched:
        raise VerificationError("no webhook-signature entry matches an active secret")
