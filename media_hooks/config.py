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
    # How long a run stopped at `media-hooks run --max-seconds` may take to hand back what it
    # holds before the command kills it.
    run_stop_grace_seconds: float = 15.0

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
            run_stop_grace_seconds=_positive_float("MEDIA_HOOKS_RUN_STOP_GRACE_SECONDS", 15.0),
        )

    @property
    def embedded(self) -> bool:
        return self.database_url is None
