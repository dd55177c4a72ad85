"""Configuration from the environment (docs/contract.md, "Configuration").

Every number is checked where it is read (``media_hooks.core.numeric``): finite, in its documented
range, or one clear error naming the variable; nothing odd reaches a worker or PostgreSQL.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from media_hooks.core import affinity
from media_hooks.core.errors import UserError
from media_hooks.core.numeric import (
    COUNT,
    DAY_SECONDS,
    SECONDS_UP_TO_30_DAYS,
    SECONDS_UP_TO_A_DAY,
    Range,
    from_env,
)

ALLOW_PRIVATE_URLS = "MEDIA_HOOKS_ALLOW_PRIVATE_URLS"


def _allow_private_urls() -> bool:
    """``1`` turns the SSRF guard off; unset, empty or ``0`` keep it on; anything else is a
    mistake (``true`` would otherwise silently mean "on" to someone who meant "off")."""
    raw = (os.environ.get(ALLOW_PRIVATE_URLS) or "").strip()
    if raw not in ("", "0", "1"):
        raise UserError(
            f"{ALLOW_PRIVATE_URLS} must be 1 (allow private addresses) or 0 / unset (refuse "
            f"them), got {raw[:40]!r}"
        )
    return raw == "1"


# Bounds of the database timeouts every connection gets (media_hooks.store.db, "Roles").
LOCK_TIMEOUT = Range(0.01, 600, low_inclusive=True, unit="seconds")
STATEMENT_TIMEOUT = Range(1, DAY_SECONDS, low_inclusive=True, unit="seconds")


SHARDS = "MEDIA_HOOKS_SHARDS"


def shards_from_env() -> int | None:
    """The deployment's number of delivery steps per run, when it sets one (None: not set)."""
    return from_env(SHARDS, None, COUNT)


RUNTIME = "MEDIA_HOOKS_RUNTIME"
# Which program delivers a run's deliveries: the Python engine, or the Node.js worker (node/).
RUNTIMES = ("python", "node")


def check_runtime(value: str, name: str) -> str:
    """``value`` when it names a runtime; else one error naming ``name`` and the choices."""
    if value not in RUNTIMES:
        raise UserError(f"{name} must be one of {', '.join(RUNTIMES)}, got {value[:40]!r}")
    return value


def runtime_from_env() -> str:
    """The deployment's delivery runtime: MEDIA_HOOKS_RUNTIME, else python."""
    return check_runtime((os.environ.get(RUNTIME) or "").strip() or RUNTIMES[0], RUNTIME)


def run_runtime(runtime: str | None, name: str, *, filtered: bool) -> str:
    """The runtime of one run: ``runtime`` (the option ``name``) when given, else the
    deployment's. The Node worker claims whole destinations, so a run that also filters by
    event type, asset or time (``filtered``) needs the Python engine."""
    chosen = check_runtime(runtime, name) if runtime else runtime_from_env()
    if chosen == "node" and filtered:
        raise UserError(
            "the node runtime delivers whole destinations: a run filtered by event type, asset "
            "or time needs the python runtime"
        )
    return chosen


def home_from_env() -> Path:
    """MEDIA_HOOKS_HOME: the project's files (embedded server, logs, Dagster home), absolute."""
    return Path(os.environ.get("MEDIA_HOOKS_HOME") or ".media_hooks").absolute()


@dataclass(frozen=True)
class Settings:
    database_url: str | None
    home: Path
    lease_seconds: float
    enqueue_timeout_seconds: float
    allow_private_urls: bool
    breaker_stretch_seconds: float = 86400.0
    breaker_min_attempts: int = 20
    # Where a delivery's threads run: 'auto', 'off' or a CPU number (media_hooks.core.affinity).
    delivery_cpu: str = affinity.AUTO
    # How long a run stopped at `media-hooks run --max-seconds` may take to hand back what it
    # holds before the command kills it.
    run_stop_grace_seconds: float = 15.0
    # How long any statement waits for a lock, and how long the engine's statements may run
    # (each connection role scales it: media_hooks.store.db.bounds).
    lock_timeout_seconds: float = 5.0
    statement_timeout_seconds: float = 60.0

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            database_url=os.environ.get("MEDIA_HOOKS_DATABASE_URL") or None,
            home=home_from_env(),
            lease_seconds=from_env("MEDIA_HOOKS_LEASE_SECONDS", 90.0, SECONDS_UP_TO_A_DAY),
            enqueue_timeout_seconds=from_env(
                "MEDIA_HOOKS_ENQUEUE_TIMEOUT_SECONDS", 3600.0, SECONDS_UP_TO_30_DAYS
            ),
            allow_private_urls=_allow_private_urls(),
            breaker_stretch_seconds=from_env(
                "MEDIA_HOOKS_BREAKER_SECONDS", 86400.0, SECONDS_UP_TO_30_DAYS
            ),
            breaker_min_attempts=from_env("MEDIA_HOOKS_BREAKER_MIN_ATTEMPTS", 20, COUNT),
            delivery_cpu=affinity.parse(os.environ.get(affinity.ENV)),
            run_stop_grace_seconds=from_env(
                "MEDIA_HOOKS_RUN_STOP_GRACE_SECONDS", 15.0, SECONDS_UP_TO_A_DAY
            ),
            lock_timeout_seconds=from_env("MEDIA_HOOKS_LOCK_TIMEOUT_SECONDS", 5.0, LOCK_TIMEOUT),
            statement_timeout_seconds=from_env(
                "MEDIA_HOOKS_STATEMENT_TIMEOUT_SECONDS", 60.0, STATEMENT_TIMEOUT
            ),
        )

    @property
    def embedded(self) -> bool:
        return self.database_url is None
