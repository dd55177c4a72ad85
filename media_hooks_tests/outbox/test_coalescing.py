"""Latest wins (issue 14, part 3): on a destination with ``--coalesce asset`` an asset's older
unsent deliveries of one event type close as superseded when a newer one exists: dead with the
recorded reason 'superseded' and the newer one's id, visible and counted, never silent."""

from __future__ import annotations

import json
import time

from media_hooks.devtools.receiver import Receiver
from media_hooks.engine.delivery_run import deliver_due
from media_hooks.observe import checks, figures
from media_hooks.observe.inspection import inspect_delivery
from media_hooks.outbox.claims import claim_destination_page
from media_hooks.outbox.cohort import Cohort
from media_hooks.outbox.destinations import DestinationSpec, upsert_destination
from media_hooks.outbox.emit import Event, emit
from media_hooks.outbox.leases import (
    Classified,
    lease_with_permits,
    record_classified,
)
from media_hooks.outbox.maintenance import sweeps
from media_hooks.outbox.maintenance.requeue import requeue
from media_hooks_tests.factories import add_destination, claim_all, states
from media_hooks_tests.interleaving import open_session


def _emit(conn, revision: int, event_type: str = "rights.updated", asset: str = "a1") -> str:
    event = Event("latest", asset, event_type, {"revision": revision})
    return emit(conn, event).delivery_id


def _row(conn, delivery_id: str) -> dict:
    return conn.execute(
        "SELECT state, closed_reason, closed_by FROM webhook_delivery_all WHERE delivery_id = %s",
        (delivery_id,),
    ).fetchone()


def test_older_unsent_revisions_close_as_superseded_by_the_newest(conn):
    add_destination(conn, "latest", coalescing="asset")
    r1, r2, r3 = (_emit(conn, n) for n in (1, 2, 3))
    other_type = _emit(conn, 1, "transcode.completed")
    other_asset = _emit(conn, 1, asset="a2")

    assert inspect_delivery(conn, r1).verdict.kind == "superseded", "said before it closes"
    assert sweeps.sweep_superseded(conn) == 2
    assert _row(conn, r1) == {"state": "dead", "closed_reason": "superseded", "closed_by": r3}
    assert _row(conn, r2)["closed_by"] == r3
    verdict = inspect_delivery(conn, r1).verdict
    assert verdict.kind == "superseded" and f"superseded by {r3}" in verdict.text

    measured = figures.measure(conn)
    assert measured.counts["latest"] == {"pending": 3, "superseded": 2}
    assert measured.dead_letters == 0, "superseded is not a dead letter"
    claim_all(conn, "run-1", Cohort())
    claimed = {r["delivery_id"] for r in conn.execute("SELECT delivery_id FROM dispatch_outbox")}
    assert claimed == {r3, other_type, other_asset}
    assert requeue(conn, Cohort(), states=("dead",), reason="x", requested_by="op").matched == 0


def test_a_newer_revision_waits_while_an_older_one_is_in_flight_then_supersedes_it(conn):
    """The older one may fail and come back: it must then close, not be retried after the
    newer one is sent."""
    add_destination(conn, "latest", coalescing="asset")
    r1 = _emit(conn, 1)
    claim_all(conn, "run-1", Cohort())  # revision 1 in flight (enqueued)
    r2 = _emit(conn, 2)
    claim_all(conn, "run-2", Cohort())
    assert _row(conn, r2)["state"] == "pending", "held while revision 1 is in flight"
    assert "held behind" in inspect_delivery(conn, r2).verdict.text

    conn.execute("UPDATE webhook_delivery_all SET state = 'pending' WHERE delivery_id = %s", (r1,))
    assert sweeps.sweep_superseded(conn) == 1
    assert _row(conn, r1)["closed_by"] == r2
    claim_all(conn, "run-3", Cohort())
    assert _row(conn, r2)["state"] == "enqueued"


def test_an_outage_backlog_collapses_to_the_newest_revision_at_the_receiver(conn, pool, settings):
    with Receiver() as receiver:
        add_destination(conn, "latest", url=receiver.url, coalescing="asset", ordering="asset")
        conn.execute("UPDATE webhook_destination SET enabled = false")
        for revision in range(1, 6):
            _emit(conn, revision)
        conn.execute("UPDATE webhook_destination SET enabled = true")
        report = deliver_due(pool, "run-after-outage", settings)
        assert report.sweeps.superseded == 4
        assert states(conn) == {"succeeded": 1, "dead": 4}
        revisions = [json.loads(r.body)["data"]["revision"] for r in receiver.requests]
    assert revisions == [5]


def test_the_check_counts_closed_deliveries_as_the_dead_rows_they_are(conn):
    add_destination(conn, "latest", coalescing="asset")
    for revision in (1, 2):
        _emit(conn, revision)
    sweeps.sweep_superseded(conn)
    report = checks.run(conn)
    assert report.holds, report.failed()
    counts = next(r for r in report.results if r.name == checks.COUNTS.name)
    assert counts.holds, counts.examples


def test_an_older_delivery_is_closed_when_a_newer_one_succeeds(conn, database_url):
    """Found by the model-based test (docs/protocol-model.md), shrunk: a worker claims a page of
    the coalescing destination (only the newer revision: the older one is held by it), leases
    it with permits, records its success and commits; a second worker then claimed the older
    revision and sent it after the newer one (migration 0020 closes it at the success)."""
    add_destination(conn, "latest", coalescing="asset")
    r1, r2 = _emit(conn, 1), _emit(conn, 2)
    with open_session(database_url) as worker:
        page = claim_destination_page(worker, "run-1", "latest", Cohort(), 3)
        assert [m.delivery_id for m in page] == [r2]
        step = lease_with_permits(
            worker, "run-1", "latest", page, holder="run-1", lease_seconds=30, release_slots=[]
        )
        success = Classified(step.leases[0], "success", 200, None, None, None, time.monotonic())
        assert record_classified(worker, [success]).states == {r2: "succeeded"}
        worker.commit()
    assert _row(conn, r1) == {"state": "dead", "closed_reason": "superseded", "closed_by": r2}
    assert claim_all(conn, "run-2", Cohort()).claimed == 0, "the older revision is not sent"
    assert checks.run(conn, checks.Options(full=True)).holds


def test_turning_coalescing_on_closes_what_a_newer_success_superseded(conn, database_url, settings):
    """Found by the model-based test, shrunk: on a destination that does not coalesce, revision
    2 succeeds while revision 1 waits for a retry; coalescing turned on must close revision 1
    (superseded by 2), not send it after 2."""
    add_destination(conn, "latest")
    r1, r2 = _emit(conn, 1), _emit(conn, 2)
    with open_session(database_url, autocommit=True) as worker:
        page = claim_destination_page(worker, "run-1", "latest", Cohort(), 3)
        step = lease_with_permits(
            worker, "run-1", "latest", page, holder="run-1", lease_seconds=30, release_slots=[]
        )
        first, second = step.leases
        retry = Classified(first, "retryable", 503, None, "HTTP 503", None, time.monotonic())
        success = Classified(second, "success", 200, None, None, None, time.monotonic())
        assert record_classified(worker, [retry, success]).states == {
            r1: "pending",
            r2: "succeeded",
        }
    upsert_destination(
        conn, DestinationSpec("latest", "http://127.0.0.1:9/", coalescing="asset"), settings
    )
    assert _row(conn, r1) == {"state": "dead", "closed_reason": "superseded", "closed_by": r2}
    assert checks.run(conn, checks.Options(full=True)).holds
