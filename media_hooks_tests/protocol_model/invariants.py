"""The invariants checked after every step: ``media-hooks check`` on the live tables, and the
model's own (media_hooks_tests.protocol_model.model, and the ones below that read the rows)."""

from __future__ import annotations

from datetime import datetime

import psycopg

from media_hooks.observe import checks
from media_hooks_tests.protocol_model.model import TERMINAL, Model, Row

# A start granted at t and the n-th after it at u: n + 1 <= burst + rate * (u - t), give or
# take this much (the clock's resolution and float arithmetic).
LIMITER_SLACK = 1e-6


def rows(conn: psycopg.Connection) -> dict[str, Row]:
    found = conn.execute(
        "SELECT delivery_id, destination_id, asset_id, event_type, state, closed_reason, "
        "emit_seq, created_at FROM webhook_delivery_all"
    ).fetchall()
    return {r["delivery_id"]: Row(**r) for r in found}


def live_checks(conn: psycopg.Connection, hold_seconds: float) -> None:
    report = checks.run(conn, checks.Options(full=True, hold_seconds=hold_seconds))
    failed = [f"{r.name}: {r.violations} ({', '.join(r.examples)})" for r in report.failed()]
    assert not failed, "media-hooks check fails: " + "; ".join(failed)


def _same_queue(a: Row, b: Row, by_type: bool) -> bool:
    return (
        a.destination_id == b.destination_id
        and a.asset_id == b.asset_id
        and (not by_type or a.event_type == b.event_type)
    )


def in_order(found: dict[str, Row], ordered: set[str], newly_succeeded: list[str]) -> None:
    """On a destination ordered by asset, a delivery succeeds only after every earlier one of
    its asset has ended (succeeded or dead)."""
    for delivery_id in newly_succeeded:
        row = found.get(delivery_id)
        if row is None or row.destination_id not in ordered:
            continue
        earlier = [
            r.delivery_id
            for r in found.values()
            if _same_queue(r, row, by_type=False)
            and r.emitted < row.emitted
            and r.state not in TERMINAL
        ]
        assert not earlier, f"{delivery_id} succeeded before earlier {earlier} of its asset"


def latest_wins(found: dict[str, Row], coalescing: set[str], newly_succeeded: list[str]) -> None:
    """On a destination that coalesces by asset, an older delivery never succeeds after a
    newer one of its asset and type did: the receiver would end on stale content."""
    for delivery_id in newly_succeeded:
        row = found.get(delivery_id)
        if row is None or row.destination_id not in coalescing:
            continue
        newer = [
            r.delivery_id
            for r in found.values()
            if _same_queue(r, row, by_type=True)
            and r.emitted > row.emitted
            and r.state == "succeeded"
            and r.delivery_id not in newly_succeeded
        ]
        assert not newer, f"{delivery_id} succeeded after newer {newer} of its asset had"


def superseded_closed(found: dict[str, Row], coalescing: set[str]) -> None:
    """After sweep_superseded: on a coalescing destination no pending delivery has a newer open
    one (not succeeded, not closed) of its asset and type (sql/queries/sweeps.sql)."""
    open_rows = [
        r
        for r in found.values()
        if r.destination_id in coalescing and r.state != "succeeded" and r.closed_reason is None
    ]
    stale = [
        r.delivery_id
        for r in open_rows
        if r.state == "pending"
        and any(_same_queue(n, r, by_type=True) and n.emitted > r.emitted for n in open_rows)
    ]
    assert not stale, f"superseded deliveries left pending after the sweep: {stale}"


def limiter(model: Model, limits: dict[str, tuple[float, int]]) -> None:
    """No window of the database's clock holds more granted starts than burst + rate * t."""
    for destination_id, granted in model.grants.items():
        rate, burst = limits[destination_id]
        starts: list[datetime] = sorted(granted)
        for i, first in enumerate(starts):
            for j in range(i + 1, len(starts)):
                span = (starts[j] - first).total_seconds()
                allowed = burst + rate * span + LIMITER_SLACK
                assert j - i + 1 <= allowed, (
                    f"{destination_id}: {j - i + 1} starts in {span:.6f} s "
                    f"(burst {burst}, rate {rate}/s allows {allowed:.3f})"
                )
