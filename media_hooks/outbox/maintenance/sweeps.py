"""Maintenance sweeps, each named, bounded and counted: their figures are evidence.

Each can be called from a Dagster op, the CLI or a test. A sweep moves at most ``limit_rows``
rows per statement and repeats until a statement comes back short. A statement refused by a
lock or a timeout is retried (media_hooks.store.db.retrying).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from media_hooks.core.config import Settings
from media_hooks.outbox import rate_limits
from media_hooks.outbox.maintenance import partitions
from media_hooks.store import db
from media_hooks.store.sqlfiles import query

SWEEP_PAGE = 1000


@dataclass(frozen=True)
class SweepFigures:
    expired_leases: int
    stale_enqueues: int
    breaker_disabled: int
    superseded: int = 0
    woken_heads: int = 0


def _moved(conn: psycopg.Connection, name: str, params: dict[str, Any]) -> int:
    return db.retrying(name, lambda: conn.execute(query(name), params).fetchone()["moved"])


def _repeat(conn: psycopg.Connection, name: str, params: dict[str, Any]) -> int:
    moved_total = 0
    while True:
        moved = _moved(conn, name, {**params, "limit_rows": SWEEP_PAGE})
        moved_total += moved
        if moved < SWEEP_PAGE:
            return moved_total


def convert_previous_pending(conn: psycopg.Connection) -> int:
    """Move the previous release's pending deliveries into this release's layout, so that
    this release's claims see them (its producers may still be recording them)."""
    return _repeat(conn, "convert_previous_pending", {})


def sweep_expired_leases(conn: psycopg.Connection) -> int:
    return _repeat(conn, "sweep_expired_leases", {})


def sweep_stale_enqueues(conn: psycopg.Connection, timeout_seconds: float) -> int:
    return _repeat(conn, "sweep_stale_enqueues", {"timeout_seconds": timeout_seconds})


def sweep_wake_parked_heads(conn: psycopg.Connection) -> int:
    """Make due the parked deliveries of ordered destinations that head their asset's queue
    with nobody left to wake them (born parked while the delivery before them settled); pages
    through the queues that hold parked deliveries, in queue order."""
    woken = 0
    after = {"after_destination": "", "after_asset": ""}
    while True:
        params = {**after, "limit_rows": SWEEP_PAGE}
        row = db.retrying(
            "sweep_wake_parked_heads",
            lambda p=params: conn.execute(query("sweep_wake_parked_heads"), p).fetchone(),
        )
        woken += row["moved"]
        if row["scanned"] < SWEEP_PAGE:
            return woken
        after = {key: row[key] for key in after}


def sweep_superseded(conn: psycopg.Connection) -> int:
    """Close the pending deliveries that a newer one of their asset and type supersedes, on
    destinations that coalesce by asset (``destination add --coalesce asset``)."""
    return _repeat(conn, "sweep_superseded", {})


def release_run(conn: psycopg.Connection, run_id: str) -> int:
    """A run known to have failed: its enqueued and leased rows become due again now, and
    the send permits its workers held are freed for the next run."""
    moved = _moved(
        conn,
        "release_run",
        {
            "run_id": run_id,
            "destination_ids": None,
            "cause": f"released: run {run_id} failed",
            "error": "run failed before an outcome was recorded",
        },
    )
    db.retrying("release the run's permits", lambda: rate_limits.release_holder(conn, run_id))
    return moved


def release_step(conn: psycopg.Connection, run_id: str, destination_ids: list[str]) -> int:
    """What an earlier attempt of a step of ``run_id`` left claimed on ``destination_ids``
    (its worker died mid-step, and the step is executing again): those rows become due again
    now. Its permits are left to run out (``lease_seconds``): they are held under the run's
    id, like those of the run's other steps, which are still sending."""
    return _moved(
        conn,
        "release_run",
        {
            "run_id": run_id,
            "destination_ids": destination_ids,
            "cause": f"released: an earlier attempt of its step in run {run_id} ended "
            "without handing it back",
            "error": "the step's earlier attempt ended before an outcome was recorded",
        },
    )


def trip_circuit_breakers(conn: psycopg.Connection, settings: Settings) -> list[dict[str, str]]:
    params = {
        "stretch_seconds": settings.breaker_stretch_seconds,
        "min_attempts": settings.breaker_min_attempts,
    }
    return db.retrying(
        "trip_circuit_breakers",
        lambda: conn.execute(query("trip_circuit_breakers"), params).fetchall(),
    )


def run_sweeps(conn: psycopg.Connection, settings: Settings) -> SweepFigures:
    partitions.make_ahead(conn)
    convert_previous_pending(conn)
    return SweepFigures(
        expired_leases=sweep_expired_leases(conn),
        stale_enqueues=sweep_stale_enqueues(conn, settings.enqueue_timeout_seconds),
        breaker_disabled=len(trip_circuit_breakers(conn, settings)),
        superseded=sweep_superseded(conn),
        woken_heads=sweep_wake_parked_heads(conn),
    )
