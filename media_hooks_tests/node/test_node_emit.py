"""A Node.js producer's emit (node/src/emit.js) inside its own pg transaction: the rows commit
or vanish with the producer's work, they are the rows the Python producer records for the same
event (identity, payload, body bytes), and bad input is the Python producer's error, typed,
with nothing written and the producer's transaction still usable (issue 33, part 2)."""

from __future__ import annotations

import pytest

from media_hooks.core.errors import UserError
from media_hooks.outbox.destinations import DestinationSpec, upsert_destination
from media_hooks.outbox.emit import (
    Event,
    FanOutEvent,
    derive_delivery_id,
    emit,
    emit_event,
    emit_many,
    event_delivery_id,
    request_body,
)
from media_hooks_tests.node.conftest import run_emit

PAYLOAD = {"b": [1, 2.5, "é ✓"], "a": None, "nested": {"z": True, "y": 'quote " \\'}}
EVENT = {
    "destinationId": "cdn",
    "assetId": "asset-1",
    "eventType": "transcode.completed",
    "payload": PAYLOAD,
}
FAN_OUT = {
    "eventId": "evt-1",
    "assetId": "asset-2",
    "eventType": "rights.updated",
    "payload": {"n": 1},
}


@pytest.fixture
def destinations(conn, settings) -> None:
    for name, pattern in (("cdn", "transcode.*"), ("rights", "rights.*")):
        spec = DestinationSpec(name, "http://127.0.0.1:9/", event_types=(pattern,))
        upsert_destination(conn, spec, settings)


def _written(conn) -> dict[str, int]:
    return conn.execute(
        "SELECT (SELECT count(*) FROM webhook_delivery_all) AS deliveries, "
        "(SELECT count(*) FROM delivery_identity) AS identities, "
        "(SELECT count(*) FROM webhook_event) AS events"
    ).fetchone()


def _python_event(event: dict) -> Event | FanOutEvent:
    if "eventId" in event:
        return FanOutEvent(event["eventId"], event["assetId"], event["eventType"], event["payload"])
    return Event(
        event["destinationId"],
        event["assetId"],
        event["eventType"],
        event["payload"],
        event.get("deliveryId"),
    )


def _python_error(conn, call) -> str:
    """What the Python producer says to the same call (its work rolled back)."""
    with conn.transaction(force_rollback=True):
        try:
            call()
        except UserError as exc:
            return str(exc)
    pytest.fail("the Python producer accepted it")


def test_an_emit_rolled_back_with_its_transaction_leaves_nothing(
    node, conn, database_url, destinations
):
    bulk = [dict(EVENT, assetId="asset-3"), dict(FAN_OUT, eventId="evt-2")]
    results = run_emit(
        node,
        database_url,
        "rollback",
        [
            {"fn": "emit", "event": EVENT},
            {"fn": "emitEvent", "event": FAN_OUT},
            {"fn": "emitMany", "events": bulk},
        ],
    )
    assert [list(r) for r in results] == [["ok"]] * 3, results
    assert results[0]["ok"]["inserted"] is True
    assert results[1]["ok"]["destinationIds"] == ["rights"]
    assert results[2]["ok"]["inserted"] == 2
    assert _written(conn) == {"deliveries": 0, "identities": 0, "events": 0}


def test_a_committed_emit_records_what_the_python_producer_records(
    node, conn, database_url, destinations
):
    (first, again, fanned) = run_emit(
        node,
        database_url,
        "commit",
        [
            {"fn": "emit", "event": EVENT},
            {"fn": "emit", "event": EVENT},
            {"fn": "emitEvent", "event": FAN_OUT},
        ],
    )
    delivery_id = derive_delivery_id("cdn", "transcode.completed", "asset-1", PAYLOAD)
    assert first["ok"] == {"deliveryId": delivery_id, "inserted": True}
    assert again["ok"] == {"deliveryId": delivery_id, "inserted": False}
    row = conn.execute(
        "SELECT * FROM webhook_delivery_all WHERE delivery_id = %s", (delivery_id,)
    ).fetchone()
    assert (row["state"], row["payload"], row["destination_id"]) == ("pending", PAYLOAD, "cdn")
    # The body the receiver will get, byte for byte the Python producer's for this event.
    assert bytes(row["body"]) == request_body(
        "transcode.completed", row["created_at"], "asset-1", PAYLOAD
    )
    fanned_id = event_delivery_id("evt-1", "rights")
    assert fanned["ok"]["deliveryIds"] == [fanned_id]
    assert conn.execute(
        "SELECT destination_id FROM webhook_delivery_all WHERE delivery_id = %s", (fanned_id,)
    ).fetchone() == {"destination_id": "rights"}
    # The same event from the Python producer is the same delivery: recorded once.
    assert emit(conn, _python_event(EVENT)).inserted is False
    assert emit_event(conn, _python_event(FAN_OUT)).recorded is False


def test_a_bulk_emit_counts_new_present_and_repeated_ids_once(
    node, conn, database_url, destinations
):
    events = [
        dict(EVENT, deliveryId="d-1"),
        dict(EVENT, deliveryId="d-1"),  # a retried line: the same event, counted once
        dict(EVENT, deliveryId="d-2", assetId="asset-9"),
        FAN_OUT,
    ]
    emit(conn, Event("cdn", "asset-9", "transcode.completed", PAYLOAD, "d-2"))
    (result,) = run_emit(node, database_url, "none", [{"fn": "emitMany", "events": events}])
    assert result["ok"] == {
        "inserted": 2,
        "alreadyPresent": 1,
        "eventsRecorded": 1,
        "eventsAlreadyPresent": 0,
        "eventsUnmatched": 0,
        "unmatchedSample": [],
    }
    assert _written(conn)["deliveries"] == 3


BAD_EVENTS = {
    "unknown-destination": dict(EVENT, destinationId="nope"),
    "payload-array": dict(EVENT, payload=[1, 2]),
    "payload-string": dict(EVENT, payload="x"),
    "payload-null": dict(EVENT, payload=None),
    "payload-too-big": dict(EVENT, payload={"x": "a" * (1024 * 1024)}),
    "asset-too-long": dict(EVENT, assetId="a" * 1025),
    "event-type-too-long": dict(EVENT, eventType="t" * 257),
    "asset-empty": dict(EVENT, assetId=""),
    "asset-nul": dict(EVENT, assetId="a\x00b"),
    "delivery-id-dot": dict(EVENT, deliveryId="a.b"),
    "delivery-id-too-long": dict(EVENT, deliveryId="d" * 201),
    "destination-id-number": dict(EVENT, destinationId=7),
}


def _deep(levels: int) -> dict:
    payload: dict = {}
    for _ in range(levels - 1):
        payload = {"d": payload}
    return payload


BAD_EVENTS["payload-too-deep"] = dict(EVENT, payload=_deep(129))


@pytest.mark.parametrize("case", sorted(BAD_EVENTS))
def test_bad_input_is_the_python_producers_error_and_writes_nothing(
    node, conn, database_url, destinations, case
):
    bad = BAD_EVENTS[case]
    (refused, good) = run_emit(
        node,
        database_url,
        "commit",
        [{"fn": "emit", "event": bad}, {"fn": "emit", "event": dict(EVENT, deliveryId="d-ok")}],
    )
    expected = _python_error(conn, lambda: emit(conn, _python_event(bad)))
    assert refused == {"error": {"name": "UserError", "message": expected}}
    # Nothing of the bad event was written, and the producer's transaction went on to commit.
    assert good["ok"]["inserted"] is True
    assert _written(conn) == {"deliveries": 1, "identities": 1, "events": 0}


BAD_BULKS = {
    "conflicting-duplicate": [
        dict(EVENT, deliveryId="d-1"),
        dict(EVENT, deliveryId="d-1", payload={"changed": True}),
    ],
    "unknown-destination": [EVENT, dict(EVENT, destinationId="nope", assetId="x")],
    "bad-third-event": [EVENT, FAN_OUT, dict(EVENT, payload=[])],
    "conflicting-fan-out": [FAN_OUT, dict(FAN_OUT, eventType="rights.revoked")],
}


@pytest.mark.parametrize("case", sorted(BAD_BULKS))
def test_a_bad_bulk_is_the_python_producers_error_and_writes_nothing(
    node, conn, database_url, destinations, case
):
    events = BAD_BULKS[case]
    (refused, good) = run_emit(
        node,
        database_url,
        "commit",
        [
            {"fn": "emitMany", "events": events},
            {"fn": "emit", "event": dict(EVENT, deliveryId="d-ok")},
        ],
    )
    expected = _python_error(conn, lambda: emit_many(conn, [_python_event(e) for e in events]))
    assert refused == {"error": {"name": "UserError", "message": expected}}
    assert good["ok"]["inserted"] is True
    assert _written(conn) == {"deliveries": 1, "identities": 1, "events": 0}


def test_an_event_id_reused_for_another_event_is_refused(node, conn, database_url, destinations):
    emit_event(conn, _python_event(FAN_OUT))
    changed = dict(FAN_OUT, eventType="rights.revoked")
    (refused,) = run_emit(node, database_url, "commit", [{"fn": "emitEvent", "event": changed}])
    expected = _python_error(conn, lambda: emit_event(conn, _python_event(changed)))
    assert refused == {"error": {"name": "UserError", "message": expected}}
    assert _written(conn) == {"deliveries": 1, "identities": 1, "events": 1}


def test_fields_the_api_does_not_know_are_refused(node, conn, database_url, destinations):
    (refused,) = run_emit(
        node, database_url, "commit", [{"fn": "emit", "event": dict(EVENT, destination_id="cdn")}]
    )
    assert refused["error"]["name"] == "UserError"
    assert refused["error"]["message"].startswith("unknown field 'destination_id' (fields: ")
    assert _written(conn)["deliveries"] == 0
