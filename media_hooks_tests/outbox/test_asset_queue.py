"""Which deliveries join their asset's queue (migration 0029; docs/architecture.md invariant 10):
those of a destination that orders or coalesces by asset, from their emit by every path, and a
destination's whole open backlog when it starts to, whichever release changes it; the others
cost no entry in webhook_delivery_queue. A destination starting to order and an emit to it in
flight, in both orders: the emit's delivery is queued either way."""

from __future__ import annotations

import psycopg
import pytest

from media_hooks.devtools.receiver import Receiver
from media_hooks.engine.delivery_run import deliver_due
from media_hooks.observe import checks
from media_hooks.outbox.destinations import DestinationSpec, upsert_destination
from media_hooks.outbox.emit import Event, FanOutEvent, emit, emit_event, emit_many
from media_hooks.store import db
from media_hooks_tests.factories import add_deliveries, add_destination
from media_hooks_tests.interleaving import in_background, open_session, wait_until_blocked
from media_hooks_tests.plans import through_index
from media_hooks_tests.queues import claimed, revisions_received, settle

QUEUE = "webhook_delivery_queue"


def _queued(conn: psycopg.Connection) -> dict[str, bool | None]:
    rows = conn.execute("SELECT destination_id, queued FROM webhook_delivery_all").fetchall()
    found: dict[str, set] = {}
    for row in rows:
        found.setdefault(row["destination_id"], set()).add(row["queued"])
    return {destination: values.pop() for destination, values in found.items() if len(values) == 1}


def _in_queue_index(conn: psycopg.Connection, destination_id: str) -> int:
    """How many of a destination's deliveries webhook_delivery_queue holds, read through it."""
    (row,) = through_index(
        conn,
        QUEUE,
        "SELECT count(*) AS n FROM webhook_delivery_all WHERE destination_id = %s"
        " AND queued IS NOT FALSE AND state <> 'succeeded' AND closed_reason IS NULL",
        (destination_id,),
    )
    return row["n"]


def _upsert(
    conn, settings, destination_id: str, url: str = "http://127.0.0.1:9/", **options
) -> None:
    spec = DestinationSpec(destination_id, url, **options)
    upsert_destination(conn, spec, settings)


def test_a_delivery_is_queued_only_where_its_destination_orders_or_coalesces(conn, settings):
    for destination_id, options in [
        ("plain", {}),
        ("ordered", {"ordering": "asset"}),
        ("latest", {"coalescing": "asset"}),
    ]:
        _upsert(conn, settings, destination_id, event_types=("rights.*",), **options)
    for destination_id in ("plain", "ordered", "latest"):
        emit(conn, Event(destination_id, "film", "rights.updated", {"n": 1}))
        emit_many(conn, [Event(destination_id, "film", "rights.updated", {"n": 2})])
    emit_event(conn, FanOutEvent("ev-1", "film", "rights.updated", {"n": 3}))
    emit_many(conn, [FanOutEvent("ev-2", "film", "rights.updated", {"n": 4})])

    assert _queued(conn) == {"plain": False, "ordered": True, "latest": True}
    counts = conn.execute(
        "SELECT destination_id, count(*) AS n FROM webhook_delivery_all GROUP BY 1"
    ).fetchall()
    assert {r["destination_id"]: r["n"] for r in counts} == {"plain": 4, "ordered": 4, "latest": 4}
    assert {d: _in_queue_index(conn, d) for d in ("plain", "ordered", "latest")} == {
        "plain": 0,
        "ordered": 4,
        "latest": 4,
    }


@pytest.mark.parametrize("option", ["ordering", "coalescing"])
def test_a_destination_that_starts_to_queue_queues_its_open_backlog(conn, settings, option):
    """Pending, enqueued, leased and dead-not-closed deliveries join their queues; succeeded and
    closed ones, which are in no queue, are left as they are. (Each of its own type: none is
    superseded when latest-wins begins.)"""
    add_destination(conn, "pub")
    for n in range(6):
        emit(conn, Event("pub", "film", f"rights.v{n}", {"n": n}, delivery_id=f"d-{n}"))
    states = ["pending", "enqueued", "leased", "dead", "succeeded", "dead"]
    for n, state in enumerate(states):
        closed = ", closed_reason = 'discarded'" if n == 5 else ""
        lease = (
            ", lease_token = gen_random_uuid(), lease_until = now()" if state == "leased" else ""
        )
        conn.execute(
            f"UPDATE webhook_delivery_all SET state = %s{closed}{lease} WHERE delivery_id = %s",
            (state, f"d-{n}"),
        )
    assert _queued(conn) == {"pub": False}

    _upsert(conn, settings, "pub", **{option: "asset"})
    rows = conn.execute("SELECT delivery_id, queued FROM webhook_delivery_all").fetchall()
    assert {r["delivery_id"]: r["queued"] for r in rows} == {
        "d-0": True,
        "d-1": True,
        "d-2": True,
        "d-3": True,
        "d-4": False,
        "d-5": False,
    }
    assert _in_queue_index(conn, "pub") == 4


def test_the_previous_releases_change_of_a_destination_queues_its_backlog_too(conn):
    """The previous release turns ordering on with its own statement, a plain UPDATE: the
    trigger queues what this release's emits had not."""
    add_destination(conn, "pub")
    emit(conn, Event("pub", "film", "rights.updated", {"n": 1}))
    conn.execute("UPDATE webhook_destination SET ordering = 'asset' WHERE destination_id = 'pub'")
    assert _queued(conn) == {"pub": True}


def test_a_backlog_queued_when_ordering_begins_is_claimed_head_first(conn, settings):
    """Three revisions of one asset emitted while the destination did not order (not queued),
    then ordering turned on: a run claims the first alone, and the next only once it is done."""
    add_destination(conn, "pub")
    ids = [
        emit(conn, Event("pub", "film", "rights.updated", {"revision": n})).delivery_id
        for n in (1, 2, 3)
    ]
    _upsert(conn, settings, "pub", ordering="asset")
    assert claimed(conn, "run-1") == {ids[0]}
    assert claimed(conn, "run-2") == set()
    settle(conn, ids[0], "succeeded")
    assert claimed(conn, "run-3") == {ids[1]}


def test_a_backlog_queued_when_ordering_begins_goes_out_in_order(conn, database_url, settings):
    with Receiver() as receiver:
        add_destination(conn, "pub", url=receiver.url)
        for n in (1, 2, 3):
            emit(conn, Event("pub", "film", "rights.updated", {"revision": n}))
        _upsert(conn, settings, "pub", receiver.url, ordering="asset")
        with db.open_pool(database_url, max_size=4) as pool:
            for run in range(3):
                deliver_due(pool, f"run-{run}", settings)
        assert revisions_received(receiver) == {"film": [1, 2, 3]}
    assert checks.run(conn).holds


def _emit_one(producer: psycopg.Connection, n: int) -> None:
    emit(producer, Event("pub", "film", "rights.updated", {"n": n}, delivery_id=f"late-{n}"))


def _emit_bulk(producer: psycopg.Connection, n: int) -> None:
    emit_many(producer, [Event("pub", "film", "rights.updated", {"n": n}, delivery_id=f"late-{n}")])


def _emit_event(producer: psycopg.Connection, n: int) -> None:
    emit_event(producer, FanOutEvent(f"ev-{n}", "film", "rights.updated", {"n": n}))


EMITS = {"emit": _emit_one, "emit_many": _emit_bulk, "emit_event": _emit_event}


@pytest.mark.parametrize("path", sorted(EMITS))
def test_an_emit_in_flight_makes_the_destination_wait_then_is_queued(
    conn, database_url, settings, path
):
    """The emit has read the destination (not ordering) and not committed; turning ordering on
    waits for it on the destination's row, then queues its delivery."""
    add_destination(conn, "pub")
    with open_session(database_url) as producer, open_session(database_url) as operator:
        EMITS[path](producer, 1)
        with in_background(
            lambda: _upsert(operator, settings, "pub", ordering="asset") or operator.commit()
        ) as change:
            wait_until_blocked(conn, operator.info.backend_pid)
            assert not change.done()
            producer.commit()
    assert _queued(conn) == {"pub": True}
    assert checks.run(conn).holds


@pytest.mark.parametrize("path", sorted(EMITS))
def test_a_destination_starting_to_order_makes_an_emit_wait_then_read_it_ordered(
    conn, database_url, settings, path
):
    """Ordering turned on and not committed; an emit to the destination waits on its row, then
    reads it ordering and writes its delivery queued."""
    add_destination(conn, "pub")
    with open_session(database_url) as operator, open_session(database_url) as producer:
        _upsert(operator, settings, "pub", ordering="asset")
        with in_background(lambda: EMITS[path](producer, 2)) as emitted:
            wait_until_blocked(conn, producer.info.backend_pid)
            assert not emitted.done()
            operator.commit()
        producer.commit()
    assert _queued(conn) == {"pub": True}
    assert conn.execute("SELECT count(*) AS n FROM webhook_delivery_all").fetchone()["n"] == 1


def test_the_previous_releases_deliveries_count_as_queued(conn):
    """Rows written without the column (the previous release's emits: NULL) are in the queue,
    so an ordered destination's rule sees them."""
    add_destination(conn, "pub", ordering="asset")
    add_deliveries(conn, "pub", 2, asset_id="film", previous_release=True)
    assert _queued(conn) == {"pub": None}
    assert _in_queue_index(conn, "pub") == 2
    emit(conn, Event("pub", "film", "rights.updated", {}, delivery_id="next"))
    (row,) = conn.execute(
        "SELECT next_attempt_at >= timestamptz '9999-01-01' AS parked FROM webhook_delivery_all"
        " WHERE delivery_id = 'next'"
    ).fetchall()
    assert row["parked"], "held behind the earlier ones, so born parked"
