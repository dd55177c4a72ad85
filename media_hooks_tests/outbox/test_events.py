"""Events and subscriptions (issue 14, part 1): one emit reaches every subscribed destination,
once, with delivery ids derived from the event id and the destination."""

from __future__ import annotations

import psycopg
import pytest

from media_hooks.core.errors import UserError
from media_hooks.observe import figures
from media_hooks.observe.inspection import inspect_event
from media_hooks.outbox.destinations import DestinationSpec, upsert_destination
from media_hooks.outbox.emit import (
    Event,
    FanOutEvent,
    emit,
    emit_event,
    emit_jsonl,
    emit_many,
    event_delivery_id,
)
from media_hooks.outbox.maintenance import retention
from media_hooks_tests.factories import add_destination


def _subscribe(conn, settings, destination_id: str, *patterns: str, **options) -> None:
    spec = DestinationSpec(
        destination_id, "http://127.0.0.1:9/", event_types=patterns or None, **options
    )
    upsert_destination(conn, spec, settings)


@pytest.fixture
def subscribers(conn, settings) -> None:
    """transcodes: exact; rights: a prefix; everything: no subscription (every type); idle: a
    type nobody emits, and disabled (a disabled destination still gets its deliveries)."""
    _subscribe(conn, settings, "transcodes", "transcode.completed")
    _subscribe(conn, settings, "rights", "rights.*")
    _subscribe(conn, settings, "everything")
    _subscribe(conn, settings, "idle", "rights.*", "never.emitted")
    conn.execute("UPDATE webhook_destination SET enabled = false WHERE destination_id = 'idle'")


def _deliveries(conn, event_id: str | None = None) -> list[dict]:
    return conn.execute(
        "SELECT delivery_id, destination_id, asset_id, event_type, payload, body, emit_seq "
        "FROM webhook_delivery_all ORDER BY destination_id, emit_seq"
    ).fetchall()


def _rights(n: int, asset: str = "a1") -> FanOutEvent:
    return FanOutEvent(f"ev-{n}", asset, "rights.updated", {"revision": n})


def test_an_event_reaches_every_subscribed_destination_once(conn, subscribers):
    result = emit_event(conn, _rights(1))
    assert result.recorded and result.inserted == 3
    assert result.destination_ids == ("everything", "idle", "rights")
    rows = _deliveries(conn)
    assert [(r["destination_id"], r["delivery_id"]) for r in rows] == [
        (d, event_delivery_id("ev-1", d)) for d in ("everything", "idle", "rights")
    ]
    assert len({bytes(r["body"]) for r in rows}) == 1, "one event, the same request body"
    sql_id = conn.execute(
        "SELECT media_hooks_event_delivery_id_v1('ev-1', 'rights') AS id"
    ).fetchone()["id"]
    assert sql_id == event_delivery_id("ev-1", "rights") == result.delivery_ids[-1]

    again = emit_event(conn, _rights(1))
    assert (again.recorded, again.inserted) == (False, 0)
    assert again.destination_ids == result.destination_ids, "what it went to, as recorded"
    assert len(_deliveries(conn)) == 3, "emitting twice creates nothing new"

    exact = emit_event(conn, FanOutEvent("ev-2", "a1", "transcode.completed", {}))
    assert exact.destination_ids == ("everything", "transcodes")
    assert emit_event(conn, FanOutEvent("ev-3", "a1", "rights", {})).destination_ids == (
        "everything",
    ), "'rights.*' matches below rights, not rights itself"


def test_an_event_that_matches_no_destination_is_recorded_and_said(conn, settings):
    _subscribe(conn, settings, "rights", "rights.*")
    result = emit_event(conn, FanOutEvent("typo", "a1", "right.updated", {}))
    assert (result.recorded, result.destination_ids, result.inserted) == (True, (), 0)
    stored = conn.execute("SELECT * FROM webhook_event WHERE event_id = 'typo'").fetchone()
    assert (stored["event_type"], stored["destination_ids"]) == ("right.updated", [])


def test_a_reused_event_id_for_another_event_is_refused(conn, subscribers):
    emit_event(conn, _rights(1))
    with pytest.raises(UserError, match="already recorded for a different event"):
        emit_event(conn, FanOutEvent("ev-1", "a1", "transcode.completed", {}))


def test_the_event_commits_or_vanishes_with_the_producers_transaction(
    database_url, conn, subscribers
):
    with psycopg.connect(database_url) as producer:
        emit_event(producer, _rights(1))
        producer.rollback()
        assert conn.execute("SELECT count(*) AS n FROM webhook_event").fetchone()["n"] == 0
        emit_event(producer, _rights(1))
        producer.commit()
    assert len(_deliveries(conn)) == 3


def test_bulk_fans_out_in_file_order_beside_single_deliveries(conn, settings, subscribers):
    _subscribe(conn, settings, "everything", "transcode.*")
    lines = [
        '{"event_id": "ev-1", "asset_id": "a1", "event_type": "rights.updated", '
        '"payload": {"revision": 1}}',
        '{"destination_id": "rights", "asset_id": "a1", "event_type": "rights.updated", '
        '"payload": {"revision": 2}, "delivery_id": "direct-2"}',
        '{"event_id": "ev-3", "asset_id": "a1", "event_type": "rights.updated", '
        '"payload": {"revision": 3}}',
        '{"event_id": "ev-1", "asset_id": "a1", "event_type": "rights.updated", '
        '"payload": {"revision": 1}}',
        '{"event_id": "nobody", "asset_id": "a1", "event_type": "nobody.cares", "payload": {}}',
    ]
    counts = emit_jsonl(conn, lines)
    assert (counts.inserted, counts.already_present) == (5, 0)
    assert (counts.events_recorded, counts.events_already_present) == (3, 0)
    assert (counts.events_unmatched, counts.unmatched_sample) == (1, ("nobody",))
    rights = [r for r in _deliveries(conn) if r["destination_id"] == "rights"]
    assert [r["payload"]["revision"] for r in rights] == [1, 2, 3], "emission order is file order"
    assert [r["delivery_id"] for r in rights] == [
        event_delivery_id("ev-1", "rights"),
        "direct-2",
        event_delivery_id("ev-3", "rights"),
    ]

    again = emit_many(conn, [_rights(1), _rights(4)])
    assert (again.events_recorded, again.events_already_present, again.inserted) == (1, 1, 2)


def test_single_emits_are_numbered_in_emission_order(conn, settings):
    add_destination(conn, "pub")
    with conn.transaction():
        for n in range(3):
            emit(conn, Event("pub", "a1", "rights.updated", {"revision": n}))
    rows = conn.execute("SELECT payload, emit_seq FROM webhook_delivery_all ORDER BY emit_seq")
    assert [r["payload"]["revision"] for r in rows] == [0, 1, 2]


def test_inspect_an_event_lists_its_deliveries_and_their_verdicts(conn, subscribers):
    emit_event(conn, _rights(1))
    conn.execute(
        "UPDATE webhook_delivery_all SET state = 'succeeded' WHERE destination_id = 'rights'"
    )
    story = inspect_event(conn, "ev-1")
    verdicts = {s.delivery["destination_id"]: s.verdict.kind for s in story.deliveries}
    assert verdicts == {"everything": "due", "idle": "waiting", "rights": "succeeded"}
    document = story.as_dict()
    assert document["event"]["destination_ids"] == ["everything", "idle", "rights"]
    with pytest.raises(UserError, match="no event 'ev-9'"):
        inspect_event(conn, "ev-9")


def test_status_counts_by_event_type(conn, subscribers):
    emit_event(conn, _rights(1))
    emit_event(conn, FanOutEvent("ev-2", "a1", "transcode.completed", {}))
    f = figures.measure(conn, by="event-type")
    assert f.counts == {"rights.updated": {"pending": 3}, "transcode.completed": {"pending": 2}}


def test_retention_forgets_events_with_their_tombstones(conn, subscribers):
    emit_event(conn, _rights(1))
    later = conn.execute("SELECT now() + interval '500 days' AS t").fetchone()["t"]
    figures_ = retention.run_retention(conn, retention.RetentionPolicy(), now=later)
    assert figures_.events_expired == 1
    assert conn.execute("SELECT count(*) AS n FROM webhook_event").fetchone()["n"] == 0
