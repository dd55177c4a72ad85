"""Shared by the tests of per-asset order: claim a run's page, settle a delivery by hand, and
what a receiver saw of each asset."""

from __future__ import annotations

import json

import psycopg

from media_hooks.devtools.receiver import Receiver
from media_hooks.outbox.cohort import Cohort
from media_hooks_tests.factories import claim_all


def claimed(conn: psycopg.Connection, run_id: str) -> set[str]:
    """The delivery ids a reconciler run claims now."""
    claim_all(conn, run_id, Cohort())
    rows = conn.execute("SELECT delivery_id FROM dispatch_outbox WHERE run_id = %s", (run_id,))
    return {r["delivery_id"] for r in rows}


def settle(conn: psycopg.Connection, delivery_id: str, state: str) -> None:
    """A delivery ends in ``state`` (the settle trigger fires as after a worker's outcome)."""
    conn.execute(
        "UPDATE webhook_delivery_all SET state = %s, updated_at = now() WHERE delivery_id = %s",
        (state, delivery_id),
    )


def revisions_received(receiver: Receiver) -> dict[str, list[int]]:
    """Each asset's ``revision`` payload field, in the order the receiver got the requests."""
    seen: dict[str, list[int]] = {}
    for request in sorted(receiver.requests, key=lambda r: r.arrived_monotonic):
        body = json.loads(request.body)
        seen.setdefault(body["asset_id"], []).append(body["data"]["revision"])
    return seen
