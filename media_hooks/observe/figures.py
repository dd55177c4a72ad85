"""The operator's figures: is anything late, waiting by policy, or lost?

One ``measure`` reads everything ``status``, ``metrics`` and the Dagster lag sensor show, in a
few statements over the partial indexes of the schema and two reads of ``pg_stat_activity``
(``sql/queries/figures.sql``). Without its history (``history=False``) it costs what the
backlog and the dead letters hold, whatever the history retention keeps; ``measure_history``
counts that history (the succeeded deliveries, a day of attempts), for the readers that show it
(``status``, and the metrics exporter on a schedule of its own). No Dagster here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import Any

import psycopg

from media_hooks.observe.inspection import format_age
from media_hooks.outbox.cohort import Cohort
from media_hooks.outbox.maintenance import partitions
from media_hooks.store import sessions
from media_hooks.store.sqlfiles import generation, query

STATES = ("pending", "enqueued", "leased", "succeeded", "dead")
# Dead deliveries closed unsent count under their reason, not as dead (issue 14).
CLOSED = ("superseded", "discarded")
COUNTED = STATES + CLOSED
GROUPINGS = ("destination", "event-type")
# Without the history: open and dead deliveries only, through their partial indexes.
OPEN_COUNTS = "figures_open_counts_by_state"
SUCCEEDED_COUNTS = "figures_succeeded_counts"
DEAD_HEADS_SHOWN = 20


@dataclass(frozen=True)
class DeadHead:
    """A dead delivery holding the later deliveries of its asset on an ordered destination."""

    delivery_id: str
    destination_id: str
    asset_id: str
    holding: int


@dataclass(frozen=True)
class DestinationFlag:
    """A destination that is not sending: paused by a Retry-After, or disabled."""

    destination_id: str
    enabled: bool
    paused_until: datetime | None
    paused_reason: str | None
    disabled_reason: str | None
    disabled_at: datetime | None


@dataclass(frozen=True)
class SnapshotHolder:
    """The session that holds back vacuum the longest (a worker's transaction of a few
    milliseconds, most of the time): what an operator needs to end it, never its query, which
    may carry secrets."""

    pid: int
    application_name: str
    state: str | None
    since: datetime
    age_seconds: float

    def describe(self) -> str:
        state = f", {self.state}" if self.state else ""
        return (
            f"a transaction open for {format_age(self.age_seconds)} (pid {self.pid}, "
            f"application_name {self.application_name!r}{state})"
        )


@dataclass(frozen=True)
class ReleaseSessions:
    """The sessions of one release connected to the database, by role. ``release`` says whose:
    ``this`` (the measuring release's schema generation), ``earlier`` or ``later``; an earlier
    release from before sessions named their generation has ``generation`` None."""

    generation: int | None
    release: str
    roles: dict[str, int]

    def describe(self) -> str:
        which = {"this": "this release", "earlier": "an earlier release"}.get(
            self.release, "a later release"
        )
        roles = ", ".join(f"{role} {n}" for role, n in self.roles.items())
        return f"{which} ({sessions.label(self.generation)}): {roles}"


@dataclass(frozen=True)
class Figures:
    measured_at: datetime
    # destination_id (or event type, counts_by) -> state -> count (only states that have rows);
    # a dead delivery closed unsent counts under superseded or discarded.
    counts: dict[str, dict[str, int]]
    # Due now and sendable (destination enabled, not paused); None when nothing is.
    oldest_due_age_seconds: float | None
    oldest_due_at: datetime | None
    # Due now, whatever its destination's condition.
    oldest_due_any_age_seconds: float | None
    relay_lag_seconds: float | None
    oldest_enqueued_age_seconds: float | None
    expired_leases: int
    dead_letters: int
    newest_dead_at: datetime | None
    paused: tuple[DestinationFlag, ...] = ()
    disabled: tuple[DestinationFlag, ...] = ()
    attempts_last_hour: dict[str, int] = field(default_factory=dict)
    attempts_last_day: dict[str, int] = field(default_factory=dict)
    dead_heads: tuple[DeadHead, ...] = ()
    # The oldest snapshot vacuum must respect; None when no other session holds one.
    oldest_snapshot: SnapshotHolder | None = None
    # How far ahead of now the history tables' partitions are made (an emit past that finds no
    # partition for its body and fails); None before any was made.
    partitions_ahead_seconds: float | None = None
    counts_by: str = "destination"
    # The other media_hooks sessions connected, by release (this one first).
    sessions: tuple[ReleaseSessions, ...] = ()
    # False when the history was left out (measure(history=False)): no succeeded counts, no
    # attempts by outcome.
    history: bool = True

    @property
    def oldest_snapshot_age_seconds(self) -> float | None:
        return None if self.oldest_snapshot is None else self.oldest_snapshot.age_seconds

    @property
    def totals(self) -> dict[str, int]:
        """Deliveries per state over every destination (every state present, zeros included)."""
        totals = dict.fromkeys(COUNTED, 0)
        for by_state in self.counts.values():
            for state, n in by_state.items():
                totals[state] = totals.get(state, 0) + n
        return totals

    @property
    def due_work(self) -> bool:
        return self.oldest_due_age_seconds is not None

    def work_waiting(self, enqueue_timeout_seconds: float) -> list[str]:
        """What a delivery run would do now, in words: sendable due deliveries, and the rows its
        sweeps would make due again (expired leases, enqueues older than the timeout). Empty
        when a run would find nothing to do."""
        work = []
        if self.due_work:
            work.append(f"deliveries due (oldest {_age(self.oldest_due_age_seconds)})")
        if self.expired_leases:
            work.append(f"{self.expired_leases} expired lease(s)")
        enqueued = self.oldest_enqueued_age_seconds
        if enqueued is not None and enqueued >= enqueue_timeout_seconds:
            work.append(f"stale enqueues (oldest {_age(enqueued)})")
        return work

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready document; ages in seconds, times as ISO 8601."""
        document = asdict(self)
        document["totals"] = self.totals
        return _iso_times(document)

    def headline(self) -> str:
        """One line naming the figures an operator checks first."""
        totals = self.totals
        return (
            f"pending {totals['pending']}, enqueued {totals['enqueued']}, "
            f"leased {totals['leased']}, dead {self.dead_letters}; "
            f"oldest due {_age(self.oldest_due_age_seconds)}, "
            f"relay lag {_age(self.relay_lag_seconds)}, "
            f"expired leases {self.expired_leases}, "
            f"paused {len(self.paused)}, disabled {len(self.disabled)}"
        )


def _age(seconds: float | None) -> str:
    return "none" if seconds is None else f"{seconds:.0f}s"


def _iso_times(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _iso_times(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_iso_times(v) for v in value]
    return value


def _seconds_since(measured_at: datetime, then: datetime | None) -> float | None:
    if then is None:
        return None
    return max(0.0, (measured_at - then).total_seconds())


def _statement(by: str, history: bool) -> str:
    """What counts deliveries by state, grouped ``by`` destination (without the succeeded
    history: measure_history counts it) or event type (with it)."""
    if by == "event-type":
        if not history:
            raise ValueError("figures without the history are counted by destination")
        return "figures_counts_by_event_type"
    return OPEN_COUNTS


def _counts(
    conn: psycopg.Connection, statement: str, *, by_destination: bool
) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {}
    for row in conn.execute(query(statement)):
        counts.setdefault(row["key"], {})[row["state"]] = row["n"]
    if by_destination:
        for row in conn.execute(query("figures_closed_counts")):
            by_state = counts[row["key"]]
            by_state[row["state"]] = row["n"]
            by_state["dead"] -= row["n"]
            if not by_state["dead"]:
                del by_state["dead"]
    return counts


def _flags(conn: psycopg.Connection, now: datetime | None, measured_at: datetime):
    rows = conn.execute(query("figures_destination_flags"), {"now": now}).fetchall()
    flags = [DestinationFlag(**row) for row in rows]
    paused = tuple(f for f in flags if f.paused_until is not None and f.paused_until > measured_at)
    disabled = tuple(f for f in flags if not f.enabled)
    return paused, disabled


def _attempts(conn: psycopg.Connection, now: datetime | None):
    rows = conn.execute(query("figures_attempts_by_outcome"), {"now": now}).fetchall()
    hour = {row["outcome"]: row["last_hour"] for row in rows if row["last_hour"]}
    day = {row["outcome"]: row["last_day"] for row in rows}
    return hour, day


def _oldest_snapshot(conn: psycopg.Connection, measured_at: datetime) -> SnapshotHolder | None:
    row = conn.execute(query("figures_oldest_snapshot")).fetchone()
    if row is None:
        return None
    return SnapshotHolder(**row, age_seconds=_seconds_since(measured_at, row["since"]) or 0.0)


def _release(named: int | None, ours: int) -> str:
    if named == ours:
        return "this"
    return "earlier" if sessions.earlier(named, ours) else "later"


def connected_sessions(conn: psycopg.Connection) -> tuple[ReleaseSessions, ...]:
    """The other media_hooks sessions connected to this database, by release and role: this
    release's first, then the others by generation (unnamed first)."""
    ours = generation()
    found = sessions.connected(conn)
    order = sorted(found, key=lambda g: (g != ours, sessions.oldest_first(g)))
    return tuple(
        ReleaseSessions(g, _release(g, ours), dict(sorted(found[g].items()))) for g in order
    )


def measure(
    conn: psycopg.Connection,
    *,
    now: datetime | None = None,
    by: str = "destination",
    history: bool = True,
) -> Figures:
    """Every figure at one instant (``now``, or the database server's clock); counts grouped
    ``by`` destination or event-type. ``history=False`` leaves out what grows with the history
    retention keeps (succeeded deliveries, a day of attempts; counts by destination): what a
    delivery run and a sensor tick read, each time, whatever the volume."""
    if by == "destination" and history:
        live = measure(conn, now=now, history=False)
        return with_history(live, measure_history(conn, now=now))
    statement = _statement(by, history)
    scalars = conn.execute(query("figures_scalars"), {"now": now}).fetchone()
    at = scalars["measured_at"]
    paused, disabled = _flags(conn, now, at)
    hour, day = _attempts(conn, now) if history else ({}, {})
    return Figures(
        measured_at=at,
        counts=_counts(conn, statement, by_destination=by == "destination"),
        oldest_due_age_seconds=_seconds_since(at, scalars["oldest_due_at"]),
        oldest_due_at=scalars["oldest_due_at"],
        oldest_due_any_age_seconds=_seconds_since(
            at, min(oldest_due_by_destination(conn, now=at).values(), default=None)
        ),
        relay_lag_seconds=_seconds_since(at, scalars["oldest_unpublished_at"]),
        oldest_enqueued_age_seconds=_seconds_since(at, scalars["oldest_enqueued_at"]),
        expired_leases=scalars["expired_leases"],
        dead_letters=scalars["dead_letters"],
        newest_dead_at=scalars["newest_dead_at"],
        paused=paused,
        disabled=disabled,
        attempts_last_hour=hour,
        attempts_last_day=day,
        dead_heads=tuple(
            DeadHead(**row)
            for row in conn.execute(query("figures_dead_heads"), {"limit": DEAD_HEADS_SHOWN})
        ),
        oldest_snapshot=_oldest_snapshot(conn, at),
        partitions_ahead_seconds=partitions.ahead_seconds(conn),
        counts_by=by,
        sessions=connected_sessions(conn),
        history=history,
    )


@dataclass(frozen=True)
class History:
    """The figures that grow with the history retention keeps: succeeded deliveries per
    destination (as many as it keeps: weeks of them) and the attempts finished by outcome over
    the last hour and day (a day's volume). Counted apart where a reader cannot pay for them
    each time (the metrics exporter counts them on a schedule of their own)."""

    succeeded: dict[str, int]
    attempts_last_hour: dict[str, int]
    attempts_last_day: dict[str, int]


def measure_history(conn: psycopg.Connection, *, now: datetime | None = None) -> History:
    """The history's figures at one instant (``now``, or the server's clock)."""
    succeeded = {row["key"]: row["n"] for row in conn.execute(query(SUCCEEDED_COUNTS))}
    hour, day = _attempts(conn, now)
    return History(succeeded, hour, day)


def with_history(measured: Figures, history: History) -> Figures:
    """``measured`` (by destination, without its history) with ``history`` counted apart."""
    counts = {key: dict(by_state) for key, by_state in measured.counts.items()}
    for key, n in history.succeeded.items():
        counts.setdefault(key, {})["succeeded"] = n
    return replace(
        measured,
        counts=dict(sorted(counts.items())),
        attempts_last_hour=history.attempts_last_hour,
        attempts_last_day=history.attempts_last_day,
        history=True,
    )


def oldest_due_by_destination(
    conn: psycopg.Connection, *, now: datetime | None = None
) -> dict[str, datetime]:
    """Each destination with a delivery due now (sendable or not): when its oldest became due."""
    rows = conn.execute(query("figures_oldest_due_by_destination"), {"now": now})
    return {row["destination_id"]: row["oldest_due_at"] for row in rows}


def cohort_due(conn: psycopg.Connection, cohort: Cohort) -> bool:
    """Whether a delivery run for ``cohort`` would claim anything now."""
    return bool(conn.execute(query("figures_cohort_due"), cohort.params()).fetchone()["due"])
