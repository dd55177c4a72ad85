"""Destinations: where deliveries go, with their limits and retry policy.

``upsert_destination`` creates a destination or updates one: the URL is always set; every other
option that is given (not None) is set, and options not given keep the schema's default for a new
destination and their current value for an existing one. Secrets given replace the whole list
(pass old and new together during a rotation); ``secrets=None`` keeps them, ``()`` removes them.

Everything is validated before it counts: one bad value is a UserError, and the transaction that
wrote the row is rolled back, so nothing is written.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import psycopg
from psycopg import errors as pg_errors
from psycopg.rows import dict_row

from media_hooks.core.config import Settings
from media_hooks.core.errors import UserError
from media_hooks.core.identifiers import validate_identifier
from media_hooks.core.numeric import Range, check, plain
from media_hooks.http.ssrf import ForbiddenAddress, check_url
from media_hooks.store.secret_store import ENV as SECRET_KEY_ENV
from media_hooks.store.secret_store import SecretBox, is_sealed
from media_hooks.store.sqlfiles import query

# A worker's lease must outlast its request by at least this much, so a request that runs to its
# timeout still has time to record its outcome before another worker may take the delivery.
LEASE_MARGIN_SECONDS = 5.0
SECRET_PREFIX = "whsec_"
MAX_PATTERN_CHARS = 256  # an event type's longest (media_hooks.outbox.emit.MAX_EVENT_TYPE_CHARS)


@dataclass(frozen=True)
class DestinationSpec:
    """What ``destination add`` asks for; None means "not given" (see the module's docstring)."""

    destination_id: str
    url: str
    secrets: tuple[str, ...] | None = None
    rate_per_second: float | None = None
    burst: int | None = None
    max_in_flight: int | None = None
    timeout_seconds: float | None = None
    max_attempts: int | None = None
    backoff_base_seconds: float | None = None
    backoff_cap_seconds: float | None = None
    # Subscriptions: exact event types or `prefix.*`; () means every type; None keeps them.
    event_types: tuple[str, ...] | None = None
    ordering: str | None = None  # 'asset': an asset's deliveries in emission order; 'none'
    coalescing: str | None = None  # 'asset': only an asset's newest of each type is sent
    # True: this destination may reach addresses that are not globally reachable (a receiver
    # on this machine, a private network), whatever MEDIA_HOOKS_ALLOW_PRIVATE_URLS says.
    allow_private_url: bool | None = None


@dataclass(frozen=True)
class Destination:
    """A destination as stored, secrets included: what the sender needs."""

    destination_id: str
    url: str
    secrets: tuple[str, ...]
    rate_per_second: float
    burst: int
    max_in_flight: int
    timeout_seconds: float
    max_attempts: int
    backoff_base_seconds: float
    backoff_cap_seconds: float
    max_age_seconds: float
    enabled: bool
    disabled_reason: str | None
    paused_until: datetime | None
    paused_reason: str | None
    allow_private_url: bool = False

    @classmethod
    def from_row(cls, row: dict[str, Any], box: SecretBox) -> Destination:
        """The destination with its secrets as given (decrypted): only for sending."""
        values = {f.name: row[f.name] for f in fields(cls)}
        owner = f"destination {row['destination_id']!r}"
        values["secrets"] = tuple(box.open(stored, owner) for stored in row["secrets"])
        return cls(**values)


def secret_key(secret: str, what: str = "secret") -> bytes:
    """The HMAC key of a ``whsec_<base64>`` secret. The error never shows the secret."""
    if not isinstance(secret, str) or not secret.startswith(SECRET_PREFIX):
        raise UserError(f"{what} must have the form {SECRET_PREFIX}<base64>")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise UserError(
            f"{what}: the part after {SECRET_PREFIX} is not valid base64 "
            f"(expected {SECRET_PREFIX}<base64>)"
        ) from None
    if not key:
        raise UserError(f"{what}: the key is empty (expected {SECRET_PREFIX}<base64>)")
    return key


def validate_url(url: str) -> None:
    if not isinstance(url, str) or not url:
        raise UserError("url must not be empty")
    if any(ch.isspace() for ch in url):
        raise UserError("url must not contain whitespace")
    try:
        parts = urlsplit(url)
        host, _ = parts.hostname, parts.port
    except ValueError as exc:
        # Not echoed: a malformed URL may still carry credentials.
        raise UserError(f"url is not a valid URL ({exc})") from None
    if parts.username is not None or parts.password is not None:
        # Credentials in a URL would be printed by `destination list`; secrets sign instead.
        # Checked first: the messages below show the URL.
        raise UserError("url must not contain user:password@ credentials")
    if parts.scheme.lower() not in ("http", "https"):
        raise UserError(f"url must start with http:// or https://, got {url!r}")
    if not host:
        raise UserError(f"url must name a host, got {url!r}")


class Setting(NamedTuple):
    """A destination setting's name in messages, and the values the engine can honour."""

    what: str
    allowed: Range


# Beyond these a setting breaks the engine (1e-300/s overflows the wait before a start; a
# backoff of 1e300 s overflows the due time) or the machine (a connection per request in flight)
# (docs/contract.md, "Destination settings").
RANGES = {
    "rate_per_second": Setting(
        "rate", Range(0.001, 1_000_000, low_inclusive=True, unit="starts per second")
    ),
    "burst": Setting("burst", Range(1, 1_000_000, low_inclusive=True, integer=True)),
    "max_in_flight": Setting("max in flight", Range(1, 1000, low_inclusive=True, integer=True)),
    "timeout_seconds": Setting("timeout", Range(0.1, 600, low_inclusive=True, unit="seconds")),
    "max_attempts": Setting("max attempts", Range(1, 1000, low_inclusive=True, integer=True)),
    "backoff_base_seconds": Setting(
        "backoff base", Range(0.1, 86_400, low_inclusive=True, unit="seconds")
    ),
    "backoff_cap_seconds": Setting(
        "backoff cap", Range(0.1, 2_592_000, low_inclusive=True, unit="seconds")
    ),
    # Not set by `destination add`; checked on what is stored all the same.
    "max_age_seconds": Setting(
        "maximum delivery age", Range(60, 31_536_000, low_inclusive=True, unit="seconds")
    ),
}


def _check_range(spec: DestinationSpec) -> None:
    for name, (what, allowed) in RANGES.items():
        value = getattr(spec, name, None)
        if value is not None:
            check(value, what, allowed)


def out_of_range(destination: Destination) -> str | None:
    """The stored settings the engine cannot honour (written before `destination add`
    checked them, or by hand), in one line for the destination's disabled reason; or None."""
    wrong = [
        f"{what} {plain(getattr(destination, name))} (allowed: {allowed.describe()})"
        for name, (what, allowed) in RANGES.items()
        if allowed.problem(getattr(destination, name), what)
    ]
    if not wrong:
        return None
    return (
        "settings outside the range the engine can honour: "
        + ", ".join(wrong)
        + f"; fix them with `media-hooks destination add {destination.destination_id} ...`, "
        "then enable it"
    )


# Subscription patterns: an exact event type, or a prefix ending in `.*` (`rights.*` matches
# `rights.updated` and `rights.window.opened`, not `rights`). `*` alone means every type.
EVERY_TYPE = "*"
SCOPES = ("none", "asset")


def validate_pattern(pattern: object) -> str:
    """One subscription pattern, or a UserError naming what is wrong with it."""
    if not isinstance(pattern, str) or not pattern:
        raise UserError("--event-type must not be empty")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise UserError(
            f"--event-type {pattern[:40]!r}... is {len(pattern)} characters long; "
            f"at most {MAX_PATTERN_CHARS} are allowed"
        )
    if any(ch.isspace() or not ch.isprintable() for ch in pattern):
        raise UserError(f"--event-type {pattern!r} contains whitespace or a control character")
    if "*" in pattern and not (pattern.endswith(".*") and "*" not in pattern[:-2] and pattern[:-2]):
        raise UserError(
            f"--event-type {pattern!r}: '*' may only end a pattern as `prefix.*` "
            "(e.g. 'rights.*'), or stand alone for every type"
        )
    return pattern


def subscription_patterns(event_types: tuple[str, ...]) -> list[str]:
    """The patterns to store: validated, without repeats; `*` (every type) stores none."""
    if EVERY_TYPE in event_types:
        if len(event_types) > 1:
            raise UserError("--event-type '*' (every type) cannot be combined with other types")
        return []
    return sorted({validate_pattern(p) for p in event_types})


def _check_scope(value: str | None, option: str) -> None:
    if value is not None and value not in SCOPES:
        raise UserError(f"{option} must be one of {', '.join(SCOPES)}, got {value!r}")


def _check_timeout(timeout_seconds: float | None, settings: Settings) -> None:
    if timeout_seconds is None:
        return
    limit = settings.lease_seconds - LEASE_MARGIN_SECONDS
    if timeout_seconds >= limit:
        raise UserError(
            f"timeout must be below {limit:g} s: the lease (MEDIA_HOOKS_LEASE_SECONDS="
            f"{settings.lease_seconds:g}) must exceed the timeout by at least "
            f"{LEASE_MARGIN_SECONDS:g} s, got {timeout_seconds:g}"
        )


def _check_backoff(base: float | None, cap: float | None) -> None:
    if base is not None and cap is not None and cap < base:
        raise UserError(f"backoff cap ({cap:g} s) must not be below the backoff base ({base:g} s)")


def allows_private(spec: DestinationSpec, stored: bool, settings: Settings) -> bool:
    """Whether the SSRF guard lets this destination reach private addresses: the deployment
    allows it for all, or the destination for itself (as given, else as stored)."""
    own = stored if spec.allow_private_url is None else spec.allow_private_url
    return settings.allow_private_urls or own


def validate_spec(
    spec: DestinationSpec, settings: Settings, *, stored_allows: bool = False
) -> None:
    """Every check that needs no database: the values given, then the SSRF guard (which a
    destination stored with ``allow_private_url`` passes: ``stored_allows``)."""
    validate_identifier(spec.destination_id, "destination id")
    validate_url(spec.url)
    secrets = spec.secrets or ()
    for number, secret in enumerate(secrets, start=1):
        secret_key(secret, f"secret {number} of {len(secrets)}")
    _check_range(spec)
    _check_timeout(spec.timeout_seconds, settings)
    _check_backoff(spec.backoff_base_seconds, spec.backoff_cap_seconds)
    if spec.event_types is not None:
        subscription_patterns(spec.event_types)
    _check_scope(spec.ordering, "--ordering")
    _check_scope(spec.coalescing, "--coalesce")
    try:
        check_url(spec.url, allows_private(spec, stored_allows, settings))
    except ForbiddenAddress as exc:
        raise UserError(f"destination url refused by the SSRF guard: {exc}") from None


def _check_stored(row: dict[str, Any], settings: Settings) -> None:
    """The rules that span options, on the values as merged with the stored ones."""
    _check_timeout(row["timeout_seconds"], settings)
    _check_backoff(row["backoff_base_seconds"], row["backoff_cap_seconds"])


def _schema_refusal(exc: pg_errors.CheckViolation) -> UserError:
    if exc.diag.constraint_name == "backoff_cap_not_below_base":
        return UserError("backoff cap must not be below the backoff base (as stored or given)")
    return UserError(f"destination refused by the schema rule {exc.diag.constraint_name}")


def _fetch(conn: psycopg.Connection, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Run a named statement and return its rows as dicts, whatever the caller's row factory."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query(name), params)
        return cur.fetchall() if cur.description else []


def _refuse_clear_beside_sealed(conn: psycopg.Connection, box: SecretBox) -> None:
    if not box.encrypting and _fetch(conn, "destination_has_sealed_secrets", {})[0]["sealed"]:
        raise UserError(
            f"signing secrets are stored encrypted, but {SECRET_KEY_ENV} is not set: set it to "
            "add a secret (without it the secret would be stored as it is)"
        )


def upsert_destination(
    conn: psycopg.Connection,
    spec: DestinationSpec,
    settings: Settings | None = None,
    box: SecretBox | None = None,
) -> bool:
    """Create or update a destination; True when it was created. Writes nothing on error.

    Secrets are stored encrypted when ``box`` (default: MEDIA_HOOKS_SECRET_KEY) has a key.
    """
    settings = settings or Settings.from_env()
    box = box or SecretBox.from_env()
    stored = _fetch(conn, "destination_allows_private_url", {"destination_id": spec.destination_id})
    validate_spec(spec, settings, stored_allows=bool(stored and stored[0]["allow_private_url"]))
    params = asdict(spec)
    params["secrets"] = None if spec.secrets is None else [box.seal(s) for s in spec.secrets]
    del params["event_types"]
    try:
        with conn.transaction():
            if spec.secrets:
                _refuse_clear_beside_sealed(conn, box)
            created = _fetch(conn, "destination_create_with_defaults", params)
            if spec.ordering == "asset":
                # Before the change: a lease under the old rule ends before ordering begins.
                _fetch(conn, "destination_fence_leases", {"destination_id": spec.destination_id})
            (stored,) = _fetch(conn, "destination_update_given", params)
            _check_stored(stored, settings)
            if spec.ordering == "none":
                _fetch(conn, "destination_release_parked", {"destination_id": spec.destination_id})
            elif spec.ordering == "asset":
                _fetch(conn, "destination_park_held", {"destination_id": spec.destination_id})
            if spec.coalescing == "asset":
                # Latest wins from now on, for what was recorded before too.
                _fetch(
                    conn, "destination_close_superseded", {"destination_id": spec.destination_id}
                )
            if spec.event_types is not None:
                patterns = subscription_patterns(spec.event_types)
                subscription = {"destination_id": spec.destination_id, "patterns": patterns}
                _fetch(conn, "destination_subscribe", subscription)
    except pg_errors.CheckViolation as exc:
        raise _schema_refusal(exc) from None
    return bool(created)


def get_destination(
    conn: psycopg.Connection, destination_id: str, box: SecretBox | None = None
) -> Destination:
    """The destination with its secrets decrypted, for sending; UserError when there is none
    by that id, SecretKeyError when its secrets are encrypted and the key cannot open them."""
    rows = _fetch(conn, "destination_get", {"destination_id": destination_id})
    if not rows:
        raise UserError(f"no destination {destination_id!r}")
    return Destination.from_row(rows[0], box or SecretBox.from_env())


@dataclass(frozen=True)
class RekeyResult:
    destinations: int
    secrets: int
    were_plaintext: int  # of ``secrets``: stored as given before


def rekey_secrets(
    conn: psycopg.Connection, box: SecretBox, *, to_plaintext: bool = False, dry_run: bool = False
) -> RekeyResult:
    """Store every destination's secrets again: encrypted under the first key (``to_plaintext``:
    as given), in one transaction. A secret no key opens fails it all (SecretKeyError)."""
    if not box.encrypting:
        raise UserError(
            f"{SECRET_KEY_ENV} is not set: there is no key to encrypt (or decrypt) with"
        )
    destinations = secrets = were_plaintext = 0
    with conn.transaction(force_rollback=dry_run):
        for row in _fetch(conn, "destination_secrets_for_rekey", {}):
            owner = f"destination {row['destination_id']!r}"
            given = [box.open(stored, owner) for stored in row["secrets"]]
            stored = given if to_plaintext else [box.seal(secret) for secret in given]
            params = {"destination_id": row["destination_id"], "secrets": stored}
            _fetch(conn, "destination_store_secrets", params)
            destinations += 1
            secrets += len(given)
            were_plaintext += sum(not is_sealed(s) for s in row["secrets"])
    return RekeyResult(destinations, secrets, were_plaintext)


def secret_inventory(conn: psycopg.Connection, box: SecretBox) -> list[dict[str, Any]]:
    """Per destination with secrets: how many are stored as given, encrypted under which
    configured key, or under none of them. Never a secret."""
    inventory = []
    for row in _fetch(conn, "destination_secrets_for_rekey", {}):
        numbers = [box.key_number(s) for s in row["secrets"] if is_sealed(s)]
        inventory.append(
            {
                "destination_id": row["destination_id"],
                "as_given": sum(not is_sealed(s) for s in row["secrets"]),
                "encrypted_by_key": {
                    str(n): numbers.count(n) for n in sorted({n for n in numbers if n})
                },
                "encrypted_by_no_configured_key": numbers.count(None),
            }
        )
    return inventory


def list_destinations(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """Every destination with its limits, state (enabled / paused / disabled) and why; never
    its secrets, only how many it has."""
    return _fetch(conn, "destination_list", {})


def enable_destination(conn: psycopg.Connection, destination_id: str) -> None:
    """Turn a destination on; its waiting deliveries go out again."""
    if not _fetch(conn, "destination_enable", {"destination_id": destination_id}):
        raise UserError(f"no destination {destination_id!r}")


def disable_destination(conn: psycopg.Connection, destination_id: str, reason: str) -> None:
    """Turn a destination off, saying why; its deliveries wait, pending, until it is enabled."""
    reason = (reason or "").strip()
    if not reason:
        raise UserError("disabling a destination needs a reason (--reason TEXT)")
    params = {"destination_id": destination_id, "reason": reason}
    if not _fetch(conn, "destination_disable", params):
        raise UserError(f"no destination {destination_id!r}")
