"""Retention: ended deliveries leave the tables; their identity stays as a tombstone.

This layout's deliveries go a range at a time: once a range of creation times is past the
retention window, and nothing of it is open or ended within the window, its partitions of body,
history, dispatches and attempts are dropped whole (``partitions``); a range something holds is
kept, and said. The previous layout's table (``webhook_delivery_v1``) is still purged row by row:
a terminal (``succeeded`` / ``dead``) delivery last changed before the window is deleted with its
outbox and attempt rows, in bounded batches, each batch its own short transaction, and its row of
``delivery_identity`` becomes its tombstone (``final_state``). Either way the identity row keeps
the ``delivery_id`` for the longer duplicate window, counted from the delivery's creation, so a
re-emitted old event is recognised as already delivered rather than sent again, even by an emit
racing the purge (migration 0005); then it is forgotten. Pending and in-flight deliveries are
never touched (invariant 3). No Dagster here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psycopg

from media_hooks.core.errors import UserError
from media_hooks.outbox.maintenance import partitions
from media_hooks.store import db
from media_hooks.store.sqlfiles import query

DAY = 86400.0


@dataclass(frozen=True)
class RetentionPolicy:
    retain_seconds: float = 30 * DAY
    # How long a purged delivery_id is still recognised, measured from its creation.
    tombstone_seconds: float = 400 * DAY
    batch_size: int = 1000
    # A safety bound on one run's work (the next run carries on), not a pace: a daily run must
    # purge a day's deliveries, and 1,000 batches (the bound until this release) fell behind at
    # more than a million deliveries a day, for good.
    max_batches: int = 100_000

    def __post_init__(self) -> None:
        if self.retain_seconds <= 0 or self.tombstone_seconds <= 0:
            raise UserError("retention windows must be greater than 0")
        if self.tombstone_seconds < self.retain_seconds:
            raise UserError(
                "the tombstone (duplicate) window must be at least the retention window"
            )
        if self.batch_size < 1 or self.max_batches < 1:
            raise UserError("retention batch_size and max_batches must be at least 1")


@dataclass(frozen=True)
class RetentionFigures:
    deliveries: int = 0
    outbox_rows: int = 0
    attempts: int = 0
    tombstones_written: int = 0
    tombstones_expired: int = 0
    events_expired: int = 0
    batches: int = 0
    # This layout's history: ranges of partitions dropped whole; ranges past the window kept
    # because something holds them (an open delivery, one that ended within the window), one
    # line each saying what; of those, ranges put back because an open delivery slipped into
    # them while they were detached.
    partitions_dropped: int = 0
    partitions_held: int = 0
    held_ranges: tuple[str, ...] = ()
    partitions_put_back: int = 0
    # True when max_batches stopped the purge with work left.
    truncated: bool = False

    def as_dict(self) -> dict[str, int | bool | list[str]]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}


def _cutoffs(conn: psycopg.Connection, policy: RetentionPolicy, now: datetime | None):
    row = conn.execute(
        query("retention_cutoffs"),
        {
            "now": now,
            "retain_seconds": policy.retain_seconds,
            "tombstone_seconds": policy.tombstone_seconds,
        },
    ).fetchone()
    return row["purge_cutoff"], row["tombstone_cutoff"]


def purge_terminal(
    conn: psycopg.Connection, cutoff: datetime, *, batch_size: int, max_batches: int
) -> RetentionFigures:
    """Delete terminal deliveries last changed before ``cutoff``, batch by batch.

    ``conn`` must be in autocommit mode: each batch commits on its own, so a long purge never
    holds locks on more than one batch of rows.
    """
    totals = dict(deliveries=0, outbox_rows=0, attempts=0, tombstones_written=0)
    batches = 0
    while batches < max_batches:
        row = db.retrying(
            "purge a batch",
            lambda: conn.execute(
                query("purge_terminal_batch"), {"cutoff": cutoff, "batch_size": batch_size}
            ).fetchone(),
        )
        batches += 1
        totals["deliveries"] += row["deliveries"]
        totals["outbox_rows"] += row["outbox_rows"]
        totals["attempts"] += row["attempts"]
        totals["tombstones_written"] += row["tombstones"]
        if row["deliveries"] < batch_size:
            return RetentionFigures(**totals, batches=batches)
    return RetentionFigures(**totals, batches=batches, truncated=True)


def _expire(
    conn: psycopg.Connection, name: str, cutoff: datetime, *, batch_size: int, max_batches: int
) -> int:
    expired = 0
    params = {"cutoff": cutoff, "batch_size": batch_size}
    for _ in range(max_batches):
        n = db.retrying(name, lambda: conn.execute(query(name), params).rowcount)
        expired += n
        if n < batch_size:
            break
    return expired


def expire_tombstones(
    conn: psycopg.Connection, cutoff: datetime, *, batch_size: int, max_batches: int
) -> int:
    """Forget purged delivery ids whose event was created before ``cutoff``."""
    return _expire(
        conn, "expire_tombstones_batch", cutoff, batch_size=batch_size, max_batches=max_batches
    )


def expire_events(
    conn: psycopg.Connection, cutoff: datetime, *, batch_size: int, max_batches: int
) -> int:
    """Forget events (emitted without a destination) recorded before ``cutoff``."""
    return _expire(
        conn, "expire_events_batch", cutoff, batch_size=batch_size, max_batches=max_batches
    )


def run_retention(
    conn: psycopg.Connection, policy: RetentionPolicy, *, now: datetime | None = None
) -> RetentionFigures:
    """One retention pass: purge the previous layout's terminal deliveries, make partitions
    ahead and drop the ranges retention is done with, then expire old identities and events."""
    purge_cutoff, tombstone_cutoff = _cutoffs(conn, policy, now)
    purged = purge_terminal(
        conn, purge_cutoff, batch_size=policy.batch_size, max_batches=policy.max_batches
    )
    partitions.make_ahead(conn)
    dropped = partitions.drop_expired(conn, purge_cutoff)
    bounds = {"batch_size": policy.batch_size, "max_batches": policy.max_batches}
    expired = expire_tombstones(conn, tombstone_cutoff, **bounds) + _expire(
        conn, "expire_identities_batch", tombstone_cutoff, **bounds
    )
    events = expire_events(conn, tombstone_cutoff, **bounds)
    return RetentionFigures(
        **{
            **purged.as_dict(),
            "deliveries": purged.deliveries + dropped.deliveries,
            "tombstones_expired": expired,
            "events_expired": events,
            "partitions_dropped": dropped.ranges,
            "partitions_held": len(dropped.held),
            "held_ranges": tuple(map(str, dropped.held)),
            "partitions_put_back": dropped.put_back,
        },
    )


def is_tombstoned(conn: psycopg.Connection, delivery_id: str) -> bool:
    """Whether ``delivery_id`` was delivered and purged within the duplicate window."""
    return bool(
        conn.execute(query("tombstone_exists"), {"delivery_id": delivery_id}).fetchone()["present"]
    )
