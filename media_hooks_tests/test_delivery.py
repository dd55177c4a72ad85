"""The delivery worker against real PostgreSQL and a real receiver on 127.0.0.1."""

from __future__ import annotations

import base64
from datetime import UTC, datetime

import pytest

from media_hooks.cohort import Cohort
from media_hooks.delivery_run import deliver_due
from media_hooks.receiver import Receiver, Reply, by_attempt
from media_hooks.requeue import requeue
from media_hooks_tests.factories import add_deliveries, add_destination, delivery, states

SECRET = "whsec_" + base64.b64encode(b"delivery-test-secret-0123456789").decode()


def _attempts(conn, delivery_id: str) -> list[dict]:
    return conn.execute(
        "SELECT * FROM delivery_attempt WHERE delivery_id = %s ORDER BY attempt_no", (delivery_id,)
    ).fetchall()


def _make_due(conn) -> None:
    conn.execute("UPDATE webhook_delivery SET next_attempt_at = now() WHERE state = 'pending'")
    conn.execute("UPDATE webhook_destination SET paused_until = NULL")


def test_a_run_delivers_every_due_delivery_signed_once(conn, pool, settings):
    with Receiver(secrets=[SECRET]) as receiver:
        for name in ("cdn", "rights", "archive"):
            add_destination(
                conn,
                name,
                url=receiver.url,
                secrets=[SECRET],
                rate_per_second=1000,
                burst=100,
                max_in_flight=8,
            )
            add_deliveries(conn, name, 20)

        report = deliver_due(pool, "run-1", settings)

        assert report.claim.claimed == 60
        assert report.totals.succeeded == 60
        assert {k: v.succeeded for k, v in report.by_destination.items()} == {
            "cdn": 20,
            "rights": 20,
            "archive": 20,
        }
        assert states(conn) == {"succeeded": 60}
        assert receiver.effects == 60
        assert all(r.verified for r in receiver.requests)
        assert {r.webhook_id for r in receiver.requests} == {
            r.idempotency_key for r in receiver.requests
        }
        body = bytes(delivery(conn, "d-cdn-1")["body"])
        assert next(r.body for r in receiver.requests if r.webhook_id == "d-cdn-1") == body
        published = conn.execute(
            "SELECT count(*) AS n FROM dispatch_outbox WHERE published_at IS NULL"
        ).fetchone()
        assert published["n"] == 0
        attempt = _attempts(conn, "d-cdn-1")[0]
        assert (attempt["run_id"], attempt["outcome"], attempt["http_status"]) == (
            "run-1",
            "success",
            200,
        )


def test_a_failed_delivery_is_dispatched_again_and_delivered_with_the_same_id(conn, pool, settings):
    """The record's gap: after one failure a new dispatch (outbox row) delivers it."""
    with Receiver(script=by_attempt(Reply(status=500))) as receiver:
        add_destination(conn, "cdn", url=receiver.url)
        add_deliveries(conn, "cdn", 1)

        first = deliver_due(pool, "run-1", settings)
        assert (first.totals.retried, first.totals.succeeded) == (1, 0)
        row = delivery(conn, "d-cdn-1")
        assert row["state"] == "pending" and row["wait_reason"].startswith("backoff")
        _make_due(conn)

        second = deliver_due(pool, "run-2", settings)
        assert second.totals.succeeded == 1
        assert [r.webhook_id for r in receiver.requests] == ["d-cdn-1", "d-cdn-1"]
        outbox = conn.execute(
            "SELECT message_id, run_id FROM dispatch_outbox ORDER BY dispatch_no"
        ).fetchall()
        assert [(r["message_id"], r["run_id"]) for r in outbox] == [
            ("d-cdn-1:1", "run-1"),
            ("d-cdn-1:2", "run-2"),
        ]
        assert [a["outcome"] for a in _attempts(conn, "d-cdn-1")] == ["retryable", "success"]


def test_429_with_retry_after_pauses_the_destination_and_schedules_the_delivery(
    conn, pool, settings
):
    with Receiver(script=by_attempt(Reply(status=429, headers={"Retry-After": "120"}))) as receiver:
        add_destination(conn, "cdn", url=receiver.url, max_in_flight=1)
        add_deliveries(conn, "cdn", 3)
        before = datetime.now(UTC)

        report = deliver_due(pool, "run-1", settings)

        assert report.totals.rate_limited == 1
        assert report.totals.deferred == 2  # the pause outlasts what a run waits: handed back
        assert receiver.request_count == 1
        destination = conn.execute(
            "SELECT paused_until, paused_reason FROM webhook_destination"
        ).fetchone()
        assert (destination["paused_until"] - before).total_seconds() == pytest.approx(120, abs=5)
        for row in conn.execute("SELECT * FROM webhook_delivery").fetchall():
            assert row["state"] == "pending"
            assert row["budget_used"] == 0  # rate limits do not spend the retry budget
            assert (row["next_attempt_at"] - before).total_seconds() == pytest.approx(120, abs=5)


def test_connection_dropped_after_the_receiver_committed_is_ambiguous_and_retried_with_the_same_key(
    conn, pool, settings
):
    with Receiver(script=by_attempt(Reply(drop=True))) as receiver:
        add_destination(conn, "cdn", url=receiver.url)
        add_deliveries(conn, "cdn", 1)
        first = deliver_due(pool, "run-1", settings)
        assert first.totals.ambiguous == 1
        assert delivery(conn, "d-cdn-1")["last_outcome"] == "ambiguous"
        _make_due(conn)
        assert deliver_due(pool, "run-2", settings).totals.succeeded == 1
        assert [r.webhook_id for r in receiver.requests] == ["d-cdn-1", "d-cdn-1"]
        assert receiver.effects == 1  # one logical effect at a deduplicating receiver


def test_a_receiver_slower_than_the_timeout_is_ambiguous_and_retried(conn, pool, settings):
    with Receiver(script=by_attempt(Reply(delay_seconds=2.0))) as receiver:
        add_destination(conn, "cdn", url=receiver.url, timeout_seconds=0.3)
        add_deliveries(conn, "cdn", 1)
        assert deliver_due(pool, "run-1", settings).totals.ambiguous == 1
        attempt = _attempts(conn, "d-cdn-1")[0]
        assert attempt["outcome"] == "ambiguous" and "timeout" in attempt["error"].lower()
        _make_due(conn)
        assert deliver_due(pool, "run-2", settings).totals.succeeded == 1


def test_410_kills_the_delivery_and_disables_the_destination_keeping_the_rest_pending(
    conn, pool, settings
):
    with Receiver(reply=Reply(status=410)) as receiver:
        add_destination(conn, "cdn", url=receiver.url, max_in_flight=1)
        add_deliveries(conn, "cdn", 3)
        report = deliver_due(pool, "run-1", settings)
        assert (report.totals.dead, report.totals.deferred) == (1, 2)
        assert receiver.request_count == 1
        dest = conn.execute("SELECT enabled, disabled_reason FROM webhook_destination").fetchone()
        assert dest["enabled"] is False and "410" in dest["disabled_reason"]
        assert states(conn) == {"dead": 1, "pending": 2}


def test_a_requeued_dead_letter_is_delivered_with_the_same_id(conn, pool, settings):
    with Receiver(script=by_attempt(Reply(status=400))) as receiver:
        add_destination(conn, "cdn", url=receiver.url)
        add_deliveries(conn, "cdn", 1)
        assert deliver_due(pool, "run-1", settings).totals.dead == 1
        # Dead is terminal: a new run claims nothing.
        assert deliver_due(pool, "run-2", settings).claim.claimed == 0
        requeue(conn, Cohort(), reason="receiver fixed", requested_by="test")
        assert deliver_due(pool, "run-3", settings).totals.succeeded == 1
        assert [r.webhook_id for r in receiver.requests] == ["d-cdn-1", "d-cdn-1"]
        assert [r.status for r in receiver.requests] == [400, 200]


def test_in_flight_never_exceeds_the_destination_ceiling(conn, pool, settings):
    with Receiver(reply=Reply(delay_seconds=0.05)) as receiver:
        add_destination(
            conn, "cdn", url=receiver.url, max_in_flight=3, rate_per_second=1000, burst=50
        )
        add_deliveries(conn, "cdn", 30)
        assert deliver_due(pool, "run-1", settings).totals.succeeded == 30
        assert receiver.max_in_flight == 3
