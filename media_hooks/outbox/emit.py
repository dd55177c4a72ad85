"""Emit: the producer's API for recording deliveries, one at a time or in bulk.

The point of an outbox is that a producer records a delivery in the same transaction as the
business change that caused it. So these functions take the producer's psycopg connection and
never commit or roll back the producer's transaction: on a connection that is not in autocommit
mode the rows commit or vanish with the producer's work (``emit_many`` uses a savepoint inside
it); on an autocommit connection ``emit`` is one statement and ``emit_many`` one transaction of
its own, so each is still all or nothing.
A UserError (bad event, unknown destination) leaves nothing written and the producer's
transaction usable: ``emit`` checks before it writes, ``emit_many`` works in a savepoint.
On a destination that orders by asset, a delivery held behind an earlier open one of its asset
(in the producer's snapshot, or earlier in the same call) is recorded parked, by reading only:
no lock is taken on an existing row and no worker is waited for (sql/queries/emit.sql).

The request body (docs/contract.md, "The HTTP request a receiver gets") is serialized here, once,
and stored with the delivery: every attempt sends the same bytes. Its ``timestamp`` is the
delivery's ``created_at``: the database's ``now()`` of the producer's transaction, stamped into
the body by the recording statement, so every stored time the protocol compares comes from one
clock (an application host's clock may be off). Python serializes the bytes before and after it.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, BinaryIO, NamedTuple

import psycopg
from psycopg.rows import dict_row

from media_hooks.core.errors import UserError
from media_hooks.core.identifiers import validate_identifier
from media_hooks.store.sqlfiles import query

MAX_PAYLOAD_BYTES = 1024 * 1024
# Bounds on everything else an event carries, so the whole request body is bounded too: at
# most MAX_BODY_BYTES whatever the text (JSON escapes a character in at most 6 bytes).
MAX_ASSET_ID_CHARS = 1024
MAX_EVENT_TYPE_CHARS = 256
MAX_PAYLOAD_DEPTH = 128
_ENVELOPE_BYTES = 6 * (MAX_ASSET_ID_CHARS + MAX_EVENT_TYPE_CHARS) + 128
MAX_BODY_BYTES = MAX_PAYLOAD_BYTES + _ENVELOPE_BYTES
# A line of a JSON-lines file: room for the largest event however its JSON is escaped and
# spaced; a longer line is refused by number before more of it is read.
MAX_LINE_BYTES = 8 * 1024 * 1024
# How often a bulk insert is run again after meeting a concurrent purge's identity row.
_RACE_TRIES = 3
DERIVED_ID_PREFIX = "evt_"
EVENT_FIELDS = ("destination_id", "asset_id", "event_type", "payload", "delivery_id")
_REQUIRED_FIELDS = EVENT_FIELDS[:4]
# A line of a file that fans an event out: no destination, an event id instead.
FAN_OUT_FIELDS = ("event_id", "asset_id", "event_type", "payload")
# How many of a bulk emit's events that matched no destination are named in its result.
UNMATCHED_SAMPLE = 5

# Canonical JSON: compact, keys sorted (equal payloads give equal bytes whatever the key order
# they were built in), UTF-8 as is, and no NaN or Infinity, which JSON does not have.
_CANONICAL = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, sort_keys=True, allow_nan=False
)
# A string as _CANONICAL writes it, by the same C function without the encoder's dispatch
# around it: five strings an event on the bulk path, a fifth of its client time.
_quote = json.encoder.encode_basestring


@dataclass(frozen=True)
class Event:
    """One business event for one destination; ``delivery_id`` None means derive it."""

    destination_id: str
    asset_id: str
    event_type: str
    payload: dict[str, Any]
    delivery_id: str | None = None


@dataclass(frozen=True)
class FanOutEvent:
    """One business event for every destination subscribed to its type (fan-out).

    Each subscribed destination gets one delivery whose id is derived from ``event_id`` and the
    destination (``event_delivery_id``): emitting the same event again records nothing new.
    """

    event_id: str
    asset_id: str
    event_type: str
    payload: dict[str, Any]


@dataclass(frozen=True)
class FanOutResult:
    event_id: str
    recorded: bool  # False: this event_id was already recorded, nothing was written
    destination_ids: tuple[str, ...]  # where its deliveries went; () matched no destination
    inserted: int  # deliveries written now

    @property
    def delivery_ids(self) -> tuple[str, ...]:
        return tuple(event_delivery_id(self.event_id, d) for d in self.destination_ids)


@dataclass(frozen=True)
class EmitResult:
    delivery_id: str
    inserted: bool  # False: this delivery_id was already recorded, nothing was written


@dataclass(frozen=True)
class EmitCounts:
    inserted: int
    already_present: int  # distinct delivery_ids that were already recorded
    # Fan-out events (FanOutEvent, or a file's lines with an event_id):
    events_recorded: int = 0
    events_already_present: int = 0
    events_unmatched: int = 0  # of events_recorded: matched no destination
    unmatched_sample: tuple[str, ...] = ()  # the first few of those, by event_id


# The staging table's columns, in COPY order (sql/queries/emit.sql, emit_staging_create).
_STAGING_TYPES = ("int8", "text", "text", "text", "text", "text", "text", "bytea", "bytea")
# A fan-out line's key in staging: '/' is in no identifier's alphabet (sql/queries/emit.sql).
_EVENT_KEY = "/"


class _Row(NamedTuple):
    """A validated event, as stored; the body around its timestamp, which the database stamps.
    A fan-out event has no destination: its delivery_id is _EVENT_KEY + its event_id."""

    delivery_id: str
    destination_id: str | None
    event_id: str | None
    asset_id: str
    event_type: str
    payload: str
    body_head: bytes
    body_tail: bytes


def rfc3339(moment: datetime) -> str:
    """UTC, microseconds (what PostgreSQL stores, so the body matches the row exactly), ``Z``."""
    if moment.tzinfo is None:
        raise ValueError("a delivery's creation time must be timezone-aware")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_json(text: str | bytes) -> object:
    """``text`` parsed as JSON, or a UserError whose text completes "X is ...": not valid JSON,
    nested too deeply, or holding a number too long to convert."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"not valid JSON ({exc.msg}, column {exc.colno})") from None
    except RecursionError:
        raise UserError(f"nested too deeply (at most {MAX_PAYLOAD_DEPTH} levels)") from None
    except ValueError:
        # Python refuses to convert integers longer than this (CVE-2020-10735).
        limit = sys.get_int_max_str_digits()
        raise UserError(f"not usable JSON: a number has more than {limit} digits") from None


def _nested_deeper_than(value: object, limit: int) -> bool:
    """Whether ``value`` nests containers more than ``limit`` deep (iteratively: no recursion)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        current, depth = stack.pop()
        if isinstance(current, dict):
            children = current.values()
        elif isinstance(current, list | tuple):
            children = current
        else:
            continue
        if depth > limit:
            return True
        stack.extend(
            (child, depth + 1) for child in children if isinstance(child, dict | list | tuple)
        )
    return False


def _payload_json(payload: object) -> str:
    if not isinstance(payload, dict):
        raise UserError(f"payload must be a JSON object, got {_json_type(payload)}")
    try:
        text = _CANONICAL.encode(payload)
    except RecursionError:
        text = None
    except ValueError as exc:
        if "integer string conversion" in str(exc):
            raise UserError("payload has a number with too many digits") from None
        raise UserError("payload contains NaN or Infinity, which JSON cannot represent") from None
    except TypeError as exc:
        raise UserError(f"payload is not JSON: {exc}") from None
    # Counting brackets is the cheap filter: only a payload with that many is walked.
    if text is None or (
        text.count("{") + text.count("[") > MAX_PAYLOAD_DEPTH
        and _nested_deeper_than(payload, MAX_PAYLOAD_DEPTH)
    ):
        raise UserError(f"payload is nested more than {MAX_PAYLOAD_DEPTH} levels deep")
    # PostgreSQL's jsonb cannot hold the NUL character; the substring test is the cheap filter.
    if "\\u0000" in text and _contains_nul(payload):
        raise UserError("payload contains a NUL character (\\u0000), which PostgreSQL refuses")
    return text


def _contains_nul(value: object) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_contains_nul(k) or _contains_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_contains_nul(v) for v in value)
    return False


def _json_type(value: object) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    if isinstance(value, int | float) and not isinstance(value, bool):
        return "a number"
    return names.get(type(value), type(value).__name__)


def _body_parts(event_type: str, asset_id: str, payload_json: str) -> tuple[bytes, bytes]:
    """The body's bytes before and after its timestamp (an RFC 3339 string, quoted here).

    Built from canonical pieces so the top-level keys keep the contract's order.
    """
    head = f'{{"type":{_quote(event_type)},"timestamp":"'
    tail = f'","asset_id":{_quote(asset_id)},"data":{payload_json}}}'
    return head.encode(), tail.encode()


def request_body(event_type: str, created_at: datetime, asset_id: str, payload: dict) -> bytes:
    """The exact bytes a receiver gets: ``{"type","timestamp","asset_id","data"}``, compact
    UTF-8 JSON, ``timestamp`` the creation time in RFC 3339 UTC, payload keys sorted."""
    head, tail = _body_parts(event_type, asset_id, _payload_json(payload))
    return head + rfc3339(created_at).encode() + tail


def _derived_id(destination_id: str, event_type: str, asset_id: str, payload_json: str) -> str:
    canonical = f"[{_quote(destination_id)},{_quote(event_type)},{_quote(asset_id)},{payload_json}]"
    digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    return DERIVED_ID_PREFIX + digest[:32]


def derive_delivery_id(destination_id: str, event_type: str, asset_id: str, payload: dict) -> str:
    """The delivery_id of an event that was given none: the same event gives the same id, so a
    producer that emits an event twice (a retry, a replayed batch) records it once. A payload
    revision is a different event and gets a different id (docs/architecture.md, invariant 2)."""
    return _derived_id(destination_id, event_type, asset_id, _payload_json(payload))


def event_delivery_id(event_id: str, destination_id: str) -> str:
    """The delivery_id of an event's delivery to one destination: the same pair always gives
    the same id (media_hooks_event_delivery_id_v1 in the database computes the same)."""
    digest = hashlib.sha256(f"{event_id}/{destination_id}".encode()).hexdigest()
    return "fan_" + digest[:32]


def _text_field(value: object, what: str, max_chars: int) -> str:
    if not isinstance(value, str) or not value:
        raise UserError(f"{what} must be a non-empty string")
    if len(value) > max_chars:
        raise UserError(f"{what} is {len(value)} characters long; at most {max_chars} are allowed")
    if "\x00" in value:
        raise UserError(f"{what} contains a NUL character")
    return value


def _prepare(event: Event | FanOutEvent, max_payload_bytes: int) -> _Row:
    """Validate one event and serialize it, or raise UserError naming the problem."""
    if isinstance(event, FanOutEvent):
        event_id = validate_identifier(event.event_id, "event_id")
        destination_id = None
    else:
        event_id = None
        destination_id = validate_identifier(event.destination_id, "destination_id")
    asset_id = _text_field(event.asset_id, "asset_id", MAX_ASSET_ID_CHARS)
    event_type = _text_field(event.event_type, "event_type", MAX_EVENT_TYPE_CHARS)
    payload_json = _payload_json(event.payload)
    try:
        payload_size = len(payload_json.encode("utf-8"))
        head, tail = _body_parts(event_type, asset_id, payload_json)
    except UnicodeEncodeError:
        raise UserError("the event contains text that is not valid Unicode") from None
    if payload_size > max_payload_bytes:
        raise UserError(
            f"payload is {payload_size} bytes serialized; at most {max_payload_bytes} are allowed"
        )
    if event_id is not None:
        delivery_id = _EVENT_KEY + event_id
    elif event.delivery_id is None:
        delivery_id = _derived_id(destination_id, event_type, asset_id, payload_json)
    else:
        delivery_id = validate_identifier(event.delivery_id, "delivery_id")
    return _Row(
        delivery_id, destination_id, event_id, asset_id, event_type, payload_json, head, tail
    )


def _unknown_destination(destination_id: str) -> UserError:
    return UserError(
        f"unknown destination {destination_id!r} (add it with `media-hooks destination add`)"
    )


def emit(
    conn: psycopg.Connection, event: Event, *, max_payload_bytes: int = MAX_PAYLOAD_BYTES
) -> EmitResult:
    """Record one pending delivery in the caller's transaction (see the module's docstring).

    Re-emitting a delivery_id that is already recorded writes nothing: ``inserted`` is False.
    """
    if isinstance(event, FanOutEvent):
        raise TypeError("emit records one destination's delivery: use emit_event for fan-out")
    row = _prepare(event, max_payload_bytes)
    with conn.cursor(row_factory=dict_row) as cur:
        result = cur.execute(query("emit_one"), row._asdict()).fetchone()
    if not result["destination_known"]:
        raise _unknown_destination(row.destination_id)
    return EmitResult(delivery_id=row.delivery_id, inserted=result["inserted"])


def emit_event(
    conn: psycopg.Connection, event: FanOutEvent, *, max_payload_bytes: int = MAX_PAYLOAD_BYTES
) -> FanOutResult:
    """Record one event and its deliveries to every subscribed destination, enabled or disabled,
    in one statement in the caller's transaction (see the module's docstring).

    An event_id already recorded writes nothing (``recorded`` False); an event that matches no
    destination is recorded with none (``destination_ids`` empty), so a typo shows. The same
    event_id given for a different type or asset is refused (UserError).
    """
    row = _prepare(event, max_payload_bytes)
    with conn.cursor(row_factory=dict_row) as cur:
        result = cur.execute(query("emit_event_one"), row._asdict()).fetchone()
    stored = (result["stored_event_type"], result["stored_asset_id"])
    # (A stored event is unseen only when a concurrent emit of it committed meanwhile.)
    if (
        not result["recorded"]
        and stored[0] is not None
        and stored != (row.event_type, row.asset_id)
    ):
        raise UserError(
            f"event_id {row.event_id!r} is already recorded for a different event "
            f"({stored[0]!r} for asset {stored[1]!r}): a new event needs a new event_id"
        )
    return FanOutResult(
        event_id=event.event_id,
        recorded=result["recorded"],
        destination_ids=tuple(result["destination_ids"] or ()),
        inserted=result["inserted"],
    )


def _emit_numbered(
    conn: psycopg.Connection,
    numbered: Iterable[tuple[int, Event | FanOutEvent]],
    unit: str,
    max_payload_bytes: int,
) -> EmitCounts:
    """Stage every event through COPY, check them all, then record them in one statement.

    The work runs in a savepoint of the caller's transaction (in a transaction of its own on an
    autocommit connection): an error undoes it and leaves the caller's transaction usable.
    """
    with conn.cursor(row_factory=dict_row) as cur:
        # Outside autocommit this opens the caller's transaction if it had not begun, so the
        # block below is a savepoint in it, not a transaction psycopg would commit on its own.
        cur.execute(query("emit_staging_create"))
        with conn.transaction():
            cur.execute(query("emit_staging_clear"))
            with cur.copy(query("emit_staging_copy")) as copy:
                copy.set_types(_STAGING_TYPES)
                for number, event in numbered:
                    row = _prepare_numbered(event, number, unit, max_payload_bytes)
                    copy.write_row((number, *row))
            _refuse_conflicting_duplicate(cur, unit)
            unknown = cur.execute(query("emit_staging_unknown_destination")).fetchone()
            if unknown is not None:
                error = _unknown_destination(unknown["destination_id"])
                raise UserError(f"{unit} {unknown['ordinal']}: {error}")
            counts = _insert_staged(cur)
            cur.execute(query("emit_staging_clear"))
    counts["unmatched_sample"] = tuple(counts["unmatched_sample"])
    return EmitCounts(**counts)


def _refuse_conflicting_duplicate(cur: psycopg.Cursor, unit: str) -> None:
    """One delivery_id given twice with different events is bad input (an identical repeat is
    a retried line, and fine)."""
    found = cur.execute(query("emit_staging_conflicting_duplicate")).fetchone()
    if found is not None:
        key = found["delivery_id"]
        name = "event_id" if key.startswith(_EVENT_KEY) else "delivery_id"
        raise UserError(
            f"{unit} {found['ordinal']}: {name} {key.removeprefix(_EVENT_KEY)!r} is already used "
            f"by {unit} {found['first_ordinal']} for a different event (one {name}, one "
            f"event: a changed event needs a new {name})"
        )


def _insert_staged(cur: psycopg.Cursor) -> dict[str, int]:
    """emit_staging_insert, run again when a purge committing meanwhile made it meet a
    tombstone its snapshot did not show (sql/queries/emit.sql): the next run sees it."""
    attempt = 1
    while True:
        try:
            with cur.connection.transaction():
                return cur.execute(query("emit_staging_insert")).fetchone()
        except psycopg.errors.UniqueViolation as exc:
            if exc.diag.constraint_name != "delivery_identity_pkey" or attempt == _RACE_TRIES:
                raise
            attempt += 1


def _prepare_numbered(
    event: Event | FanOutEvent, number: int, unit: str, max_payload_bytes: int
) -> _Row:
    try:
        return _prepare(event, max_payload_bytes)
    except UserError as exc:
        raise UserError(f"{unit} {number}: {exc}") from None


def emit_many(
    conn: psycopg.Connection,
    events: Iterable[Event | FanOutEvent],
    *,
    max_payload_bytes: int = MAX_PAYLOAD_BYTES,
) -> EmitCounts:
    """Record many deliveries, all or nothing, in the caller's transaction.

    ``events`` is streamed (COPY into a temporary staging table), then one INSERT records the
    new ones. A delivery_id that appears twice counts once; one already recorded is counted in
    ``already_present``. A FanOutEvent records the event and one delivery per subscribed
    destination, as ``emit_event`` does; an event_id already recorded counts in
    ``events_already_present``. A bad event raises UserError naming its position (1-based).
    """
    return _emit_numbered(conn, enumerate(events, start=1), "event", max_payload_bytes)


def _line_text(line: str | bytes, number: int) -> str:
    if isinstance(line, str):
        return line
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"line {number}: not UTF-8 text") from None


def _event_from_object(value: object) -> Event | FanOutEvent:
    if not isinstance(value, dict):
        raise UserError(f"expected a JSON object, got {_json_type(value)}")
    if "event_id" in value:
        return _fan_out_from_object(value)
    unknown = sorted(set(value) - set(EVENT_FIELDS))
    if unknown:
        raise UserError(f"unknown field {unknown[0]!r} (fields: {', '.join(EVENT_FIELDS)})")
    missing = [name for name in _REQUIRED_FIELDS if name not in value]
    if missing:
        raise UserError(f"missing field {missing[0]!r}")
    return Event(**value)


def _fan_out_from_object(value: dict) -> FanOutEvent:
    unknown = sorted(set(value) - set(FAN_OUT_FIELDS))
    if unknown:
        raise UserError(
            f"field {unknown[0]!r} does not go with event_id (an event line has "
            f"{', '.join(FAN_OUT_FIELDS)}: it goes to every subscribed destination)"
        )
    missing = [name for name in FAN_OUT_FIELDS if name not in value]
    if missing:
        raise UserError(f"missing field {missing[0]!r}")
    return FanOutEvent(**value)


def bounded_lines(stream: BinaryIO, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[bytes]:
    """The lines of a binary stream, none read past ``max_line_bytes``: a longer line (or a
    stream with no newline at all, like /dev/zero) is refused by its number, in bounded memory."""
    number = 0
    while True:
        line = stream.readline(max_line_bytes + 1)
        if not line:
            return
        number += 1
        if len(line) > max_line_bytes and not (
            len(line) == max_line_bytes + 1 and line.endswith(b"\n")
        ):
            raise UserError(
                f"line {number} is longer than {max_line_bytes} bytes, the most one event's "
                "line may have"
            )
        yield line


def parse_jsonl(lines: Iterable[str | bytes]) -> Iterator[tuple[int, Event | FanOutEvent]]:
    """(line number, event) for each non-blank line of a JSON-lines file, streamed."""
    for number, raw in enumerate(lines, start=1):
        if len(raw) > MAX_LINE_BYTES:
            raise UserError(f"line {number} is longer than {MAX_LINE_BYTES} bytes")
        text = _line_text(raw, number)
        if not text.strip():
            continue
        try:
            event = _event_from_object(parse_json(text))
        except UserError as exc:
            raise UserError(f"line {number}: {exc}") from None
        yield number, event


def emit_jsonl(
    conn: psycopg.Connection,
    lines: Iterable[str | bytes],
    *,
    max_payload_bytes: int = MAX_PAYLOAD_BYTES,
) -> EmitCounts:
    """``emit_many`` over a JSON-lines file (``media-hooks emit --file``); errors name the line.

    Each line is an object with destination_id, asset_id, event_type, payload and optionally
    delivery_id; or, to fan out, with event_id, asset_id, event_type and payload. Pass a file opened in binary mode to have decoding errors name their line; it is
    read in lines of at most MAX_LINE_BYTES (``bounded_lines``).
    """
    if hasattr(lines, "readline"):
        lines = bounded_lines(lines)  # type: ignore[arg-type]
    return _emit_numbered(conn, parse_jsonl(lines), "line", max_payload_bytes)
