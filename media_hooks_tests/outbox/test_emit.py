"""Emit (media_hooks.outbox.emit): the producer's API, against a real database."""

from __future__ import annotations

import io
import json
import re
from datetime import UTC, datetime, timedelta, timezone

import psycopg
import pytest
from psycopg.rows import dict_row

from media_hooks.core.errors import UserError
from media_hooks.core.identifiers import validate_identifier
from media_hooks.outbox.emit import (
    MAX_ASSET_ID_CHARS,
    MAX_BODY_BYTES,
    MAX_EVENT_TYPE_CHARS,
    MAX_LINE_BYTES,
    MAX_PAYLOAD_BYTES,
    MAX_PAYLOAD_DEPTH,
    EmitCounts,
    Event,
    bounded_lines,
    derive_delivery_id,
    emit,
    emit_jsonl,
    emit_many,
    parse_json,
    request_body,
    rfc3339,
)


@pytest.fixture
def destination(conn) -> str:
    conn.execute(
        "INSERT INTO webhook_destination (destination_id, url) VALUES ('pub', 'https://p.example/')"
    )
    return "pub"


def _deliveries(conn) -> list[dict]:
    return conn.execute(
        "SELECT * FROM webhook_delivery_all ORDER BY created_at, delivery_id"
    ).fetchall()


def _nested(depth: int) -> dict:
    """A payload whose containers nest ``depth`` deep (the payload object is level 1)."""
    value: object = 1
    for _ in range(depth - 1):
        value = [value]
    return {"x": value}


def _event(n: int = 1, **changes) -> Event:
    values = {
        "destination_id": "pub",
        "asset_id": f"asset-{n}",
        "event_type": "transcode.completed",
        "payload": {"rendition": "1080p", "n": n},
    }
    return Event(**{**values, **changes})


def test_request_body_is_the_contract_bytes():
    created = datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=timezone(timedelta(hours=2)))
    body = request_body("rights.cleared", created, "asset-ü", {"z": [1, 2.5], "a": {"y": None}})
    assert (
        body
        == (
            '{"type":"rights.cleared","timestamp":"2024-05-06T05:08:09.123456Z",'
            '"asset_id":"asset-ü","data":{"a":{"y":null},"z":[1,2.5]}}'
        ).encode()
    )
    document = json.loads(body)
    assert list(document) == ["type", "timestamp", "asset_id", "data"]


def test_request_body_refuses_a_naive_time():
    with pytest.raises(ValueError, match="timezone-aware"):
        request_body("t", datetime(2024, 1, 1), "a", {})


def test_emit_records_a_pending_delivery_whose_body_matches_its_row(conn, destination):
    result = emit(conn, _event(payload={"b": 2, "a": "é"}))
    assert result.inserted
    (row,) = _deliveries(conn)
    assert row["delivery_id"] == result.delivery_id
    assert (row["state"], row["attempt_count"]) == ("pending", 0)
    assert row["payload"] == {"a": "é", "b": 2}
    assert row["next_attempt_at"] == row["created_at"]
    expected = request_body("transcode.completed", row["created_at"], "asset-1", row["payload"])
    assert bytes(row["body"]) == expected


def test_same_delivery_id_twice_records_once(conn, destination):
    """Invariant 1: one logical delivery, one durable identity."""
    first = emit(conn, _event(delivery_id="order-7:transcoded"))
    second = emit(conn, _event(delivery_id="order-7:transcoded", payload={"changed": True}))
    assert (first.inserted, second.inserted) == (True, False)
    assert first.delivery_id == second.delivery_id == "order-7:transcoded"
    (row,) = _deliveries(conn)
    assert row["payload"] == {"rendition": "1080p", "n": 1}, "the first payload is kept"


def test_derived_ids_are_deterministic(conn, destination):
    same = derive_delivery_id("pub", "t", "a1", {"x": 1, "y": [1, 2]})
    assert same == derive_delivery_id("pub", "t", "a1", {"y": [1, 2], "x": 1})
    assert same != derive_delivery_id("pub", "t", "a1", {"x": 2, "y": [1, 2]})
    assert same != derive_delivery_id("other", "t", "a1", {"x": 1, "y": [1, 2]})
    assert validate_identifier(same, "delivery_id") == same
    assert same.startswith("evt_") and len(same) == 36

    first = emit(conn, _event())
    again = emit(conn, _event())
    assert first.delivery_id == again.delivery_id
    assert first.delivery_id == derive_delivery_id(
        "pub", "transcode.completed", "asset-1", {"rendition": "1080p", "n": 1}
    )
    assert (first.inserted, again.inserted) == (True, False)
    assert len(_deliveries(conn)) == 1


def test_emit_joins_the_producers_transaction(database_url, conn, destination):
    with psycopg.connect(database_url, row_factory=dict_row) as producer:
        emit(producer, _event(1))
        producer.rollback()
        assert _deliveries(conn) == [], "rolled back with the producer's work"
        emit(producer, _event(2))
        assert _deliveries(conn) == [], "not visible before the producer commits"
        producer.commit()
    assert [row["asset_id"] for row in _deliveries(conn)] == ["asset-2"]


def test_unknown_destination_leaves_the_producers_transaction_usable(database_url, destination):
    with psycopg.connect(database_url) as producer:  # tuple rows: emit must not care
        with pytest.raises(UserError, match="unknown destination 'nope'"):
            emit(producer, _event(destination_id="nope"))
        assert emit(producer, _event()).inserted
        producer.commit()


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"payload": [1, 2]}, "payload must be a JSON object, got an array"),
        ({"payload": "text"}, "got a string"),
        ({"payload": {"x": float("nan")}}, "NaN"),
        ({"payload": {"when": datetime(2024, 1, 1)}}, "payload is not JSON"),
        ({"payload": {"x": "nul\x00"}}, "NUL"),
        ({"delivery_id": "has.dot"}, "delivery_id"),
        ({"destination_id": ""}, "destination_id must not be empty"),
        ({"asset_id": ""}, "asset_id must be a non-empty string"),
        ({"event_type": 5}, "event_type must be a non-empty string"),
    ],
)
def test_bad_events_are_refused(conn, destination, change, problem):
    with pytest.raises(UserError, match=problem):
        emit(conn, _event(**change))
    assert _deliveries(conn) == []


def test_payload_size_limit(conn, destination):
    payload = {"blob": "x" * 100}
    with pytest.raises(UserError, match="at most 64 are allowed"):
        emit(conn, _event(payload=payload), max_payload_bytes=64)
    assert emit(conn, _event(payload=payload), max_payload_bytes=112).inserted


def test_emit_many_counts_new_present_and_duplicates_once(conn, destination):
    emit(conn, _event(1, delivery_id="k1"))
    events = [
        _event(1, delivery_id="k1"),  # already recorded
        _event(2, delivery_id="k2"),
        _event(3),
        _event(2, delivery_id="k2"),  # the same event again inside the batch
        _event(3),  # same event, same derived id
    ]
    assert emit_many(conn, events) == EmitCounts(inserted=2, already_present=1)
    rows = {row["delivery_id"]: row for row in _deliveries(conn)}
    assert len(rows) == 3
    assert rows["k2"]["payload"] == {"rendition": "1080p", "n": 2}
    derived = rows[derive_delivery_id("pub", "transcode.completed", "asset-3", _event(3).payload)]
    assert bytes(derived["body"]) == request_body(
        "transcode.completed", derived["created_at"], "asset-3", derived["payload"]
    )
    assert emit_many(conn, events) == EmitCounts(inserted=0, already_present=3)


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        (_event(50, payload=[1]), "event 3: payload must be a JSON object"),
        (_event(50, destination_id="nope"), "event 3: unknown destination 'nope'"),
        (_event(50, delivery_id="a.b"), "event 3: delivery_id"),
    ],
)
def test_emit_many_is_all_or_nothing(database_url, conn, destination, bad, problem):
    events = [_event(1), _event(2), bad, _event(4)]
    with psycopg.connect(database_url) as producer:
        with pytest.raises(UserError, match=problem):
            emit_many(producer, events)
        producer.rollback()
    assert _deliveries(conn) == []


def test_bulk_error_leaves_the_producers_transaction_usable(database_url, conn, destination):
    with psycopg.connect(database_url) as producer:
        producer.execute("CREATE TABLE producer_work (n int)")
        producer.execute("INSERT INTO producer_work VALUES (1)")
        with pytest.raises(UserError, match="event 2: payload must be a JSON object"):
            emit_many(producer, [_event(1), _event(2, payload=None)])  # fails inside the COPY
        with pytest.raises(UserError, match="event 1: unknown destination"):
            emit_many(producer, [_event(3, destination_id="nope")])  # fails after the COPY
        assert emit_many(producer, [_event(4)]) == EmitCounts(inserted=1, already_present=0)
        producer.commit()
    assert conn.execute("SELECT count(*) AS n FROM producer_work").fetchone()["n"] == 1
    assert [row["asset_id"] for row in _deliveries(conn)] == ["asset-4"]


def test_emit_many_on_an_autocommit_connection(conn, destination):
    counts = emit_many(conn, (_event(n) for n in range(1, 101)))
    assert counts == EmitCounts(inserted=100, already_present=0)
    with pytest.raises(UserError, match="event 2: unknown destination"):
        emit_many(conn, [_event(200), _event(201, destination_id="nope")])
    assert len(_deliveries(conn)) == 100, "the failed batch wrote nothing"
    assert emit_many(conn, []) == EmitCounts(inserted=0, already_present=0)


def test_emit_jsonl_names_lines_and_skips_blank_ones(conn, destination):
    good = json.dumps(
        {"destination_id": "pub", "asset_id": "a", "event_type": "t", "payload": {"k": 1}}
    )
    lines = [good.encode() + b"\n", b"\n", b'{"destination_id": "pub"}\n']
    with pytest.raises(UserError, match="line 3: missing field 'asset_id'"):
        emit_jsonl(conn, lines)
    with pytest.raises(UserError, match="line 2: not UTF-8"):
        emit_jsonl(conn, [good.encode(), b"\xff\xfe\n"])
    with pytest.raises(UserError, match="line 1: unknown field 'deliveryId'"):
        emit_jsonl(conn, [good[:-1] + ', "deliveryId": "x"}'])
    assert _deliveries(conn) == []
    assert emit_jsonl(conn, [good, "", good]) == EmitCounts(inserted=1, already_present=0)


def test_created_at_is_utc_now(conn, destination):
    before = datetime.now(UTC)
    emit(conn, _event())
    (row,) = _deliveries(conn)
    assert before <= row["created_at"] <= datetime.now(UTC)


@pytest.mark.parametrize(
    "change",
    [
        {"payload": {"second": True}},
        {"asset_id": "another-asset"},
        {"event_type": "rights.cleared"},
    ],
)
def test_a_conflicting_duplicate_in_one_batch_is_refused_naming_both(conn, destination, change):
    """Invariant 2: one delivery_id, one event. Collapsing two different events under one id to
    the first would silently drop the second."""
    events = [
        _event(1),
        _event(2, delivery_id="k2"),
        _event(3),
        _event(4, delivery_id="k2", **change),
    ]
    with pytest.raises(UserError) as refused:
        emit_many(conn, events)
    assert str(refused.value).startswith(
        "event 4: delivery_id 'k2' is already used by event 2 for a different event"
    )
    assert _deliveries(conn) == []


def test_a_conflicting_duplicate_for_another_destination_is_refused(conn, destination):
    conn.execute(
        "INSERT INTO webhook_destination (destination_id, url) VALUES ('pub2', 'https://q.example/')"
    )
    events = [_event(1, delivery_id="k"), _event(1, delivery_id="k", destination_id="pub2")]
    with pytest.raises(UserError, match="event 2: delivery_id 'k' is already used by event 1"):
        emit_many(conn, events)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"asset_id": "a" * (MAX_ASSET_ID_CHARS + 1)}, "asset_id is 1025 characters long; at most 1024"),
        ({"event_type": "t" * (MAX_EVENT_TYPE_CHARS + 1)}, "event_type is 257 characters long; at most 256"),
        ({"delivery_id": "k" * 201}, "delivery_id is 201 characters long"),
        ({"payload": {"n": 10**5000}}, "payload has a number with too many digits"),
        ({"payload": _nested(MAX_PAYLOAD_DEPTH + 1)}, "payload is nested more than 128 levels"),
        ({"payload": _nested(3000)}, "payload is nested more than 128 levels"),
        ({"asset_id": "\ud800"}, "the event contains text that is not valid Unicode"),
    ],
)  # fmt: skip
def test_every_field_is_bounded(conn, destination, change, problem):
    with pytest.raises(UserError, match=re.escape(problem)):
        emit(conn, _event(**change))
    with pytest.raises(UserError, match=re.escape(f"event 1: {problem}")):
        emit_many(conn, [_event(**change)])
    assert _deliveries(conn) == []


def test_the_largest_event_fits_the_body_bound(conn, destination):
    """Every field at its bound, written with the costliest characters JSON has: the body is
    still within MAX_BODY_BYTES, so bounding the fields bounds the whole request."""
    worst = "\x01"  # escaped as \u0001: six bytes for one character
    payload = {"x": "y" * (MAX_PAYLOAD_BYTES - 8)}
    event = _event(
        asset_id=worst * MAX_ASSET_ID_CHARS,
        event_type=worst * MAX_EVENT_TYPE_CHARS,
        payload=payload,
        delivery_id="k" * 200,
    )
    assert emit(conn, event).inserted
    (row,) = _deliveries(conn)
    assert MAX_BODY_BYTES - 1024 < len(bytes(row["body"])) <= MAX_BODY_BYTES
    assert emit(conn, _event(payload=_nested(MAX_PAYLOAD_DEPTH))).inserted


def test_payloads_parse_with_clean_errors():
    assert parse_json('{"a": [1, 2]}') == {"a": [1, 2]}
    for text, problem in [
        ("{not json", "not valid JSON (Expecting property name"),
        ("[" * 2000 + "]" * 2000, "nested too deeply"),
        ('{"n": ' + "9" * 5000 + "}", "a number has more than 4300 digits"),
    ]:
        with pytest.raises(UserError, match=re.escape(problem)):
            parse_json(text)


class _Zeros:
    """/dev/zero as a stream: endless, no newline. Records how much each read asked for."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def readline(self, size: int = -1) -> bytes:
        assert size > 0, "an unbounded read of an endless line"
        self.asked.append(size)
        return b"\0" * size


def test_an_endless_line_is_refused_by_number_after_a_bounded_read(conn, destination):
    zeros = _Zeros()
    with pytest.raises(UserError, match="line 1 is longer than 8388608 bytes"):
        emit_jsonl(conn, zeros)
    assert zeros.asked == [MAX_LINE_BYTES + 1]
    good = json.dumps({"destination_id": "pub", "asset_id": "a", "event_type": "t", "payload": {}})
    stream = io.BytesIO((good + "\n").encode() * 2 + b"x" * 100 + b"\n")
    with pytest.raises(UserError, match="line 3 is longer than 90 bytes"):
        list(bounded_lines(stream, max_line_bytes=90))
    exact = io.BytesIO(b"y" * 64 + b"\n" + b"z" * 64)
    assert [len(line) for line in bounded_lines(exact, max_line_bytes=64)] == [65, 64]


def test_emit_and_emit_many_stamp_the_database_clock_of_the_producers_transaction(
    database_url, conn, destination
):
    """Hole 8: created_at, the due time and the body's timestamp are the database's now() of
    the producer's transaction, to the microsecond, whatever the application host's clock."""
    with psycopg.connect(database_url, row_factory=dict_row) as producer:
        transaction_now = producer.execute("SELECT now() AS now").fetchone()["now"]
        emit(producer, _event(1))
        emit_many(producer, [_event(2), _event(3)])
        producer.commit()
    rows = _deliveries(conn)
    assert len(rows) == 3
    for row in rows:
        assert row["created_at"] == transaction_now
        assert row["next_attempt_at"] == row["budget_started_at"] == transaction_now
        assert json.loads(bytes(row["body"]))["timestamp"] == rfc3339(transaction_now)
        expected = request_body(row["event_type"], transaction_now, row["asset_id"], row["payload"])
        assert bytes(row["body"]) == expected
