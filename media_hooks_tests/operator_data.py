"""A database with one delivery in every condition an operator asks about, reached through the
engine's own transitions (claim, publish, lease, record, pause, disable, requeue), for the
status, inspect, requeue and metrics tests."""

from __future__ import annotations

import time

import psycopg

from media_hooks.outbox import leases, rate_limits
from media_hooks.outbox.cohort import Cohort
from media_hooks.outbox.destinations import disable_destination
from media_hooks.outbox.leases import Classified, Lease
from media_hooks.outbox.maintenance.requeue import requeue
from media_hooks_tests.factories import (
    ROOMY,
    add_deliveries,
    add_destination,
    claim_messages,
    lease_all,
)

RUN = "run-prepared-1"
LONG_LEASE = 300.0
SHORT_LEASE = 0.2


def _answer(lease: Lease, outcome: str, status: int, error: str | None) -> Classified:
    return Classified(
        lease=lease,
        outcome=outcome,
        http_status=status,
        retry_after_seconds=None,
        error=error,
        response_excerpt='{"ok": true}' if outcome == "success" else None,
        finished_monotonic=time.monotonic(),
    )


def _wait_until_expired(conn: psycopg.Connection, delivery_id: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        expired = conn.execute(
            "SELECT lease_until < now() AS expired FROM webhook_delivery_all WHERE delivery_id = %s",
            (delivery_id,),
        ).fetchone()["expired"]
        if expired:
            return
        time.sleep(0.02)
    raise AssertionError(f"the lease of {delivery_id} did not expire within {timeout}s")


def prepare(conn: psycopg.Connection) -> dict[str, str]:
    """One delivery per condition; returns {condition: delivery_id}.

    Destinations: ``alpha`` (sending), ``beta`` (paused for an hour), ``gamma`` (disabled).
    """
    # alpha: room for its six leases at once, and a failed attempt waits about ten minutes
    # (the database's backoff with its jitter: 480 to 720 s).
    add_destination(conn, "alpha", "http://127.0.0.1:9/alpha", **ROOMY, backoff_base_seconds=600)
    for name in ("beta", "gamma"):
        add_destination(conn, name, f"http://127.0.0.1:9/{name}")
    ids = add_deliveries(conn, "alpha", 7, prefix="a")
    published = claim_messages(conn, RUN, Cohort(destination_ids=("alpha",)))
    by_id = {m.delivery_id: m for m in published}
    held = lease_all(conn, RUN, [by_id[i] for i in ids[:4]] + [by_id[ids[6]]], LONG_LEASE)
    (short,) = lease_all(conn, RUN, [by_id[ids[4]]], SHORT_LEASE)
    lease_of = {lease.delivery_id: lease for lease in held}
    leases.record_classified(
        conn,
        [
            _answer(lease_of[ids[0]], "success", 200, None),
            _answer(lease_of[ids[1]], "rejected", 422, "HTTP 422 Unprocessable Entity"),
            _answer(lease_of[ids[2]], "retryable", 500, "HTTP 500 Internal Server Error"),
            _answer(lease_of[ids[6]], "rejected", 404, "HTTP 404 Not Found"),
        ],
    )
    requeue(
        conn,
        Cohort(destination_ids=("alpha",), asset_ids=("asset-7",)),
        reason="receiver fixed its routes",
        requested_by="tester",
    )
    _wait_until_expired(conn, short.delivery_id)
    (due,) = add_deliveries(conn, "alpha", 1, prefix="due")
    (paused,) = add_deliveries(conn, "beta", 1, prefix="p")
    (disabled,) = add_deliveries(conn, "gamma", 1, prefix="g")
    rate_limits.pause_destination(conn, "beta", 3600, "HTTP 429 with Retry-After 3600 s")
    disable_destination(conn, "gamma", "receiver answered HTTP 410 (Gone)")
    return {
        "succeeded": ids[0],
        "dead": ids[1],
        "waiting": ids[2],
        "leased": ids[3],
        "lease_expired": ids[4],
        "enqueued": ids[5],
        "requeued": ids[6],
        "due": due,
        "paused": paused,
        "disabled": disabled,
    }
