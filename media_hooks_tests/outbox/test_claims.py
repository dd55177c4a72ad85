"""The reconciler's claim as a delivery run makes it (each due destination's pages,
``claim_destination_page``): pages into the outbox, cohorts, and runs claiming at once."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta

from media_hooks.outbox.claims import claim_destination_page, due_destinations
from media_hooks.outbox.cohort import Cohort
from media_hooks_tests.conftest import REPO
from media_hooks_tests.factories import add_deliveries, add_destination, claim_all, delivery, states


def test_claims_due_rows_in_pages_with_one_outbox_row_per_dispatch(conn):
    add_destination(conn, "cdn")
    ids = add_deliveries(conn, "cdn", 25)
    add_deliveries(conn, "cdn", 5, prefix="later", due_seconds_ago=-3600)

    figures = claim_all(conn, "run-1", Cohort(), page_size=10)

    assert (figures.claimed, figures.pages) == (25, 3)
    assert figures.by_destination == {"cdn": 25}
    assert states(conn) == {"enqueued": 25, "pending": 5}
    outbox = conn.execute(
        "SELECT message_id, delivery_id, run_id, body, created_at, published_at"
        " FROM dispatch_outbox"
    ).fetchall()
    assert len(outbox) == 25
    assert {row["message_id"] for row in outbox} == {f"{i}:1" for i in ids}
    assert {row["run_id"] for row in outbox} == {"run-1"}
    # Published as written, in the claim's transaction (a relay's update would be a later one):
    # the worker that claims a page is the one that sends it.
    assert all(row["published_at"] == row["created_at"] for row in outbox)
    first = delivery(conn, ids[0])
    assert bytes(next(r for r in outbox if r["delivery_id"] == ids[0])["body"]) == bytes(
        first["body"]
    )
    assert first["current_message_id"] == f"{ids[0]}:1"


def test_max_rows_caps_a_run(conn):
    add_destination(conn, "cdn")
    add_deliveries(conn, "cdn", 30)
    figures = claim_all(conn, "run-1", Cohort(), page_size=8, max_rows=20)
    assert figures.claimed == 20
    assert states(conn) == {"enqueued": 20, "pending": 10}


def test_cohort_filters_select_only_matching_rows(conn):
    add_destination(conn, "cdn")
    add_destination(conn, "rights")
    add_deliveries(conn, "cdn", 3, event_type="transcode.completed")
    add_deliveries(conn, "rights", 4, event_type="rights.updated")
    add_deliveries(conn, "rights", 2, prefix="t", event_type="transcode.completed")

    figures = claim_all(
        conn, "run-1", Cohort(destination_ids=("rights",), event_types=("rights.updated",))
    )
    assert figures.by_destination == {"rights": 4}

    assets = claim_all(conn, "run-2", Cohort(asset_ids=("asset-1",)))
    assert assets.claimed == 2  # asset-1 of cdn and of rights' transcode events

    future = datetime.now(UTC) + timedelta(days=1)
    assert claim_all(conn, "run-3", Cohort(created_after=future)).claimed == 0
    assert claim_all(conn, "run-3", Cohort(created_before=future)).claimed == 3


def test_dead_succeeded_disabled_and_paused_are_not_claimed(conn):
    add_destination(conn, "cdn")
    add_destination(conn, "off", enabled=False, disabled_reason="maintenance")
    add_destination(conn, "paused")
    conn.execute(
        "UPDATE webhook_destination SET paused_until = now() + interval '1 hour' WHERE destination_id = 'paused'"
    )
    dead, done = add_deliveries(conn, "cdn", 2)
    conn.execute("UPDATE webhook_delivery_all SET state = 'dead' WHERE delivery_id = %s", (dead,))
    conn.execute(
        "UPDATE webhook_delivery_all SET state = 'succeeded' WHERE delivery_id = %s", (done,)
    )
    add_deliveries(conn, "off", 3)
    add_deliveries(conn, "paused", 3)

    assert due_destinations(conn, Cohort()) == []
    # The statement itself refuses them too (a destination disabled after it was found due).
    for destination_id in ("cdn", "off", "paused"):
        assert claim_destination_page(conn, "run-1", destination_id, Cohort(), 10) == []
    assert states(conn) == {"dead": 1, "succeeded": 1, "pending": 6}


def test_a_retried_delivery_gets_a_new_outbox_row_and_keeps_its_id(conn):
    """The record's gap: the sketch's per-delivery message_id strands a retried delivery."""
    add_destination(conn, "cdn")
    (delivery_id,) = add_deliveries(conn, "cdn", 1)
    claim_all(conn, "run-1", Cohort())
    # The first dispatch failed and was scheduled again (as record_classified_outcomes does).
    conn.execute(
        "UPDATE webhook_delivery_all SET state = 'pending', next_attempt_at = now() WHERE delivery_id = %s",
        (delivery_id,),
    )

    assert claim_all(conn, "run-2", Cohort()).claimed == 1

    outbox = conn.execute(
        "SELECT message_id, run_id, dispatch_no FROM dispatch_outbox WHERE delivery_id = %s ORDER BY dispatch_no",
        (delivery_id,),
    ).fetchall()
    assert [(r["message_id"], r["run_id"]) for r in outbox] == [
        (f"{delivery_id}:1", "run-1"),
        (f"{delivery_id}:2", "run-2"),
    ]
    assert delivery(conn, delivery_id)["state"] == "enqueued"


CLAIMER = """
import sys
import psycopg
from psycopg.rows import dict_row
from media_hooks.outbox.cohort import Cohort
from media_hooks.outbox.claims import claim_destination_page
claimed = 0
with psycopg.connect(sys.argv[1], autocommit=True, row_factory=dict_row) as conn:
    # Until a page comes back empty: a short one may only mean the other run holds the rest.
    while page := claim_destination_page(conn, sys.argv[2], "cdn", Cohort(), 250):
        claimed += len(page)
print(claimed)
"""


def test_two_claiming_processes_divide_10000_rows_without_a_double_dispatch(conn, database_url):
    add_destination(conn, "cdn")
    add_deliveries(conn, "cdn", 10_000)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, database_url, f"run-{n}"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in (1, 2)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    claimed = [int(out) for out, _ in outputs]
    assert sum(claimed) == 10_000
    row = conn.execute(
        "SELECT count(*) AS rows, count(DISTINCT delivery_id) AS deliveries FROM dispatch_outbox"
    ).fetchone()
    assert row == {"rows": 10_000, "deliveries": 10_000}
    assert states(conn) == {"enqueued": 10_000}
