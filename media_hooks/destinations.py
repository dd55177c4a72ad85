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
import math
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg import errors as pg_errors
from psycopg.rows import dict_row

from media_hooks.config import Settings
from media_hooks.errors import UserError
from media_hooks.identifiers import validate_identifier
from media_hooks.sqlfiles import query
from media_hooks.ssrf import ForbiddenAddress, check_url

# A worker's lease must outlast its request by at least this much, so a request that runs to its
# timeout still has time to record its outcome before another worker may take the delivery.
LEASE_MARGIN_SECONDS = 5.0
SECRET_PREFIX = "whsec_"


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

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Destination:
        values = {f.name: row[f.name] for f in fields(cls)}
        values["secrets"] = tuple(row["secrets"])
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
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https"):
        raise UserError(f"url must start with http:// or https://, got {url!r}")
    if not parts.hostname:
        raise UserError(f"url must name a host, got {url!r}")
    if parts.username is not None or parts.password is not None:
        # Credentials in a URL would be printed by `destination list`; secrets sign instead.
        raise UserError("url must not contain user:password@ credentials")
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number in range
    except ValueError:
        raise UserError(f"url has an invalid port: {url!r}") from None


@dataclass(frozen=True)
class Range:
    """The values of one setting the engine can honour (README, "Destination settings")."""

    what: str
    low: float
    high: float
    unit: str = ""
    whole: bool = False

    def describe(self) -> str:
        return f"{_show(self.low)} to {_show(self.high)}{self.unit}"

    def problem(self, value: object) -> str | None:
        """Why ``value`` is refused, or None."""
        if self.whole:
            if isinstance(value, bool) or not isinstance(value, int):
                return f"{self.what} must be a whole number, got {value!r}"
        elif (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            return f"{self.what} must be a finite number, got {value!r}"
        if not self.low <= value <= self.high:
            return (
                f"{self.what} must be between {_show(self.low)} and {_show(self.high)}"
                f"{self.unit}, got {_show(value)}"
            )
        return None


def _show(value: float) -> str:
    """1000000 rather than 1e+06; 0.001 and 1e-300 as they are."""
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:g}"


# Beyond these a setting breaks the engine (1e-300/s overflows the wait before a start; a
# backoff of 1e300 s overflows the due time) or the machine (a thread per request in flight).
RANGES = {
    "rate_per_second": Range("rate", 0.001, 1_000_000, " per second"),
    "burst": Range("burst", 1, 1_000_000, whole=True),
    "max_in_flight": Range("max in flight", 1, 1000, whole=True),
    "timeout_seconds": Range("timeout", 0.1, 600, " s"),
    "max_attempts": Range("max attempts", 1, 1000, whole=True),
    "backoff_base_seconds": Range("backoff base", 0.1, 86_400, " s"),
    "backoff_cap_seconds": Range("backoff cap", 0.1, 2_592_000, " s"),
    # Not set by `destination add`; checked on what is stored all the same.
    "max_age_seconds": Range("maximum delivery age", 60, 31_536_000, " s"),
}


def _check_range(spec: DestinationSpec) -> None:
    for name, allowed in RANGES.items():
        value = getattr(spec, name, None)
        problem = None if value is None else allowed.problem(value)
        if problem:
            raise UserError(problem)


def out_of_range(destination: Destination) -> str | None:
    """The stored settings the engine cannot honour (written before `destination add`
    checked them, or by hand), in one line for the destination's disabled reason; or None."""
    wrong = [
        f"{allowed.what} {_show(getattr(destination, name))}{allowed.unit} "
        f"(allowed {allowed.describe()})"
        for name, allowed in RANGES.items()
        if allowed.problem(getattr(destination, name))
    ]
    if not wrong:
        return None
    return (
        "settings outside the range the engine can honour: "
        + ", ".join(wrong)
        + f"; fix them with `media-hooks destination add {destination.destination_id} ...`, "
        "then enable it"
    )


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


def validate_spec(spec: DestinationSpec, settings: Settings) -> None:
    """Every check that needs no database: the values given, then the SSRF guard."""
    validate_identifier(spec.destination_id, "destination id")
    validate_url(spec.url)
    secrets = spec.secrets or ()
    for number, secret in enumerate(secrets, start=1):
        secret_key(secret, f"secret {number} of {len(secrets)}")
    _check_range(spec)
    _check_timeout(spec.timeout_seconds, settings)
    _check_backoff(spec.backoff_base_seconds, spec.backoff_cap_seconds)
    try:
        check_url(spec.url, settings.allow_private_urls)
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


def upsert_destination(
    conn: psycopg.Connection, spec: DestinationSpec, settings: Settings | None = None
) -> bool:
    """Create or update a destination; True when it was created. Writes nothing on error."""
    settings = settings or Settings.from_env()
    validate_spec(spec, settings)
    params = asdict(spec)
    params["secrets"] = None if spec.secrets is None else list(spec.secrets)
    try:
        with conn.transaction():
            created = _fetch(conn, "destination_create_with_defaults", params)
            (stored,) = _fetch(conn, "destination_update_given", params)
            _check_stored(stored, settings)
    except pg_errors.CheckViolation as exc:
        raise _schema_refusal(exc) from None
    return bool(created)


def get_destination(conn: psycopg.Connection, destination_id: str) -> Destination:
    """The destination with its secrets; UserError when there is none by that id."""
    rows = _fetch(conn, "destination_get", {"destination_id": destination_id})
    if not rows:
        raise UserError(f"no destination {destination_id!r}")
    return Destination.from_row(rows[0])


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
