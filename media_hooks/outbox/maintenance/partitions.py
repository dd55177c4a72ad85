"""The history tables' partitions: made ahead of the clock, dropped whole once retention is done
with them (docs/design/hot-path.md, section 4).

``delivery_body``, ``delivery_history``, ``dispatch_outbox_v3`` and ``delivery_attempt_v2`` are
partitioned by their delivery's creation time, one range of ``media_hooks_partitioning
.width_seconds`` for all four. A range is dropped when it ended before the retention cutoff, none
of its deliveries ended within the window (``partitions_expired``), and nothing open was created
in it, nor anything the previous layout may still bring into it (``partitions_open_in_range``):
otherwise it is held, and the pass says by what. Each table's partition is detached
``CONCURRENTLY`` (no lock that stops a producer or a worker; a transaction that could still write
it is waited for), the history's first, and the range is checked again after each: an open
delivery that slipped in (a requeue, a transaction that began before the range ended) puts every
partition back, and the range waits for the next pass. Only then are the tables dropped, in one
transaction with their ledger rows. Each step finds where an interrupted pass left the range (a
detach cut short while it waited, a table detached and not dropped) and carries on from there.
No Dagster here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import psycopg
from psycopg import sql

from media_hooks.store import db
from media_hooks.store.sqlfiles import query

# How far ahead partitions are made: a week of emits needs nothing else to run. AHEAD_RANGES
# partitions at most, though: for partitions under 5.6 hours wide (a benchmark's seconds) a week
# would be more tables than a few minutes of emits need.
AHEAD_SECONDS = 7 * 86400.0
AHEAD_RANGES = 30
# Ranges dropped in one pass at most (the next pass carries on).
DROP_LIMIT = 1000


@dataclass(frozen=True)
class Held:
    """A range retention is done with in time and keeps, and what holds it."""

    lower_at: datetime
    upper_at: datetime
    # Deliveries created in it that are open, or that the previous layout may still bring in.
    open: int = 0
    oldest_destination_id: str | None = None
    # One of its deliveries ended within the retention window.
    ended_late: bool = False

    def __str__(self) -> str:
        span = (
            f"range {self.lower_at.astimezone(UTC):%Y-%m-%d %H:%M} to "
            f"{self.upper_at.astimezone(UTC):%Y-%m-%d %H:%M} UTC"
        )
        if self.open:
            return (
                f"{span} held by {self.open} open deliveries, the oldest to destination "
                f"{self.oldest_destination_id}: kept until they end (enable, requeue or discard)"
            )
        return f"{span} held by a delivery that ended within the retention window"


@dataclass(frozen=True)
class Dropped:
    ranges: int = 0
    deliveries: int = 0
    # Ranges put back because an open delivery slipped into them while they were detached.
    put_back: int = 0
    # Every range past the cutoff that was kept, put back ones included.
    held: tuple[Held, ...] = ()


def make_ahead(conn: psycopg.Connection, ahead_seconds: float = AHEAD_SECONDS) -> int:
    """Make the partitions up to ``ahead_seconds`` from now (AHEAD_RANGES of them at most);
    how many were made."""
    params = {"ahead_seconds": ahead_seconds, "ahead_ranges": AHEAD_RANGES}
    return db.retrying(
        "make partitions",
        lambda: conn.execute(query("partitions_make"), params).fetchone()["made"],
    )


def ahead_seconds(conn: psycopg.Connection) -> float | None:
    """How far ahead of now the partitions reach (None before any was made)."""
    return conn.execute(query("partitions_ahead")).fetchone()["ahead_seconds"]


def expired(conn: psycopg.Connection, cutoff: datetime) -> list[dict]:
    """The ranges retention is done with in time (``partitions_expired``), oldest first:
    DROP_LIMIT of them at most."""
    return conn.execute(
        query("partitions_expired"), {"cutoff": cutoff, "limit": DROP_LIMIT}
    ).fetchall()


def drop_expired(conn: psycopg.Connection, cutoff: datetime) -> Dropped:
    """Drop every range retention is done with; say which it keeps. ``conn`` must be in
    autocommit mode (a concurrent detach cannot run in a transaction)."""
    dropped = put_back = deliveries = 0
    held: list[Held] = []
    for found in expired(conn, cutoff):
        holding = _holding(conn, found, ended_late=found["ended_late"]) or detach_range(conn, found)
        if holding is None:
            deliveries += drop_range(conn, found)
            dropped += 1
            continue
        held.append(holding)
        put_back += _put_back(conn, found)
    return Dropped(ranges=dropped, deliveries=deliveries, put_back=put_back, held=tuple(held))


def _holding(conn: psycopg.Connection, found: dict, *, ended_late: bool) -> Held | None:
    bounds = {"lower_at": found["lower_at"], "upper_at": found["upper_at"]}
    row = conn.execute(query("partitions_open_in_range"), bounds).fetchone()
    if not row["open"] and not ended_late:
        return None
    return Held(**bounds, **row, ended_late=ended_late)


def _tables(found: dict) -> list[tuple[str, str]]:
    """The range's (table, partition) pairs, the history's first."""
    return sorted(
        zip(found["parents"], found["children"], strict=True),
        key=lambda table: table[0] != "delivery_history",
    )


def detach_range(conn: psycopg.Connection, found: dict) -> Held | None:
    """Detach the range's partitions, the history's first: once it is detached no requeue can
    bring a dead delivery of the range back, and the range is checked again before each other
    table's goes, so that a delivery brought back open never misses its body. What holds the
    range, if something slipped in (drop_expired then puts its partitions back)."""
    for parent, child in _tables(found):
        _detach(conn, parent, child)
        holding = _holding(conn, found, ended_late=False)
        if holding is not None:
            return holding
    return None


def _put_back(conn: psycopg.Connection, found: dict) -> bool:
    """Attach again every partition of a held range that this pass or an interrupted one left
    detached; whether there was one."""
    detached = [
        (parent, child)
        for parent, child in _tables(found)
        if _attachment(conn, child) != "attached"
    ]
    for parent, child in detached:
        _detach(conn, parent, child)  # one left pending completes first
        statement = sql.SQL("ALTER TABLE {} ATTACH PARTITION {} FOR VALUES FROM ({}) TO ({})")
        attach = statement.format(
            sql.Identifier(parent),
            sql.Identifier(child),
            sql.Literal(found["lower_at"]),
            sql.Literal(found["upper_at"]),
        )
        db.retrying(f"attach {child}", lambda attach=attach: conn.execute(attach))
    return bool(detached)


def drop_range(conn: psycopg.Connection, found: dict) -> int:
    """Drop the range's detached partitions and their ledger rows, in one transaction (within
    the caller's, when it has one open); how many deliveries its history held."""
    history = found["children"][found["parents"].index("delivery_history")]
    bounds = {"lower_at": found["lower_at"], "upper_at": found["upper_at"]}

    def drop() -> int:
        with conn.transaction():
            n = conn.execute(
                sql.SQL("SELECT count(*) AS n FROM {}").format(sql.Identifier(history))
            ).fetchone()["n"]
            for child in found["children"]:
                conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(child)))
            conn.execute(query("partitions_forget"), bounds)
        return n

    return db.retrying(f"drop the partitions of {history}'s range", drop)


def _attachment(conn: psycopg.Connection, child: str) -> str:
    return conn.execute(query("partitions_attachment"), {"child": child}).fetchone()["attachment"]


# How a partition in each state is detached: a detach cut short while it waited (a lock
# timeout behind a long transaction) left it pending, which only FINALIZE completes; one
# detached already is left as it is.
_DETACH = {"attached": "CONCURRENTLY", "pending": "FINALIZE"}


def _detach(conn: psycopg.Connection, parent: str, child: str) -> None:
    def detach() -> None:
        how = _DETACH.get(_attachment(conn, child))
        if how is not None:
            conn.execute(
                sql.SQL("ALTER TABLE {} DETACH PARTITION {} {}").format(
                    sql.Identifier(parent), sql.Identifier(child), sql.SQL(how)
                )
            )

    db.retrying(f"detach {child}", detach)
