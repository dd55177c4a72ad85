"""``media-hooks requeue``: make a cohort due now, same delivery_id, fresh budget, audited."""

from __future__ import annotations

import argparse
import getpass
from datetime import UTC, datetime

from media_hooks.cli.output import print_json, table
from media_hooks.core.config import Settings
from media_hooks.core.errors import UserError
from media_hooks.core.identifiers import validate_identifier
from media_hooks.outbox.cohort import Cohort
from media_hooks.outbox.maintenance.requeue import RequeueResult, requeue
from media_hooks.store import db


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "requeue",
        help="make matching deliveries due now (same delivery_id, fresh retry budget, audited)",
    )
    parser.add_argument(
        "--destination",
        action="append",
        default=[],
        metavar="ID",
        help="only this destination's deliveries (repeatable; default: every destination)",
    )
    parser.add_argument(
        "--event-type",
        action="append",
        default=[],
        metavar="T",
        help="only deliveries of this event type (repeatable; default: every type)",
    )
    parser.add_argument(
        "--state",
        action="append",
        default=[],
        metavar="STATE",
        help="states to requeue (repeatable; default: dead)",
    )
    parser.add_argument("--since", metavar="ISO", help="only deliveries recorded at or after")
    parser.add_argument("--until", metavar="ISO", help="only deliveries recorded before")
    parser.add_argument("--reason", required=True, metavar="TEXT", help="kept in the audit trail")
    parser.add_argument(
        "--dry-run", action="store_true", help="show what would move; change nothing"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.set_defaults(handler=run_requeue)


def parse_instant(option: str, value: str | None) -> datetime | None:
    """An ISO 8601 time; without an offset it is taken as UTC."""
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise UserError(
            f"{option} must be an ISO 8601 time such as 2024-05-01T12:00:00+00:00, got {value!r}"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed


def cohort_from(args: argparse.Namespace) -> Cohort:
    for destination in args.destination:
        validate_identifier(destination, "--destination")
    since = parse_instant("--since", args.since)
    until = parse_instant("--until", args.until)
    if since and until and since >= until:
        raise UserError("--since must be before --until")
    return Cohort(
        destination_ids=tuple(args.destination),
        event_types=tuple(args.event_type),
        created_after=since,
        created_before=until,
    )


def _document(result: RequeueResult, dry_run: bool) -> dict:
    return {
        "dry_run": dry_run,
        "matched": result.matched,
        "moved": result.moved,
        "by_state": result.by_state,
        "requeue_id": result.requeue_id,
        "sample": result.sample,
        "in_flight": result.in_flight,
    }


def _print(result: RequeueResult, dry_run: bool) -> None:
    if dry_run:
        print(f"dry run: {result.matched} delivery(ies) would be requeued; nothing changed")
    elif result.moved:
        print(f"requeued {result.moved} delivery(ies) (audit: requeue {result.requeue_id})")
    else:
        print("nothing matched; nothing changed")
    if result.in_flight:
        print(
            f"{result.in_flight} in flight, left alone (a request may be on the wire; "
            "requeue them once their outcome or lease expiry is recorded)"
        )
    if result.by_state:
        print(table(["from state", "deliveries"], sorted(result.by_state.items())))
    if result.sample:
        print(f"for example: {', '.join(result.sample)}")
        print(f"see one with: media-hooks inspect {result.sample[0]}")


def run_requeue(args: argparse.Namespace) -> int:
    cohort = cohort_from(args)
    states = tuple(args.state) or ("dead",)
    url = db.ready_url(Settings.from_env())
    with db.connect(url, autocommit=True) as conn:
        result = requeue(
            conn,
            cohort,
            states=states,
            reason=args.reason,
            requested_by=getpass.getuser(),
            dry_run=args.dry_run,
        )
    if args.json:
        print_json(_document(result, args.dry_run))
    else:
        _print(result, args.dry_run)
    return 0
