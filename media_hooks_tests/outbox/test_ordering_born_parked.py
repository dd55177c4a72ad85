"""Deliveries born parked (issue 14, migration 0013): on a destination with ``--ordering asset``
a delivery held behind an earlier open one of its asset is recorded parked by every emit path,
nothing rewrites it, and what wakes it is the trigger when its predecessor leaves the queue or,
when the producer's transaction was still open at that moment, the sweep
sweep_wake_parked_heads. The claim's rule (media_hooks_held_by_v2) keeps the order."""

from __future__ import annotations

from datetime import timedelta

import pytest

from media_hooks.devtools.receiver import Receiver
from media_hooks.engine.delivery_run import deliver_due
from media_hooks.observe import figures
from media_hooks.observe.inspection import inspect_delivery
from media_hooks.outbox.cohort import Cohort
from media_hooks.outbox.destinations import DestinationSpec, upsert_destination
from media_hooks.outbox.emit import (
    Event,
    FanOutEvent,
    emit,
    emit_event,
    emit_many,
    event_delivery_id,
)
from media_hooks.outbox.maintenance import sweeps
from media_hooks.outbox.maintenance.requeue import requeue
from media_hooks_tests.factories import add_destination, states
from media_hooks_tests.interleaving import open_session
from media_hooks_tests.queues import claimed, revisions_received, settle


def _revision(destination_id: str, asset_id: str, revision: int) -> Event:
    return Event(destination_id, asset_id, "rights.updated", {"revision": revision})


def _emit(conn, destination_id: str, asset_id: str, revision: int) -> str:
    return emit(conn, _revision(destination_id, asset_id, revision)).delivery_id


def _parked(conn, *delivery_ids: str) -> list[bool]:
    rows = conn.execute(
        "SELECT delivery_id, next_attempt_at >= timestamptz '9999-01-01 00:00:00+00' AS parked "
        "FROM webhook_delivery_all WHERE delivery_id = ANY (%s)",
        (list(delivery_ids),),
    ).fetchall()
    parked = {r["delivery_id"]: r["parked"] for r in rows}
    return [parked[d] for d in delivery_ids]


def test_a_delivery_born_parked_while_its_head_settles_is_woken_by_the_sweep_and_sent_in_order(
    conn, database_url, pool, settings
):
    """Interleaving: the producer's transaction records revisions 2 and 3 parked behind
    revision 1 (open in its snapshot) and stays open; revision 1 succeeds and commits, and the
    trigger, which cannot see the uncommitted rows, wakes nobody; the producer commits. Revision
    2 now heads its queue, parked: the sweep wakes it, and only it."""
    with Receiver() as receiver:
        add_destination(conn, "ordered", url=receiver.url, ordering="asset")
        first = _emit(conn, "ordered", "a1", 1)
        with open_session(database_url) as producer, open_session(database_url) as worker:
            second = _emit(producer, "ordered", "a1", 2)
            third = _emit(producer, "ordered", "a1", 3)  # paused here, uncommitted
            settle(worker, first, "succeeded")
            worker.commit()
            producer.commit()
        assert _parked(conn, second, third) == [True, True], "an orphan: nobody will wake it"
        verdict = inspect_delivery(conn, second).verdict
        assert (verdict.kind, "the next run's sweeps make it due" in verdict.text) == (
            "waiting",
            True,
        )
        assert claimed(conn, "run-before-sweep") == set()

        assert sweeps.run_sweeps(conn, settings).woken_heads == 1
        assert _parked(conn, second, third) == [False, True]
        assert sweeps.sweep_wake_parked_heads(conn) == 0, "revision 3 is held by revision 2"

        for round_no in range(10):
            if states(conn) == {"succeeded": 3}:
                break
            deliver_due(pool, f"run-{round_no}", settings)
        assert states(conn) == {"succeeded": 3}
        assert revisions_received(receiver) == {"a1": [2, 3]}


def test_the_sweep_running_while_a_head_settles_waits_for_nobody_and_loses_no_wakeup(
    conn, database_url
):
    """Interleaving: a worker records revision 1's success and has not committed; its trigger
    has made revision 2 due (uncommitted, row locked). The sweep, meanwhile, sees revision 1
    still open, wakes nothing and returns at once; the worker commits: revision 2 is due."""
    add_destination(conn, "ordered", ordering="asset")
    first, second = (_emit(conn, "ordered", "a1", n) for n in (1, 2))
    with open_session(database_url) as worker:
        settle(worker, first, "succeeded")  # paused here, uncommitted
        with open_session(database_url, autocommit=True) as sweeper:
            sweeper.execute("SET lock_timeout = '5s'")
            assert sweeps.sweep_wake_parked_heads(sweeper) == 0
        assert _parked(conn, second) == [True], "the worker's wake-up is not committed yet"
        worker.commit()
    assert _parked(conn, second) == [False]


def test_two_producers_at_once_the_later_born_due_still_waits_for_the_earlier(conn, database_url):
    """Interleaving: producer A has begun and recorded revision 1 (uncommitted); producer B,
    which began after it, records revision 2 and cannot see revision 1: it is born due. Once A
    commits, revision 1 is earlier (its transaction began first), and the claim's rule, not the
    parking, keeps the order."""
    add_destination(conn, "ordered", ordering="asset")
    with open_session(database_url) as a, open_session(database_url) as b:
        first = _emit(a, "ordered", "a1", 1)  # paused here, uncommitted
        second = _emit(b, "ordered", "a1", 2)
        b.commit()
        assert _parked(conn, second) == [False], "born due: nothing earlier was visible"
        a.commit()
    assert claimed(conn, "run-1") == {first}
    assert claimed(conn, "run-2") == set(), "revision 2 waits while revision 1 is in flight"
    settle(conn, first, "succeeded")
    assert claimed(conn, "run-3") == {second}


def test_several_revisions_in_one_file_only_the_first_of_each_asset_is_due(conn):
    add_destination(conn, "ordered", ordering="asset")
    add_destination(conn, "plain")
    lines = [
        _revision("ordered", "a1", 1),
        _revision("plain", "a1", 1),
        _revision("ordered", "a2", 1),
        _revision("ordered", "a1", 2),
        _revision("plain", "a1", 2),
        _revision("ordered", "a1", 3),
        _revision("ordered", "a2", 2),
    ]
    emit_many(conn, lines)
    rows = conn.execute(
        "SELECT destination_id, asset_id, payload->>'revision' AS revision, "
        "next_attempt_at >= timestamptz '9999-01-01 00:00:00+00' AS parked, wait_reason "
        "FROM webhook_delivery_all ORDER BY emit_seq"
    ).fetchall()
    assert [(r["destination_id"], r["asset_id"], r["revision"], r["parked"]) for r in rows] == [
        ("ordered", "a1", "1", False),
        ("plain", "a1", "1", False),
        ("ordered", "a2", "1", False),
        ("ordered", "a1", "2", True),
        ("plain", "a1", "2", False),
        ("ordered", "a1", "3", True),
        ("ordered", "a2", "2", True),
    ]
    assert {r["wait_reason"] for r in rows if r["parked"]} == {
        "held behind an earlier delivery of its asset (ordered destination)"
    }
    emit_many(conn, [_revision("ordered", "a1", 4), _revision("ordered", "a3", 1)])
    later = conn.execute(
        "SELECT asset_id, next_attempt_at >= timestamptz '9999-01-01 00:00:00+00' AS parked "
        "FROM webhook_delivery_all WHERE payload->>'revision' IN ('4') OR asset_id = 'a3' "
        "ORDER BY asset_id"
    ).fetchall()
    assert [(r["asset_id"], r["parked"]) for r in later] == [("a1", True), ("a3", False)], (
        "held behind revision 1, recorded by an earlier file"
    )


def test_a_file_repeating_a_delivery_already_sent_does_not_hold_the_next(conn):
    """An overlapping file: its first line was recorded (and sent) by an earlier file, so it is
    not recorded again and holds nothing; the new revision behind it is due."""
    add_destination(conn, "ordered", ordering="asset")
    (first,) = [_emit(conn, "ordered", "a1", 1)]
    settle(conn, first, "succeeded")
    counts = emit_many(conn, [_revision("ordered", "a1", 1), _revision("ordered", "a1", 2)])
    assert (counts.inserted, counts.already_present) == (1, 1)
    (second,) = conn.execute(
        "SELECT delivery_id FROM webhook_delivery_all WHERE delivery_id <> %s", (first,)
    ).fetchall()
    assert _parked(conn, second["delivery_id"]) == [False]


def test_a_delivery_emitted_behind_a_dead_head_is_parked_and_stays_held(conn, settings):
    add_destination(conn, "ordered", ordering="asset")
    head = _emit(conn, "ordered", "a1", 1)
    settle(conn, head, "dead")
    second = _emit(conn, "ordered", "a1", 2)
    assert _parked(conn, second) == [True]
    verdict = inspect_delivery(conn, second).verdict
    assert (verdict.kind, f"held behind dead delivery {head}" in verdict.text) == ("held", True)
    assert sweeps.run_sweeps(conn, settings).woken_heads == 0

    requeue(conn, Cohort(), states=("dead",), reason="receiver fixed", requested_by="op")
    assert claimed(conn, "run-1") == {head}, "the requeued head goes first"
    assert _parked(conn, second) == [True]
    settle(conn, head, "succeeded")
    assert _parked(conn, second) == [False]
    assert claimed(conn, "run-2") == {second}


@pytest.mark.parametrize("in_flight", ["enqueued", "leased"])
def test_a_delivery_emitted_behind_an_in_flight_head_is_parked_until_it_succeeds(
    conn, settings, in_flight
):
    add_destination(conn, "ordered", ordering="asset")
    head = _emit(conn, "ordered", "a1", 1)
    assert claimed(conn, "run-1") == {head}
    if in_flight == "leased":
        (leased,) = conn.execute(
            "SELECT * FROM media_hooks_lease_v2('run-1', ARRAY[%s], ARRAY[%s || ':1'], 90)",
            (head, head),
        ).fetchall()
        assert leased["delivery_id"] == head
    second = _emit(conn, "ordered", "a1", 2)
    assert _parked(conn, second) == [True]
    assert sweeps.run_sweeps(conn, settings).woken_heads == 0
    assert claimed(conn, "run-2") == set()
    conn.execute(
        "UPDATE webhook_delivery_all SET state = 'succeeded', lease_token = NULL, lease_until = NULL "
        "WHERE delivery_id = %s",
        (head,),
    )
    assert claimed(conn, "run-3") == {second}


def test_fan_out_events_to_an_ordered_destination_are_born_parked_there_only(conn, settings):
    for destination_id, ordering in (("ordered", "asset"), ("plain", "none")):
        spec = DestinationSpec(
            destination_id, "http://127.0.0.1:9/", event_types=("rights.*",), ordering=ordering
        )
        upsert_destination(conn, spec, settings)

    def event(n: int, asset: str) -> FanOutEvent:
        return FanOutEvent(f"ev-{n}", asset, "rights.updated", {"revision": n})

    emit_event(conn, event(1, "a1"))
    emit_event(conn, event(2, "a1"))
    emit_event(conn, event(3, "a2"))
    emit_many(conn, [event(4, "a1"), event(5, "a3"), event(6, "a3")])

    def parked(destination_id: str) -> list[bool]:
        ids = [event_delivery_id(f"ev-{n}", destination_id) for n in range(1, 7)]
        return _parked(conn, *ids)

    assert parked("ordered") == [False, True, False, True, False, True]
    assert parked("plain") == [False] * 6
    assert claimed(conn, "run-1") == {
        event_delivery_id(f"ev-{n}", "ordered") for n in (1, 3, 5)
    } | {event_delivery_id(f"ev-{n}", "plain") for n in range(1, 7)}


def test_the_claim_rule_holds_the_rows_it_should(conn):
    """media_hooks_held_by_v2 (what the claim inlines), on a queue with rows recorded before
    0011 (no emit_seq), rows of one transaction (equal created_at), and every state: the rows
    it lets go under each rule are those the rule it replaced (0011's may_claim_v1, dropped
    by 0016) let go."""
    add_destination(conn, "d", ordering="asset", coalescing="asset")
    base = "2026-01-01 00:00:00+00"
    rows = [  # (id, asset, seconds after base, emit_seq, state, event type)
        ("old-b", "a", 0, None, "pending", "t1"),
        ("old-a", "a", 0, None, "dead", "t1"),
        ("x-1", "a", 0, 5, "pending", "t2"),
        ("x-2", "a", 0, 6, "enqueued", "t1"),
        ("x-3", "a", 1, 2, "succeeded", "t1"),
        ("x-4", "a", 1, 3, "pending", "t2"),
        ("x-5", "a", 2, None, "pending", "t1"),
        ("x-6", "a", 2, 1, "pending", "t1"),
        ("y-1", "b", 0, 7, "pending", "t1"),
    ]
    for delivery_id, asset_id, seconds, emit_seq, state, event_type in rows:
        conn.execute(
            "INSERT INTO webhook_delivery_all (delivery_id, destination_id, asset_id, event_type, "
            "payload, body, state, created_at, emit_seq) VALUES (%s, 'd', %s, %s, '{}', '', "
            "%s, %s::timestamptz + %s, %s)",
            (delivery_id, asset_id, event_type, state, base, timedelta(seconds=seconds), emit_seq),
        )
    free = {
        ("asset", "none"): ["old-a", "y-1"],
        ("none", "asset"): ["x-4", "y-1"],
        ("asset", "asset"): ["y-1"],
    }
    for (ordering, coalescing), expected in free.items():
        rows = conn.execute(
            """
            SELECT d.delivery_id FROM webhook_delivery_all AS d
            WHERE NOT EXISTS (SELECT FROM media_hooks_held_by_v2(
                %(o)s, %(c)s, d.destination_id, d.asset_id, d.event_type,
                d.created_at, d.emit_seq, d.delivery_id))
            ORDER BY d.delivery_id
            """,
            {"o": ordering, "c": coalescing},
        ).fetchall()
        assert [r["delivery_id"] for r in rows] == expected, (ordering, coalescing)


def test_turning_ordering_on_parks_the_due_deliveries_it_holds(conn, settings):
    """Recorded while the destination did not order (born due): once it orders by asset, its
    held deliveries are parked at once, and its heads stay due."""
    add_destination(conn, "pub")
    ids = {(asset, n): _emit(conn, "pub", asset, n) for n in (1, 2, 3) for asset in ("a1", "a2")}
    spec = DestinationSpec("pub", "http://127.0.0.1:9/", ordering="asset")
    upsert_destination(conn, spec, settings)
    assert _parked(conn, *(ids[("a1", n)] for n in (1, 2, 3))) == [False, True, True]
    assert _parked(conn, *(ids[("a2", n)] for n in (1, 2, 3))) == [False, True, True]
    assert claimed(conn, "run-1") == {ids[("a1", 1)], ids[("a2", 1)]}
    upsert_destination(conn, spec, settings)
    assert sweeps.sweep_wake_parked_heads(conn) == 0, "heads in flight, the rest held"


def test_a_delivery_recorded_due_behind_a_dead_head_is_not_work_for_a_run(conn):
    """Recorded due while its predecessor was invisible to its producer (or by an older
    release's emit): held by the claim's rule, it is not counted as due work, so no run is
    started for it again and again while the head is dead."""
    add_destination(conn, "ordered", ordering="asset")
    head, second = (_emit(conn, "ordered", "a1", n) for n in (1, 2))
    conn.execute(
        "UPDATE webhook_delivery_all SET next_attempt_at = now() - interval '1 minute' "
        "WHERE delivery_id = %s",
        (second,),
    )
    assert figures.measure(conn).due_work and figures.cohort_due(conn, Cohort())
    settle(conn, head, "dead")
    measured = figures.measure(conn)
    assert (measured.due_work, measured.oldest_due_any_age_seconds is not None) == (False, True)
    assert not figures.cohort_due(conn, Cohort())
    assert claimed(conn, "run-1") == set()
