"""Failure boundaries: a real process killed at each named point, then a second run.

Every test ends with each delivery succeeded exactly once in the database, a deduplicating
receiver that saw only the deliveries' own ids (one logical effect each), and the attempt log
or outbox showing the interruption. Leases and the enqueue timeout are shortened by
configuration; the test waits on the database for them to lapse, never on a fixed sleep.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from media_hooks.core import crashpoints
from media_hooks.devtools.receiver import Receiver
from media_hooks_tests.conftest import REPO
from media_hooks_tests.factories import add_deliveries, add_destination, states

RUN = """
import sys
from media_hooks.store import db
from media_hooks.core.config import Settings
from media_hooks.engine.delivery_run import deliver_due
with db.open_pool(sys.argv[1]) as pool:
    report = deliver_due(pool, sys.argv[2], Settings.from_env())
print(report.totals.succeeded)
"""

COUNT = 4


def _run(
    database_url: str, run_id: str, crash_at: str | None = None
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEDIA_HOOKS_")}
    env.update(
        MEDIA_HOOKS_ALLOW_PRIVATE_URLS="1",
        MEDIA_HOOKS_LEASE_SECONDS="1",
        MEDIA_HOOKS_ENQUEUE_TIMEOUT_SECONDS="1",
    )
    if crash_at:
        env["MEDIA_HOOKS_CRASH_AT"] = crash_at
    return subprocess.run(
        [sys.executable, "-c", RUN, database_url, run_id],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _wait_until_swept_work_is_due(conn, deadline_seconds: float = 15.0) -> None:
    """Wait (on the database clock) until expired leases and stale enqueues are sweepable."""
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        row = conn.execute(
            """
            SELECT count(*) FILTER (WHERE state = 'leased' AND lease_until >= now()) AS live_leases,
                   count(*) FILTER (WHERE state = 'enqueued' AND updated_at >= now() - interval '1 second') AS fresh
            FROM webhook_delivery
            """
        ).fetchone()
        if row["live_leases"] == 0 and row["fresh"] == 0:
            return
        time.sleep(0.05)
    pytest.fail("leases / enqueues did not lapse in time")


@pytest.mark.parametrize("point", crashpoints.POINTS)
def test_a_process_killed_at_each_point_loses_and_duplicates_nothing(conn, database_url, point):
    with Receiver() as receiver:
        add_destination(conn, "cdn", url=receiver.url, max_in_flight=1, timeout_seconds=0.2)
        ids = add_deliveries(conn, "cdn", COUNT)

        crashed = _run(database_url, "run-crashed", crash_at=point)
        assert crashed.returncode == crashpoints.CRASH_EXIT_STATUS, crashed.stderr
        assert f"crash point {point} reached" in crashed.stderr

        _wait_until_swept_work_is_due(conn)
        recovered = _run(database_url, "run-recovery")
        assert recovered.returncode == 0, recovered.stderr

        assert states(conn) == {"succeeded": COUNT}
        assert receiver.accepted_ids == set(ids)
        assert {r.webhook_id for r in receiver.requests} <= set(ids)
        assert all(r.idempotency_key == r.webhook_id for r in receiver.requests)
        assert receiver.effects == COUNT
        _assert_interruption_is_on_record(conn, point)


def _assert_interruption_is_on_record(conn, point: str) -> None:
    crashed_outbox = conn.execute(
        "SELECT count(*) AS n, count(published_at) AS published FROM dispatch_outbox WHERE run_id = 'run-crashed'"
    ).fetchone()
    if point == crashpoints.BEFORE_CLAIM_COMMIT:
        assert crashed_outbox["n"] == 0  # the claim rolled back: nothing was dispatched
        return
    assert crashed_outbox["n"] > 0
    if point == crashpoints.AFTER_OUTBOX_COMMIT:
        assert crashed_outbox["published"] == 0
    lost = conn.execute(
        "SELECT outcome, error FROM delivery_attempt WHERE run_id = 'run-crashed'"
    ).fetchall()
    if point in (
        crashpoints.BEFORE_CLAIM_COMMIT,
        crashpoints.AFTER_OUTBOX_COMMIT,
        crashpoints.AFTER_PUBLISH,
    ):
        assert lost == []
    else:
        # The attempt was opened before the request; the sweep closed it as ambiguous.
        assert lost and all(a["outcome"] == "ambiguous" for a in lost)
        assert all("lease expired" in a["error"] for a in lost)
