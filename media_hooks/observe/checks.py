"""Is anything inconsistent? The invariants (docs/architecture.md) that can be seen in the
tables, checked on a live database (``media-hooks check``).

Every check is one read-only statement of ``sql/queries/checks.sql`` returning how many rows
break its invariant and up to five of their ids. They all run in one READ ONLY REPEATABLE READ
transaction: one snapshot, so the counts agree with each other and with the ``status`` counts
read in the same transaction, and nothing the check does can move a delivery or hold a lock
that a writer waits for.

The default pass reads the live backlog (leased and enqueued rows and their attempts, limiter
rows) and the history of a window (``window_seconds``, a day by default: attempts started in it,
open ones included, and deliveries that ended in it) through their indexes, so it costs about
the same on a thousand deliveries or a million. ``full`` reads the whole history. A delivery
run checks what it did: the history ``since`` it began, and counts by state without the
succeeded history (``succeeded=False``), so its reading costs what its work did, whatever
retention keeps.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import IsolationLevel

from media_hooks.observe import figures
from media_hooks.store.sqlfiles import query

DEFAULT_WINDOW_SECONDS = 86400.0
DEFAULT_LEASE_MARGIN_SECONDS = 600.0
# The limiter's grants read clock_timestamp(), a little later than the snapshot's now().
CLOCK_SLACK_SECONDS = 5.0


@dataclass(frozen=True)
class Check:
    name: str
    # What must hold, in an operator's words, with the invariant (docs/architecture.md) it shows.
    invariant: str


CHECKS = (
    Check(
        "open_without_its_timer",
        "every open delivery has one timer, of its destination and of a kind its state has "
        "(due or parked while pending, in flight while enqueued or leased): the claim and the "
        "sweeps find it by that timer (invariant 3)",
    ),
    Check(
        "leased_without_one_open_attempt",
        "a leased delivery has exactly one open attempt, its newest, under its lease "
        "(invariants 3, 4)",
    ),
    Check(
        "open_attempt_without_lease",
        "an open attempt belongs to a delivery leased under the attempt's token (invariant 4)",
    ),
    Check(
        "open_attempt_past_lease",
        "no attempt stays open past its lease plus the margin: a lost worker's lease is ended "
        "by a sweep (invariant 3)",
    ),
    Check("two_successes", "no delivery has two success attempts (invariant 4)"),
    Check(
        "send_without_reason",
        "a second send follows an attempt that finished retryable, rate limited or ambiguous, "
        "or a requeue of a rejected one (invariant 9)",
    ),
    Check(
        "success_matches_state",
        "a succeeded delivery has its success attempt, and a success attempt's delivery is "
        "succeeded (invariants 3, 4)",
    ),
    Check(
        "tombstone_beside_live",
        "no tombstone shares its id with a live delivery (invariant 8)",
    ),
    Check("delivery_without_identity", "every delivery holds its identity row (invariant 8)"),
    Check(
        "enqueued_without_outbox",
        "an enqueued delivery has a committed outbox row for its current dispatch (invariant 3)",
    ),
    Check(
        "attempt_without_delivery",
        "every attempt belongs to a delivery that still has its row: the purge deletes them "
        "together (invariant 9)",
    ),
    Check(
        "sent_out_of_order",
        "on a destination that orders by asset, nothing is dispatched while an earlier delivery "
        "of its asset is not terminal, since it began ordering (invariant 10)",
    ),
    Check(
        "left_out_of_queue",
        "on a destination that orders or coalesces by asset, every open delivery is in its "
        "asset's queue, which the claim's rule reads (invariant 10)",
    ),
    Check(
        "permits_past_hold",
        "no in-flight permit is held longer than one hold from now: a lost holder's permits "
        "expire (rate limits)",
    ),
)
# Read through `status`'s own code (media_hooks.observe.figures) and set against the rows.
COUNTS = Check("counts_by_state", "status's counts by state are the rows' counts")


@dataclass(frozen=True)
class Options:
    # Read the whole history, not only the window.
    full: bool = False
    window_seconds: float = DEFAULT_WINDOW_SECONDS
    # Read the history from this instant (the database's clock) instead of the window.
    since: datetime | None = None
    # counts_by_state counts succeeded deliveries too (as many as retention keeps).
    succeeded: bool = True
    lease_margin_seconds: float = DEFAULT_LEASE_MARGIN_SECONDS
    # The longest a permit is held (the lease length, MEDIA_HOOKS_LEASE_SECONDS).
    hold_seconds: float = 90.0


@dataclass(frozen=True)
class Result:
    name: str
    invariant: str
    violations: int
    examples: tuple[str, ...]

    @property
    def holds(self) -> bool:
        return self.violations == 0


@dataclass(frozen=True)
class Report:
    checked_at: datetime
    # The history read: since this instant (None: all of it).
    since: datetime | None
    results: tuple[Result, ...]

    @property
    def holds(self) -> bool:
        return all(r.holds for r in self.results)

    def failed(self) -> list[Result]:
        return [r for r in self.results if not r.holds]

    def as_dict(self) -> dict[str, Any]:
        return {
            "holds": self.holds,
            "checked_at": self.checked_at.isoformat(),
            "since": None if self.since is None else self.since.isoformat(),
            "checks": [
                {**asdict(r), "examples": list(r.examples), "holds": r.holds} for r in self.results
            ],
        }


def _parameters(conn: psycopg.Connection, options: Options) -> dict[str, Any]:
    clock = conn.execute(
        query("check_clock"), {"window_seconds": options.window_seconds, "since": options.since}
    ).fetchone()
    return {
        "now": clock["now"],
        "since": None if options.full else clock["since"],
        "lease_margin_seconds": options.lease_margin_seconds,
        "hold_seconds": options.hold_seconds,
        "clock_slack_seconds": CLOCK_SLACK_SECONDS,
    }


def _counts(conn: psycopg.Connection, *, succeeded: bool) -> Result:
    """``status``'s counts against the rows' (``succeeded=False``: both without the succeeded
    history, which then reads 0 on both sides)."""
    shown = figures.measure(conn, history=succeeded).totals
    # `status` counts a dead delivery closed unsent under its reason (superseded, discarded).
    shown["dead"] += sum(shown.pop(reason) for reason in figures.CLOSED)
    rows = conn.execute(query("check_counts_by_state"), {"succeeded": succeeded}).fetchone()
    differ = [
        f"{state}: status {shown[state]}, rows {rows[state]}"
        for state in figures.STATES
        if shown[state] != rows[state]
    ]
    return Result(COUNTS.name, COUNTS.invariant, len(differ), tuple(differ))


def _one(conn: psycopg.Connection, check: Check, parameters: dict[str, Any]) -> Result:
    row = conn.execute(query(f"check_{check.name}"), parameters).fetchone()
    return Result(check.name, check.invariant, row["violations"], tuple(row["examples"] or ()))


def run(conn: psycopg.Connection, options: Options = Options()) -> Report:
    """Every check, in one read-only snapshot. ``conn`` is an autocommit connection with dict
    rows (``db.connect``), in the operator's role; it is left as it was given."""
    saved = (conn.isolation_level, conn.read_only)
    conn.isolation_level, conn.read_only = IsolationLevel.REPEATABLE_READ, True
    try:
        with conn.transaction():
            if not options.full:
                # The default pass reads through its indexes whatever the statistics say (a
                # backlog that just turned leased looks empty to them), so it stays bounded.
                conn.execute(query("check_through_indexes"))
            parameters = _parameters(conn, options)
            # '-infinity' rather than NULL: the statements compare with it, and the planner
            # turns that comparison into a whole-table read only when it is asked for.
            bound = {**parameters, "since": parameters["since"] or "-infinity"}
            results = [_one(conn, check, bound) for check in CHECKS]
            results.append(_counts(conn, succeeded=options.succeeded))
    finally:
        conn.isolation_level, conn.read_only = saved
    return Report(parameters["now"], parameters["since"], tuple(results))
