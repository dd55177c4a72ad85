"""The worker's step of this release (media_hooks_lease_with_permits_v4, migration 0015) answers
as the previous release's (v3, migration 0014) did, and leaves the destination's limiter and
deliveries as v3 left them: workers of both releases share one limiter while an upgrade rolls
out, and v4 only writes the limiter row once instead of three times.

Each case brings a destination to a state with committed steps, then runs the next step with
v3 and with v4 from that same state (each in a transaction rolled back afterwards) and
compares everything the step answers and writes. Values read off the clock (when to ask again,
when each start may go, the bucket's level) may differ only by the time between the two
calls.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import psycopg
import pytest

from media_hooks.outbox.claims import claim_due
from media_hooks.outbox.cohort import Cohort
from media_hooks.outbox.leases import Message
from media_hooks_tests.factories import add_deliveries, add_destination

DEST = "cdn"
HOLDER = "run-1"
STEP = """
SELECT * FROM media_hooks_lease_with_permits_{version}(
    %(destination_id)s, %(holder)s, 30, 0.02, 1.0, 0.05, %(release)s, %(holder)s,
    %(delivery_ids)s, %(message_ids)s)
"""
LIMITER = "SELECT level, level_at, slot_until, slot_holder FROM destination_limiter WHERE destination_id = %s"
DELIVERIES = """
SELECT delivery_id, state, attempt_count, budget_used, lease_token IS NOT NULL AS leased
FROM webhook_delivery ORDER BY delivery_id
"""
ATTEMPTS = "SELECT delivery_id, attempt_no, run_id FROM delivery_attempt ORDER BY 1, 2"
# What a step answers that does not depend on the clock.
ANSWERED = ("examined", "reason", "slot", "delivery_id", "attempt_no", "budget_used")


def _dispatched(conn: psycopg.Connection, count: int, **limits) -> list[Message]:
    add_destination(conn, DEST, **limits)
    add_deliveries(conn, DEST, count)
    claim_due(conn, HOLDER, Cohort())
    rows = conn.execute(
        "SELECT message_id, delivery_id FROM dispatch_outbox WHERE run_id = %s "
        "ORDER BY delivery_id",
        (HOLDER,),
    ).fetchall()
    return [Message(r["message_id"], r["delivery_id"]) for r in rows]


def _params(offered: list[Message], release: list[int]) -> dict:
    return {
        "destination_id": DEST,
        "holder": HOLDER,
        "release": release,
        "delivery_ids": [m.delivery_id for m in offered],
        "message_ids": [m.message_id for m in offered],
    }


def _step(conn: psycopg.Connection, offered: list[Message], release: list[int]) -> list[dict]:
    """A committed step of this release's worker; its rows."""
    return conn.execute(STEP.format(version="v4"), _params(offered, release)).fetchall()


def _seconds(later: datetime, earlier: datetime) -> float:
    return (later - earlier).total_seconds()


def _what_it_did(conn: psycopg.Connection, version: str, params: dict) -> dict:
    """One version's step from the committed state, rolled back: its answer and its writes,
    with each moment as seconds from the moment the step answered."""
    with conn.transaction(force_rollback=True):
        rows = conn.execute(STEP.format(version=version), params).fetchall()
        limiter = conn.execute(LIMITER, (DEST,)).fetchone()
        rate = conn.execute(
            "SELECT rate_per_second FROM webhook_destination WHERE destination_id = %s", (DEST,)
        ).fetchone()["rate_per_second"]
        answered = rows[0]["answered_at"]
        return {
            "exact": {
                "answer": [{k: row[k] for k in ANSWERED} for row in rows],
                "holders": limiter["slot_holder"],
                "held": [until is not None for until in limiter["slot_until"] or []],
                "deliveries": conn.execute(DELIVERIES).fetchall(),
                "attempts": conn.execute(ATTEMPTS).fetchall(),
            },
            "clock": {
                "retry_in": rows[0]["retry_in"],
                "starts": [_seconds(row["start_at"], answered) for row in rows if row["start_at"]],
                # The bucket's timeline: when it is empty, as seconds from the answer.
                "empty_at": _seconds(
                    limiter["level_at"] + timedelta(seconds=limiter["level"] / rate), answered
                ),
            },
        }


def assert_same_step(conn: psycopg.Connection, offered: list[Message], release: list[int]):
    params = _params(offered, release)
    began = time.monotonic()
    v3 = _what_it_did(conn, "v3", params)
    v4 = _what_it_did(conn, "v4", params)
    apart = time.monotonic() - began
    assert v4["exact"] == v3["exact"]
    assert len(v4["clock"]["starts"]) == len(v3["clock"]["starts"])
    for name in ("retry_in", "empty_at"):
        assert v4["clock"][name] == pytest.approx(v3["clock"][name], abs=apart + 0.001), name
    for a, b in zip(v4["clock"]["starts"], v3["clock"]["starts"], strict=True):
        assert a == pytest.approx(b, abs=apart + 0.001)
    return v4


def test_a_first_step_bound_by_the_rate(conn):
    offered = _dispatched(conn, 8, rate_per_second=10, burst=3, max_in_flight=8)
    done = assert_same_step(conn, offered, [])
    assert done["exact"]["answer"][0]["reason"] == "rate"


def test_a_step_bound_by_requests_in_flight(conn):
    offered = _dispatched(conn, 6, rate_per_second=1000, burst=100, max_in_flight=2)
    _step(conn, offered[:2], [])
    done = assert_same_step(conn, offered[2:], [])
    assert done["exact"]["answer"][0]["reason"] == "in flight"
    assert done["exact"]["answer"][0]["examined"] == 0


def test_a_step_that_hands_finished_slots_back_first(conn):
    offered = _dispatched(conn, 6, rate_per_second=1000, burst=100, max_in_flight=2)
    first = _step(conn, offered[:2], [])
    done = assert_same_step(conn, offered[2:4], [row["slot"] for row in first])
    assert done["exact"]["answer"][0]["examined"] == 2


def test_a_step_after_a_drained_bucket_starts_ahead(conn):
    offered = _dispatched(conn, 8, rate_per_second=20, burst=2, max_in_flight=8)
    _step(conn, offered[:2], [])
    done = assert_same_step(conn, offered[2:], [])
    assert done["exact"]["answer"][0]["reason"] == "rate"


def test_a_step_granted_everything_it_offered(conn):
    offered = _dispatched(conn, 3, rate_per_second=1000, burst=100, max_in_flight=8)
    done = assert_same_step(conn, offered, [])
    assert [row["reason"] for row in done["exact"]["answer"]] == [None] * 3


def test_a_stale_offer_gives_its_slot_back(conn):
    offered = _dispatched(conn, 3, rate_per_second=1000, burst=100, max_in_flight=8)
    stale = Message("not-the-current-message", offered[1].delivery_id)
    done = assert_same_step(conn, [offered[0], stale, offered[2]], [])
    assert done["exact"]["held"].count(True) == 2


@pytest.mark.parametrize(
    "change",
    [
        "UPDATE webhook_destination SET enabled = false",
        "UPDATE webhook_destination SET paused_until = now() + interval '1 minute', "
        "paused_reason = 'HTTP 429'",
    ],
    ids=["disabled", "paused"],
)
def test_a_refused_step_still_takes_its_releases(conn, change):
    offered = _dispatched(conn, 4, rate_per_second=1000, burst=100, max_in_flight=4)
    first = _step(conn, offered[:2], [])
    conn.execute(change)
    done = assert_same_step(conn, offered[2:], [row["slot"] for row in first])
    assert done["exact"]["held"].count(True) == 0
