"""``media-hooks emit``: record one delivery, or a JSON-lines file of them (all or nothing)."""

from __future__ import annotations

import argparse
import dataclasses
import itertools
from collections.abc import Iterator

import psycopg

from media_hooks.cli.output import print_json
from media_hooks.core.errors import RuntimeFailure, UserError, first_line
from media_hooks.outbox import emit
from media_hooks.store import db

DESCRIPTION = """\
Records one pending delivery (--destination, --asset-id, --event-type, --payload); or one event
for every destination subscribed to its type (--event-id instead of --destination: one delivery
each, its id derived from the event id and the destination); or, with --file, every line of a
JSON-lines file: one object a line with destination_id, asset_id, event_type, payload and
optionally delivery_id, or with event_id, asset_id, event_type and payload. A file is all or
nothing: one bad line writes nothing and the error names it. Without --delivery-id the id is
derived from the event, so the same event emitted twice is recorded once; a delivery_id or
event_id already recorded records nothing new. An event that matches no destination is recorded
and reported ("matched no destination")."""

_SINGLE_OPTIONS = {
    "destination": "--destination",
    "asset_id": "--asset-id",
    "event_type": "--event-type",
    "payload": "--payload",
}


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("emit", help="record pending deliveries", description=DESCRIPTION)
    parser.add_argument("--destination", metavar="ID", help="destination id")
    parser.add_argument("--asset-id", metavar="A", help="the asset the event is about")
    parser.add_argument("--event-type", metavar="T", help="the event type, e.g. transcode.done")
    parser.add_argument("--payload", metavar="JSON", help="the event's data, a JSON object")
    parser.add_argument("--delivery-id", metavar="K", help="idempotency key (default: derived)")
    parser.add_argument(
        "--event-id",
        metavar="E",
        help="fan out: the event's id, instead of --destination (every subscribed destination)",
    )
    parser.add_argument("--file", metavar="PATH.jsonl", help="bulk: a JSON-lines file of events")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.set_defaults(handler=run_emit)


def _single_event(args: argparse.Namespace) -> emit.Event | emit.FanOutEvent:
    if args.event_id is not None:
        if args.destination is not None or args.delivery_id is not None:
            raise UserError(
                "--event-id goes to every subscribed destination: drop --destination and "
                "--delivery-id (or drop --event-id to record one destination's delivery)"
            )
        options = {name: flag for name, flag in _SINGLE_OPTIONS.items() if name != "destination"}
    else:
        options = _SINGLE_OPTIONS
    missing = [flag for name, flag in options.items() if getattr(args, name) is None]
    if missing:
        raise UserError(f"emit needs {', '.join(missing)} (or --file PATH.jsonl)")
    try:
        payload = emit.parse_json(args.payload)
    except UserError as exc:
        raise UserError(f"--payload is {exc}") from None
    if args.event_id is not None:
        return emit.FanOutEvent(
            event_id=args.event_id,
            asset_id=args.asset_id,
            event_type=args.event_type,
            payload=payload,
        )
    return emit.Event(
        destination_id=args.destination,
        asset_id=args.asset_id,
        event_type=args.event_type,
        payload=payload,
        delivery_id=args.delivery_id,
    )


def run_emit(args: argparse.Namespace) -> int:
    if args.file is not None:
        return _run_file(args)
    event = _single_event(args)
    if isinstance(event, emit.FanOutEvent):
        return _run_fan_out(args, event)
    with db.connect(db.ready_url(), role=db.Role.PRODUCER) as conn:
        result = emit.emit(conn, event)
    if args.json:
        print_json({"delivery_id": result.delivery_id, "inserted": result.inserted})
    elif result.inserted:
        print(f"recorded {result.delivery_id}")
    else:
        print(f"already present {result.delivery_id} (nothing recorded)")
    return 0


def _run_fan_out(args: argparse.Namespace, event: emit.FanOutEvent) -> int:
    with db.connect(db.ready_url(), role=db.Role.PRODUCER) as conn:
        result = emit.emit_event(conn, event)
    if args.json:
        print_json(
            {
                "event_id": result.event_id,
                "recorded": result.recorded,
                "destinations": list(result.destination_ids),
                "delivery_ids": list(result.delivery_ids),
                "inserted": result.inserted,
            }
        )
    elif not result.recorded:
        print(f"already present event {result.event_id} (nothing recorded)")
    elif not result.destination_ids:
        print(
            f"recorded event {result.event_id}: matched no destination (no destination is "
            f"subscribed to {event.event_type!r}; see `media-hooks destination list`)"
        )
    else:
        print(
            f"recorded event {result.event_id}: {result.inserted} delivery(ies), to "
            + ", ".join(
                f"{d} ({k})"
                for d, k in zip(result.destination_ids, result.delivery_ids, strict=True)
            )
        )
    return 0


def _run_file(args: argparse.Namespace) -> int:
    given = [flag for name, flag in _SINGLE_OPTIONS.items() if getattr(args, name) is not None]
    given += [
        flag
        for flag, value in (("--delivery-id", args.delivery_id), ("--event-id", args.event_id))
        if value is not None
    ]
    if given:
        raise UserError("--file takes the events from the file: drop " + ", ".join(given))
    try:
        source = open(args.file, "rb")  # noqa: SIM115 - closed below, after the transaction
    except OSError as exc:
        raise UserError(f"cannot read {args.file}: {exc.strerror}") from None
    with source:
        lines = emit.bounded_lines(source)
        # The file's start is read and checked before the database is touched: an empty file
        # or a bad first event costs no server start.
        head = _through_first_event(lines, args.file)
        url = db.ready_url()
        try:
            with db.connect(url, role=db.Role.PRODUCER) as conn:
                counts = emit.emit_jsonl(conn, itertools.chain(head, lines))
        except psycopg.OperationalError as exc:
            raise RuntimeFailure(
                f"the database connection failed while recording {args.file} "
                f"({first_line(exc)}); a file is recorded all or nothing: run the same "
                "command again (deliveries already recorded count as already present)"
            ) from None
    if args.json:
        document = dataclasses.asdict(counts)
        document["unmatched_sample"] = list(counts.unmatched_sample)
        print_json(document)
        return 0
    print(f"inserted {counts.inserted}, already present {counts.already_present}")
    if counts.events_recorded or counts.events_already_present:
        print(
            f"events: recorded {counts.events_recorded}, already present "
            f"{counts.events_already_present}"
        )
    if counts.events_unmatched:
        print(
            f"{counts.events_unmatched} event(s) matched no destination: "
            + ", ".join(counts.unmatched_sample)
            + (", ..." if counts.events_unmatched > len(counts.unmatched_sample) else "")
        )
    return 0


def _through_first_event(lines: Iterator[bytes], path: str) -> list[bytes]:
    """The file's lines up to its first event, that event checked; UserError if it has none."""
    head: list[bytes] = []
    for line in lines:
        head.append(line)
        if line.strip():
            list(emit.parse_jsonl(head))  # the error names the line
            return head
    what = "is empty" if not head else "has only blank lines"
    raise UserError(f"{path} {what}: no events to record")
