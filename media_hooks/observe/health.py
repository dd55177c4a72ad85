"""What must not read green: the destinations that send nothing because they are disabled, each
with why in one word and how many deliveries wait for it.

The lag sensor's health line and alerts, the Prometheus gauges and the Dagster asset checks all
read it from one measurement (``figures.measure``), so none of them can call "healthy" what
another calls disabled. A disabled destination loses nothing (its deliveries stay pending), but
nothing reaches its publisher until an operator enables it: that is always worth a look, whoever
disabled it. Read-only; no Dagster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from media_hooks.observe.figures import DestinationFlag, Figures

# Who disabled a destination, read from how its reason begins: each writer of a reason starts
# it so (the worker: media_hooks.engine.delivery; the circuit breaker: trip_circuit_breakers in
# sql/queries/sweeps.sql; settings out of range: media_hooks.outbox.destinations.out_of_range).
# Any other reason is an operator's own (`media-hooks destination disable --reason`).
# First match wins: the guard's reason is a configuration fault too.
_CAUSES = (
    ("configuration: refused by the SSRF guard", "ssrf_guard", "by the SSRF guard"),
    ("receiver answered HTTP 410", "gone", "by its receiver's 410 (Gone)"),
    ("circuit breaker:", "circuit_breaker", "by the circuit breaker"),
    ("settings outside the range", "settings", "for settings out of range"),
    ("configuration:", "configuration", "for its configuration"),
)
OPERATOR = ("operator", "by an operator")
CAUSES = tuple(cause for _, cause, _ in _CAUSES) + (OPERATOR[0],)


def disabled_cause(reason: str | None) -> tuple[str, str]:
    """(cause, the cause in words) for a destination's disabled reason."""
    for prefix, cause, words in _CAUSES:
        if (reason or "").startswith(prefix):
            return cause, words
    return OPERATOR


@dataclass(frozen=True)
class Disabled:
    """A disabled destination, why, since when, and the deliveries waiting for it."""

    destination_id: str
    cause: str
    cause_words: str
    reason: str
    since: datetime | None
    waiting: int

    def describe(self) -> str:
        """One line for a health line or a check: which, by what, what waits."""
        return (
            f"destination {self.destination_id} disabled {self.cause_words}, "
            f"{self.waiting} delivery(ies) waiting"
        )


def _disabled(flag: DestinationFlag, counts: dict[str, int]) -> Disabled:
    cause, words = disabled_cause(flag.disabled_reason)
    return Disabled(
        destination_id=flag.destination_id,
        cause=cause,
        cause_words=words,
        reason=flag.disabled_reason or "no reason given",
        since=flag.disabled_at,
        waiting=counts.get("pending", 0),
    )


def disabled_destinations(f: Figures) -> list[Disabled]:
    """Every disabled destination of the measurement, in id order (``f`` counted by
    destination, as ``measure`` does by default)."""
    return [_disabled(flag, f.counts.get(flag.destination_id, {})) for flag in f.disabled]


def attention(f: Figures, destination_ids: Sequence[str] = ()) -> list[str]:
    """What an operator must look at although no run can fix it (of ``destination_ids`` when
    given, else of every destination): empty when none."""
    return [
        d.describe()
        for d in disabled_destinations(f)
        if not destination_ids or d.destination_id in destination_ids
    ]
