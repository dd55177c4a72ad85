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

import pytest

from media_hooks.core import crashpoints
from media_hooks.devtools.receiver import Receiver
from media_hooks_tests.conftest import REPO
from media_hooks_tests.crashes import assert_interruption_is_on_record, wait_until_swept_work_is_due
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


@pytest.mark.parametrize("point", crashpoints.POINTS)
def test_a_process_killed_at_each_point_loses_and_duplicates_nothing(conn, database_url, point):
    with Receiver() as receiver:
        add_destination(conn, "cdn", url=receiver.url, max_in_flight=1, timeout_seconds=0.2)
        ids = add_deliveries(conn, "cdn", COUNT)

        crashed = _run(database_url, "run-crashed", crash_at=point)
        assert crashed.returncode == crashpoints.CRASH_EXIT_STATUS, crashed.stderr
        assert f"crash point {point} reached" in crashed.stderr

        wait_until_swept_work_is_due(conn)
        recovered = _run(database_url, "run-recovery")
        assert recovered.returncode == 0, recovered.stderr

        assert states(conn) == {"succeeded": COUNT}
        assert receiver.accepted_ids == set(ids)
        assert {r.webhook_id for r in receiver.requests} <= set(ids)
        assert all(r.idempotency_key == r.webhook_id for r in receiver.requests)
        assert receiver.effects == COUNT
        assert_interruption_is_on_record(conn, point)
