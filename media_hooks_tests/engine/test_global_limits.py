"""Per-destination limits hold across processes: two real delivery processes, one receiver."""

from __future__ import annotations

import os
import subprocess
import sys

from media_hooks.devtools.receiver import Receiver, Reply, scripted
from media_hooks.outbox.cohort import Cohort
from media_hooks_tests.conftest import REPO
from media_hooks_tests.envelope import envelope_excess
from media_hooks_tests.factories import add_deliveries, add_destination, claim_all, states

# Each process delivers the run the test claimed for it, so both hold work before either
# sends (a claim made after a pause would rightly leave the paused destination's rows alone):
# the production worker (deliver_pages) over a source that hands it that run's messages.
RUN = """
import sys
from media_hooks.store import db
from media_hooks.core.config import Settings
from media_hooks.engine.delivery import deliver_pages
from media_hooks.outbox.leases import Message

class Claimed:
    destination_id = "cdn"

    def __init__(self, run_id):
        self.run_id, self.done = run_id, False

    def next_page(self, conn):
        if self.done:
            return []
        self.done = True
        rows = conn.execute(
            "SELECT message_id, delivery_id FROM dispatch_outbox WHERE run_id = %s "
            "ORDER BY message_id", (self.run_id,)
        ).fetchall()
        return [Message(row["message_id"], row["delivery_id"]) for row in rows]

    def stop(self):
        self.done = True

with db.open_pool(sys.argv[1]) as pool:
    print(deliver_pages(pool, sys.argv[2], Claimed(sys.argv[2]), Settings.from_env()).as_dict())
"""


def _two_senders(conn, database_url: str, rows_each: int) -> list[subprocess.CompletedProcess]:
    for n in (1, 2):
        assert claim_all(conn, f"run-{n}", Cohort(), max_rows=rows_each).claimed == rows_each
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEDIA_HOOKS_")}
    env["MEDIA_HOOKS_ALLOW_PRIVATE_URLS"] = "1"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RUN, database_url, f"run-{n}"],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in (1, 2)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return results


def test_two_processes_together_respect_start_rate_and_in_flight(conn, database_url):
    rate, burst, ceiling = 20.0, 5, 3
    with Receiver(reply=Reply(delay_seconds=0.03)) as receiver:
        add_destination(
            conn, "cdn", url=receiver.url, rate_per_second=rate, burst=burst, max_in_flight=ceiling
        )
        add_deliveries(conn, "cdn", 50)

        results = _two_senders(conn, database_url, 25)

        assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
        assert states(conn) == {"succeeded": 50}
        starts = sorted(r.arrived_monotonic for r in receiver.requests)
        assert len(starts) == 50
        assert envelope_excess(starts, rate=rate, burst=burst) <= 0
        assert receiver.max_in_flight <= ceiling
        # Both processes really sent: the limit was shared, not taken by one alone.
        runs = conn.execute(
            "SELECT count(DISTINCT run_id) AS n FROM delivery_attempt_all"
        ).fetchone()
        assert runs["n"] == 2


def test_429_with_retry_after_stops_every_process_for_that_long(conn, database_url):
    with Receiver(script=scripted(Reply(status=429, headers={"Retry-After": "2"}))) as receiver:
        add_destination(
            conn, "cdn", url=receiver.url, rate_per_second=1000, burst=100, max_in_flight=1
        )
        add_deliveries(conn, "cdn", 12)

        results = _two_senders(conn, database_url, 6)

        assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
        log = sorted(receiver.requests, key=lambda r: r.arrived_monotonic)
        limited = log[0]
        assert limited.status == 429
        after = [r.arrived_monotonic for r in log[1:]]
        assert after and min(after) >= limited.finished_monotonic + 2.0 - 0.05
        row = conn.execute(
            "SELECT d.next_attempt_at, a.finished_at, d.state, d.budget_used FROM webhook_delivery_all d "
            "JOIN delivery_attempt_all a USING (delivery_id) WHERE a.outcome = 'rate_limited'"
        ).fetchone()
        assert row["state"] == "pending" and row["budget_used"] == 0
        assert 1.9 <= (row["next_attempt_at"] - row["finished_at"]).total_seconds() <= 2.5
        assert states(conn) == {"succeeded": 11, "pending": 1}, [r.stdout for r in results]
