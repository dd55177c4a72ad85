"""`media-hooks check` (media_hooks.observe.checks): a clean history holds; each invariant, broken by
hand as an operator's UPDATE would break it, is reported with the id of the row that breaks it.
"""

from __future__ import annotations

import time

import psycopg
import pytest

from bench.sustained_history import preload
from media_hooks.observe import checks
from media_hooks.outbox import leases, rate_limits
from media_hooks.outbox.cohort import Cohort
from media_hooks.outbox.leases import Classified
from media_hooks.store.sqlfiles import query
from media_hooks_tests.factories import (
    ROOMY,
    add_deliveries,
    add_destination,
    claim_all,
    claim_messages,
    lease_all,
)
from media_hooks_tests.plans import analyzed, rows_read


def _finish(conn: psycopg.Connection, taken, outcome: str, status: int) -> None:
    now = time.monotonic()
    leases.record_classified(
        conn, [Classified(le, outcome, status, None, None, None, now) for le in taken]
    )


def _send(conn: psycopg.Connection, run_id: str) -> dict:
    """Claim everything due into ``run_id`` and lease all of it: {delivery_id: lease}."""
    messages = claim_messages(conn, run_id)
    return {le.delivery_id: le for le in lease_all(conn, run_id, messages)}


@pytest.fixture
def history(conn) -> psycopg.Connection:
    """Every state, made by the engine: d-pub-1, 2 succeeded; 3 succeeded on its second attempt
    after a retryable one; 4 rejected (dead); 5-7 leased; 8-10 enqueued; a tombstone; permits
    held (the leases' and one more)."""
    add_destination(conn, "pub", **ROOMY)
    add_deliveries(conn, "pub", 7)
    leased = _send(conn, "run-1")
    _finish(conn, [leased["d-pub-1"], leased["d-pub-2"]], "success", 200)
    _finish(conn, [leased["d-pub-3"]], "retryable", 500)
    _finish(conn, [leased["d-pub-4"]], "rejected", 422)
    conn.execute("UPDATE webhook_delivery_all SET next_attempt_at = now() WHERE state = 'pending'")
    again = _send(conn, "run-2")
    _finish(conn, [again["d-pub-3"]], "success", 200)
    add_deliveries(conn, "pub", 3, prefix="e")
    claim_all(conn, "run-3", Cohort())
    conn.execute(
        "INSERT INTO delivery_identity (delivery_id, destination_id, created_at, final_state)"
        " VALUES ('old-1', 'pub', now() - interval '40 days', 'succeeded')"
    )
    rate_limits.acquire(conn, "pub", 1, "holder-1", 90)
    return conn


def _run(conn, **options) -> checks.Report:
    return checks.run(conn, checks.Options(**options))


def _broken(report: checks.Report) -> dict[str, tuple[str, ...]]:
    return {r.name: r.examples for r in report.failed()}


def test_states_are_as_built(history):
    rows = history.execute(
        "SELECT state, array_agg(delivery_id ORDER BY delivery_id) AS ids"
        " FROM webhook_delivery_all GROUP BY state"
    ).fetchall()
    by_state = {r["state"]: r["ids"] for r in rows}
    assert by_state == {
        "succeeded": ["d-pub-1", "d-pub-2", "d-pub-3"],
        "dead": ["d-pub-4"],
        "leased": ["d-pub-5", "d-pub-6", "d-pub-7"],
        "enqueued": ["e-pub-1", "e-pub-2", "e-pub-3"],
    }


@pytest.mark.parametrize("full", [False, True])
def test_a_clean_history_holds(history, full):
    report = _run(history, full=full)
    assert _broken(report) == {}
    assert [r.name for r in report.results] == [c.name for c in checks.CHECKS] + [
        checks.COUNTS.name
    ]
    assert (report.since is None) == full


BREAKS = {
    # A timer deleted by hand: no claim or sweep would find its delivery again.
    "open_without_its_timer": (
        "DELETE FROM delivery_timer WHERE delivery_id = 'e-pub-2'",
        "e-pub-2",
    ),
    # An open attempt written by hand beside a lease (whose attempt in flight is the lease
    # itself): the delivery no longer has exactly one.
    "leased_without_one_open_attempt": (
        "INSERT INTO delivery_attempt_v1 (delivery_id, attempt_no, destination_id, lease_token)"
        " VALUES ('d-pub-5', 9, 'pub', gen_random_uuid())",
        "d-pub-5",
    ),
    # An open attempt of a delivery that is not leased (the previous layout's, left open).
    "open_attempt_without_lease": (
        "INSERT INTO delivery_attempt_v1 (delivery_id, attempt_no, destination_id, lease_token)"
        " VALUES ('d-pub-1', 1, 'pub', gen_random_uuid())",
        "d-pub-1#1",
    ),
    # A lease that ended an hour ago and no sweep ended it.
    "open_attempt_past_lease": (
        "UPDATE webhook_delivery_all SET lease_until = now() - interval '1 hour'"
        " WHERE delivery_id = 'd-pub-7'",
        "d-pub-7#1",
    ),
    "two_successes": (
        "UPDATE delivery_attempt_v2 SET outcome = 'success'"
        " WHERE delivery_id = 'd-pub-3' AND attempt_no = 1",
        "d-pub-3",
    ),
    # The first attempt "never happened": the second send has no recorded reason.
    "send_without_reason": (
        "UPDATE delivery_attempt_v2 SET outcome = 'rejected'"
        " WHERE delivery_id = 'd-pub-3' AND attempt_no = 1",
        "d-pub-3#2",
    ),
    # Marked dead by hand after it succeeded.
    "success_matches_state": (
        "UPDATE webhook_delivery_all SET state = 'dead' WHERE delivery_id = 'd-pub-1'",
        "d-pub-1",
    ),
    "tombstone_beside_live": (
        "UPDATE delivery_identity SET final_state = 'succeeded', destination_id = 'pub',"
        " created_at = now() WHERE delivery_id = 'd-pub-2'",
        "d-pub-2",
    ),
    "delivery_without_identity": (
        "DELETE FROM delivery_identity WHERE delivery_id = 'd-pub-2'",
        "d-pub-2",
    ),
    # An outbox "cleanup" that deleted a message still waited for.
    "enqueued_without_outbox": (
        "DELETE FROM dispatch_outbox WHERE message_id = 'e-pub-2:1'",
        "e-pub-2",
    ),
    # A delivery deleted by hand with its outbox rows and not its attempt (the purge deletes
    # them together; no foreign key refuses it since migration 0031).
    "attempt_without_delivery": (
        "DELETE FROM dispatch_outbox WHERE delivery_id = 'd-pub-1';"
        " DELETE FROM webhook_delivery_all WHERE delivery_id = 'd-pub-1'",
        "d-pub-1#1",
    ),
    "permits_past_hold": (
        "UPDATE destination_limiter SET slot_until[1] = now() + interval '1 day'",
        "pub#1",
    ),
    # Taken out of its asset's queue by hand after its destination began coalescing.
    "left_out_of_queue": (
        "UPDATE webhook_destination SET coalescing = 'asset' WHERE destination_id = 'pub';"
        " UPDATE webhook_delivery_all SET queued = false WHERE delivery_id = 'e-pub-1'",
        "e-pub-1",
    ),
}


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_a_broken_invariant_is_reported_with_its_id(history, name):
    statement, example = BREAKS[name]
    history.execute(statement)
    for full in (False, True):
        report = _run(history, full=full)
        result = next(r for r in report.results if r.name == name)
        assert (result.violations, result.examples) == (1, (example,)), (full, result)
        assert not report.holds


def test_send_after_a_rejection_is_reasoned_by_a_requeue(history):
    history.execute(BREAKS["send_without_reason"][0])
    assert "send_without_reason" in _broken(_run(history))
    history.execute(
        """
        WITH r AS (INSERT INTO delivery_requeue (requested_by, reason, cohort, moved)
                   VALUES ('ops', 'fixed the publisher', '{}', 1) RETURNING requeue_id)
        INSERT INTO delivery_requeue_item (requeue_id, delivery_id, previous_state)
        SELECT requeue_id, 'd-pub-3', 'dead' FROM r
        """
    )
    assert "send_without_reason" not in _broken(_run(history))


def test_a_succeeded_delivery_without_its_success_attempt(history):
    history.execute(
        "UPDATE webhook_delivery_all SET state = 'succeeded' WHERE delivery_id = 'e-pub-3'"
    )
    assert _broken(_run(history))["success_matches_state"] == ("e-pub-3",)


def test_the_window_bounds_the_history_and_all_reads_it_whole(history):
    """A pending delivery lost its identity long ago: only --all reads that far."""
    history.execute(
        "UPDATE webhook_delivery_all SET state = 'pending' WHERE delivery_id = 'e-pub-1'"
    )
    history.execute("DELETE FROM delivery_identity WHERE delivery_id = 'e-pub-1'")
    history.execute("DELETE FROM dispatch_outbox WHERE message_id = 'e-pub-1:1'")
    assert "delivery_without_identity" not in _broken(_run(history))
    assert _broken(_run(history, full=True))["delivery_without_identity"] == ("e-pub-1",)
    # An old double success falls outside a short window.
    history.execute(BREAKS["two_successes"][0])
    history.execute(
        "UPDATE delivery_attempt_v2 SET started_at = now() - interval '2 days',"
        " finished_at = now() - interval '2 days' WHERE delivery_id = 'd-pub-3'"
    )
    assert "two_successes" not in _broken(_run(history))
    assert _broken(_run(history, full=True))["two_successes"] == ("d-pub-3",)


def test_open_attempts_are_read_by_start_and_leases_whatever_their_age(history):
    """No index names finished_at (migration 0023): an open attempt without a lease is found
    among the attempts started in the window (an older one by --all), and a leased delivery's
    attempt, open past its lease, whatever its start (this layout's attempt in flight is its
    lease: it started when the lease did)."""
    history.execute(BREAKS["open_attempt_without_lease"][0])
    history.execute(BREAKS["open_attempt_past_lease"][0])
    history.execute(
        "UPDATE delivery_attempt_v1 SET started_at = now() - interval '2 days'"
        " WHERE delivery_id = 'd-pub-1'"
    )
    history.execute(
        "UPDATE delivery_state SET lease_started_at = now() - interval '2 days'"
        " WHERE delivery_id = 'd-pub-7'"
    )
    window = _broken(_run(history))
    assert "open_attempt_without_lease" not in window
    assert window["open_attempt_past_lease"] == ("d-pub-7#1",)
    everything = _broken(_run(history, full=True))
    assert everything["open_attempt_without_lease"] == ("d-pub-1#1",)
    assert everything["open_attempt_past_lease"] == ("d-pub-7#1",)


def test_a_lease_within_its_margin_holds(history):
    history.execute(
        "UPDATE webhook_delivery_all SET lease_until = now() - interval '1 minute'"
        " WHERE delivery_id = 'd-pub-7'"
    )
    assert "open_attempt_past_lease" not in _broken(_run(history))
    assert _broken(_run(history, lease_margin_seconds=30))["open_attempt_past_lease"] == (
        "d-pub-7#1",
    )


def test_counts_through_a_corrupt_index_differ_from_status(history):
    """An index that stopped being maintained (simulated: marked not ready for inserts) hides a
    dead letter from `status`'s count through it (delivery_history_dead, whose partitions' own
    indexes `status` reads), and the rows' count disagrees."""
    partitions = (
        "SELECT inhrelid FROM pg_inherits WHERE inhparent = 'delivery_history_dead'::regclass"
    )
    history.execute(f"UPDATE pg_index SET indisready = false WHERE indexrelid IN ({partitions})")
    # Dead in no queue: written to history.
    history.execute(
        "UPDATE webhook_delivery_all SET state = 'dead', queued = false"
        " WHERE delivery_id = 'e-pub-3'"
    )
    history.execute(f"UPDATE pg_index SET indisready = true WHERE indexrelid IN ({partitions})")
    assert _broken(_run(history))["counts_by_state"] == ("dead: status 1, rows 2",)


def test_the_check_reads_one_snapshot_and_writes_nothing(history):
    report = _run(history)
    assert not history.info.transaction_status  # IDLE: the transaction ended
    assert history.isolation_level is None and history.read_only is None
    assert report.checked_at is not None


def test_a_delivery_dispatched_past_an_earlier_one_of_its_asset(history):
    """On a destination that orders by asset, an earlier delivery of the asset (here written by
    hand, backdated) that is not terminal makes the dispatched one out of order."""
    history.execute("UPDATE webhook_destination SET ordering = 'asset'")
    assert "sent_out_of_order" not in _broken(_run(history))
    add_deliveries(history, "pub", 1, prefix="backdated", asset_id="asset-2", age_seconds=3600)
    assert _broken(_run(history))["sent_out_of_order"] == ("e-pub-2",)


def _identities_read(conn: psycopg.Connection, since: str) -> int:
    with conn.transaction(force_rollback=True):
        conn.execute(query("check_through_indexes"))
        plan = analyzed(conn, "check_tombstone_beside_live", {"since": since})
    return rows_read(plan, "delivery_identity")


def test_the_default_pass_looks_up_its_live_deliveries_not_a_year_of_tombstones(conn, database_url):
    """Tombstones outlive their deliveries by the duplicate window (400 days by default): the
    default pass starts from the live deliveries of its window and looks their ids up, so a
    tombstone beside a pending delivery is found without reading the others; --all reads
    every tombstone."""
    add_destination(conn, "cdn", url="http://127.0.0.1:9/")
    preload(database_url, 3_000, ["cdn"], span_seconds=3_600)
    # Retention forgot them, their ranges dropped whole: 3,000 identities whose delivery no
    # table holds.
    conn.execute(
        "TRUNCATE delivery_body, delivery_history, dispatch_outbox_v3, delivery_attempt_v2"
    )
    assert conn.execute("SELECT count(*) AS n FROM delivery_identity").fetchone()["n"] == 3_000
    # Beside them, delivered history older than the window, and a live backlog.
    add_deliveries(conn, "cdn", 3_000, state="succeeded", age_seconds=2 * 86_400)
    add_deliveries(conn, "cdn", 5)
    conn.execute(
        "UPDATE delivery_identity SET final_state = 'succeeded', destination_id = 'cdn',"
        " created_at = now() WHERE delivery_id = 'd-cdn-1'"
    )
    conn.execute("VACUUM ANALYZE")

    assert _broken(_run(conn))["tombstone_beside_live"] == ("d-cdn-1",)
    assert _broken(_run(conn, full=True))["tombstone_beside_live"] == ("d-cdn-1",)
    # Seen: 1 identity read (a join of every tombstone with every delivery read all 3,001).
    day_ago = conn.execute("SELECT now() - interval '1 day' AS t").fetchone()["t"].isoformat()
    assert _identities_read(conn, day_ago) < 50
