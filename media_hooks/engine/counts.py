"""What a delivery did, counted: per destination and for a whole run."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields

from media_hooks.http import outcomes


@dataclass
class DeliveryCounts:
    attempted: int = 0
    succeeded: int = 0
    retried: int = 0
    rate_limited: int = 0
    ambiguous: int = 0
    dead: int = 0
    skipped: int = 0
    deferred: int = 0
    # Attempts the SSRF guard refused at connect time: nothing sent, budget kept, destination
    # disabled (a configuration fault).
    guard_refused: int = 0

    def merge(self, other: DeliveryCounts) -> DeliveryCounts:
        return DeliveryCounts(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        )

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def count(self, outcome: str, state: str) -> None:
        """Count one recorded attempt by its outcome and the state it left the delivery in."""
        self.attempted += 1
        if state == "succeeded":
            self.succeeded += 1
        elif state == "dead":
            self.dead += 1
        elif outcome == outcomes.RATE_LIMITED:
            self.rate_limited += 1
        else:
            self.retried += 1
        if outcome == outcomes.AMBIGUOUS:
            self.ambiguous += 1

    def count_spared(self, configuration_fault: bool) -> None:
        """Count an attempt that does not count against its delivery: nothing was sent (the
        SSRF guard refused the address, or the worker stopped between lease and send)."""
        if configuration_fault:
            self.guard_refused += 1
        else:
            self.deferred += 1


@dataclass(frozen=True)
class DestinationResult:
    destination_id: str
    claimed: int
    counts: DeliveryCounts
    seconds: float


def tally(
    results: Iterable[tuple[str, DeliveryCounts]],
) -> tuple[DeliveryCounts, dict[str, DeliveryCounts]]:
    """Totals and per-destination counts of results given as (destination_id, counts)."""
    totals = DeliveryCounts()
    by_destination: dict[str, DeliveryCounts] = {}
    for destination_id, counts in results:
        totals = totals.merge(counts)
        by_destination[destination_id] = by_destination.get(destination_id, DeliveryCounts()).merge(
            counts
        )
    return totals, by_destination
