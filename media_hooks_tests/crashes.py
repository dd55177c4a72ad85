"""What a run killed at a named crash point leaves behind, shared by the Python engine's and the
Node worker's crash tests: the database is waited on (leases and enqueues lapsing), never a
fixed sleep, and the interruption is checked to be on record."""

from __future__ import annotations

import time

import pytest

from media_hooks.core import crashpoints


def wait_until_swept_work_is_due(conn, deadline_seconds: float = 15.0) -> None:
    """Wait (on the database clock) until expired leases and stale enqueues are sweepable."""
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        row = conn.execute(
            """
            SELECT count(*) FILTER (WHERE state = 'leased' AND lease_until >= now()) AS live_leases,
                   count(*) FILTER (WHERE state = 'enqueued' AND updated_at >= now() - interval '1 second') AS fresh
            FROM webhook_delivery_all
            """
        ).fetchone()
        if row["live_leases"] == 0 and row["fresh"] == 0:
            return
        time.sleep(0.05)
    pytest.fail("leases / enqueues did not lapse in time")


def assert_interruption_is_on_record(conn, point: str) -> None:
    crashed_outbox = conn.execute(
        "SELECT count(*) AS n, count(published_at) AS published FROM dispatch_outbox WHERE run_id = 'run-crashed'"
    ).fetchone()
    if point == crashpoints.BEFORE_CLAIM_COMMIT:
        assert crashed_outbox["n"] == 0  # the claim rolled back: nothing was dispatched
        return
    # The claim publishes what it writes: nothing is left for a relay.
    assert crashed_outbox["n"] > 0 and crashed_outbox["published"] == crashed_outbox["n"]
    lost = conn.execute(
        "SELECT outcome, error FROM delivery_attempt_all WHERE run_id = 'run-crashed'"
    ).fetchall()
    if point == crashpoints.AFTER_OUTBOX_COMMIT:
        assert lost == []
    else:
        # The attempt was opened before the request; the sweep closed it as ambiguous.
        assert lost and all(a["outcome"] == "ambiguous" for a in lost)
        assert all("lease expired" in a["error"] for a in lost)
