"""``media-hooks emit``: record one delivery, or a JSON-lines file of them (all or nothing)."""

from __future__ import annotations

import argparse
import json

from media_hooks import db, emit
from media_hooks.cli.output import print_json
from media_hooks.errors import UserError

DESCRIPTION = """\
Records one pending delivery (--destination, --asset-id, --event-type, --payload) or, with
--file, every event of a JSON-lines file: one object a line with destination_id, asset_id,
event_type, payload and optionally delivery_id. A file is all or nothing: one bad line writes
nothing and the error names it. Without --delivery-id the id is derived from the event, so the
same event emitted twice is recorded once; a delivery_id already recorded records nothing new."""

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
    parser.add_argument("--file", metavar="PATH.jsonl", help="bulk: a JSON-lines file of events")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.set_defaults(handler=run_emit)


def _single_event(args: argparse.Namespace) -> emit.Event:
    missing = [flag for name, flag in _SINGLE_OPTIONS.items() if getattr(args, name) is None]
    if missing:
        raise UserError(f"emit needs {', '.join(missing)} (or --file PATH.jsonl)")
    try:
        payload = json.loads(args.payload)
    except json.JSONDecodeError as exc:
        raise UserError(f"--payload is not valid JSON ({exc.msg}, column {exc.colno})") from None
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
    with db.connect(db.ready_url(), role=db.Role.PRODUCER) as conn:
        result = emit.emit(conn, event)
    if args.json:
        print_json({"delivery_id": result.delivery_id, "inserted": result.inserted})
    elif result.inserted:
        print(f"recorded {result.delivery_id}")
    else:
        print(f"already present {result.delivery_id} (nothing recorded)")
    return 0


def _run_file(args: argparse.Namespace) -> int:
    given = [flag for name, flag in _SINGLE_OPTIONS.items() if getattr(args, name) is not None]
    if given or args.delivery_id is not None:
        raise UserError(
            "--file takes the events from the file: drop "
            + ", ".join(given + (["--delivery-id"] if args.delivery_id is not None else []))
        )
    try:
        source = open(args.file, "rb")  # noqa: SIM115 - closed below, after the transaction
    except OSError as exc:
        raise UserError(f"cannot read {args.file}: {exc.strerror}") from None
    with source, db.connect(db.ready_url(), role=db.Role.PRODUCER) as conn:
        counts = emit.emit_jsonl(conn, source)
    if args.json:
        print_json({"inserted": counts.inserted, "already_present": counts.already_present})
    else:
        print(f"inserted {counts.inserted}, already present {counts.already_present}")
    return 0
