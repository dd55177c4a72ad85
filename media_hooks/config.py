"""Configuration from the environment (CONTRACT.md, "Configuration")."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from media_hooks import affinity
from media_hooks.errors import UserError


def _positive_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise UserError(f"{name} must be a number of seconds, got {raw!r}") from None
    if value <= 0:
        raise UserError(f"{name} must be greater than 0, got {raw!r}")
    return value


def _seconds_in_range(name: str, default: float, low: float, high: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise UserError(f"{name} must be a number of seconds, got {raw!r}") from None
    if not low <= value <= high:  # also refuses nan and inf
        raise UserError(f"{name} must be between {low:g} and {high:g} seconds, got {raw!r}")
    return value


# Bounds of the database timeouts every connection gets (media_hooks.db, "Roles").
LOCK_TIMEOUT_RANGE = (0.01, 600.0)
STATEMENT_TIMEOUT_RANGE = (1.0, 86400.0)


@dataclass(frozen=True)
class Settings:
    database_url: str | None
    home: Path
    lease_seconds: float
    enqueue_timeout_seconds: float
    allow_private_urls: bool
    breaker_stretch_seconds: float = 86400.0
    breaker_min_attempts: int = 20
    # Where a delivery's threads run: 'auto', 'off' or a CPU number (media_hooks.affinity).
    delivery_cpu: str = affinity.AUTO
    # How long any statement waits for a lock, and how long the engine's statements may run
    # (each connection role scales it: media_hooks.db.bounds).
    lock_timeout_seconds: float = 5.0
    statement_timeout_seconds: float = 60.0

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            database_url=os.environ.get("MEDIA_HOOKS_DATABASE_URL") or None,
            home=Path(os.environ.get("MEDIA_HOOKS_HOME") or ".media_hooks").absolute(),
            lease_seconds=_positive_float("MEDIA_HOOKS_LEASE_SECONDS", 90.0),
            enqueue_timeout_seconds=_positive_float("MEDIA_HOOKS_ENQUEUE_TIMEOUT_SECONDS", 3600.0),
            allow_private_urls=os.environ.get("MEDIA_HOOKS_ALLOW_PRIVATE_URLS") == "1",
            breaker_stretch_seconds=_positive_float("MEDIA_HOOKS_BREAKER_SECONDS", 86400.0),
            breaker_min_attempts=int(_positive_float("MEDIA_HOOKS_BREAKER_MIN_ATTEMPTS", 20)),
            delivery_cpu=affinity.parse(os.environ.get(affinity.ENV)),
            lock_timeout_seconds=_seconds_in_range(
                "MEDIA_HOOKS_LOCK_TIMEOUT_SECONDS", 5.0, *LOCK_TIMEOUT_RANGE
            ),
            statement_timeout_seconds=_seconds_in_range(
                "MEDIA_HOOKS_STATEMENT_TIMEOUT_SECONDS", 60.0, *STATEMENT_TIMEOUT_RANGE
            ),
        )

    @property
    def embedded(self) -> bool:
        return self.database_url is None
