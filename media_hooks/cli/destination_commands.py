"""``media-hooks destination add | list | enable | disable``."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC
from typing import Any

from media_hooks.cli.output import print_json, table
from media_hooks.core.config import Settings
from media_hooks.outbox import destinations
from media_hooks.store import db
from media_hooks.store.secret_store import ENV as SECRET_KEY_ENV
from media_hooks.store.secret_store import SecretBox

ADD_DESCRIPTION = """\
Creates a destination, or updates the one with this ID. --url is always set. Every other option
given is set; options not given keep their defaults on a new destination and their current
values on an existing one. --secret replaces the whole list of secrets: repeat it to keep old and
new secrets active together during a rotation (every active secret signs each request).
Secrets at rest: with MEDIA_HOOKS_SECRET_KEY set they are stored encrypted under it; WITHOUT IT
THEY ARE STORED AS THEY ARE, readable by anyone who can read the webhook_destination table (see
`media-hooks secrets --help`). A URL whose host resolves to an address that is not globally
reachable (loopback, private, link-local, carrier-grade NAT, documentation, ... and their IPv6
embeddings) is refused, when added and again when a run connects, unless this destination is
added with --allow-private-url (a receiver on this machine: docs/first-webhook.md) or
MEDIA_HOOKS_ALLOW_PRIVATE_URLS=1 allows it for every destination."""


def register(commands: argparse._SubParsersAction) -> None:
    group = commands.add_parser("destination", help="where deliveries go, and their limits")
    sub = group.add_subparsers(dest="destination_command", required=True, parser_class=type(group))
    _register_add(sub)

    listing = sub.add_parser("list", help="destinations, their limits and state (never secrets)")
    listing.add_argument("--json", action="store_true", help="print one JSON document")
    listing.set_defaults(handler=run_list)

    enable = sub.add_parser("enable", help="turn a destination on")
    enable.add_argument("destination_id", metavar="ID", help="the destination's id")
    enable.set_defaults(handler=run_enable)

    disable = sub.add_parser("disable", help="turn a destination off; its deliveries wait")
    disable.add_argument("destination_id", metavar="ID", help="the destination's id")
    disable.add_argument("--reason", required=True, help="why it is off (shown by list)")
    disable.set_defaults(handler=run_disable)


def _register_add(sub: argparse._SubParsersAction) -> None:
    add = sub.add_parser("add", help="create or update a destination", description=ADD_DESCRIPTION)
    add.add_argument(
        "destination_id", metavar="ID", help="the destination's id (letters, digits, _ - :)"
    )
    add.add_argument("--url", required=True, help="http(s) URL the deliveries are POSTed to")
    add.add_argument(
        "--secret",
        action="append",
        dest="secrets",
        metavar="whsec_…",
        help="signing secret, whsec_<base64>; repeatable (rotation); replaces the list; stored "
        "encrypted under MEDIA_HOOKS_SECRET_KEY, or as it is when that is unset",
    )
    add.add_argument(
        "--rate",
        type=float,
        dest="rate_per_second",
        metavar="PER_SECOND",
        help="request starts per second (default 10)",
    )
    add.add_argument("--burst", type=int, metavar="N", help="starts allowed at once (default 10)")
    add.add_argument(
        "--max-in-flight", type=int, metavar="N", help="requests in flight at once (default 4)"
    )
    add.add_argument(
        "--timeout",
        type=float,
        dest="timeout_seconds",
        metavar="SECONDS",
        help="request timeout, below the lease minus 5 s (default 10)",
    )
    add.add_argument(
        "--max-attempts",
        type=int,
        metavar="N",
        help="attempts before a delivery is dead (default 20)",
    )
    add.add_argument(
        "--backoff-base",
        type=float,
        dest="backoff_base_seconds",
        metavar="SECONDS",
        help="first retry delay (default 5)",
    )
    add.add_argument(
        "--backoff-cap",
        type=float,
        dest="backoff_cap_seconds",
        metavar="SECONDS",
        help="longest retry delay (default 28800)",
    )
    add.add_argument(
        "--event-type",
        action="append",
        dest="event_types",
        metavar="T",
        help="subscribe to an event type: an exact name or `prefix.*`; repeatable; replaces the "
        "list; '*' (or never subscribing) means every type",
    )
    add.add_argument(
        "--ordering",
        choices=destinations.SCOPES,
        help="asset: send an asset's deliveries strictly in emission order (default none)",
    )
    add.add_argument(
        "--coalesce",
        choices=destinations.SCOPES,
        dest="coalescing",
        help="asset: close an asset's older unsent deliveries of a type as superseded when a "
        "newer one exists (default none)",
    )
    add.add_argument(
        "--allow-private-url",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="let this destination (only) reach addresses that are not globally reachable, such "
        "as a receiver on 127.0.0.1, in every process that sends to it; shown by `list` "
        "(default: refused, unless MEDIA_HOOKS_ALLOW_PRIVATE_URLS=1)",
    )
    add.add_argument("--json", action="store_true", help="print one JSON document")
    add.set_defaults(handler=run_add)


def _spec(args: argparse.Namespace) -> destinations.DestinationSpec:
    return destinations.DestinationSpec(
        destination_id=args.destination_id,
        url=args.url,
        secrets=None if args.secrets is None else tuple(args.secrets),
        rate_per_second=args.rate_per_second,
        burst=args.burst,
        max_in_flight=args.max_in_flight,
        timeout_seconds=args.timeout_seconds,
        max_attempts=args.max_attempts,
        backoff_base_seconds=args.backoff_base_seconds,
        backoff_cap_seconds=args.backoff_cap_seconds,
        event_types=None if args.event_types is None else tuple(args.event_types),
        ordering=args.ordering,
        coalescing=args.coalescing,
        allow_private_url=args.allow_private_url,
    )


def run_add(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    spec = _spec(args)
    # Validate before touching the database, so a mistake costs no server start (the SSRF
    # guard too, unless what the destination has stored decides it).
    destinations.validate_spec(spec, settings, stored_allows=spec.allow_private_url is None)
    with db.connect(db.ready_url(settings)) as conn:
        created = destinations.upsert_destination(conn, spec, settings)
    if spec.secrets and not SecretBox.from_env().encrypting:
        print(
            f"media-hooks: note: {SECRET_KEY_ENV} is not set, so the signing secret is stored as "
            "it is (`media-hooks secrets --help`)",
            file=sys.stderr,
        )
    if args.json:
        print_json({"destination_id": spec.destination_id, "created": created})
    else:
        print(f"{'created' if created else 'updated'} destination {spec.destination_id}")
    return 0


def _state(row: dict[str, Any]) -> str:
    if row["state"] == "disabled":
        return f"disabled ({row['disabled_reason'] or 'no reason given'})"
    if row["state"] == "paused":
        until = row["paused_until"].astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return f"paused until {until} ({row['paused_reason'] or 'no reason given'})"
    return "enabled"


def _per_asset(row: dict[str, Any]) -> str:
    rules = []
    if row["ordering"] == "asset":
        rules.append("ordered")
    if row["coalescing"] == "asset":
        rules.append("latest wins")
    return ", ".join(rules) or "-"


def _number(value: float) -> str:
    return f"{value:g}"


def run_list(args: argparse.Namespace) -> int:
    with db.connect(db.ready_url()) as conn:
        rows = destinations.list_destinations(conn)
    if args.json:
        print_json({"destinations": rows})
        return 0
    if not rows:
        print("no destinations (add one with `media-hooks destination add`)")
        return 0
    headers = ["id", "url", "rate/burst", "in-flight", "timeout", "attempts", "secrets"]
    headers += ["event types", "per asset", "state"]
    print(
        table(
            headers,
            [
                [
                    r["destination_id"],
                    r["url"] + (" (private address allowed)" if r["allow_private_url"] else ""),
                    f"{_number(r['rate_per_second'])}/s burst {r['burst']}",
                    r["max_in_flight"],
                    f"{_number(r['timeout_seconds'])} s",
                    r["max_attempts"],
                    r["secret_count"],
                    ", ".join(r["event_types"]) or "every type",
                    _per_asset(r),
                    _state(r),
                ]
                for r in rows
            ],
        )
    )
    return 0


def run_enable(args: argparse.Namespace) -> int:
    with db.connect(db.ready_url()) as conn:
        destinations.enable_destination(conn, args.destination_id)
    print(f"enabled destination {args.destination_id}")
    return 0


def run_disable(args: argparse.Namespace) -> int:
    with db.connect(db.ready_url()) as conn:
        destinations.disable_destination(conn, args.destination_id, args.reason)
    print(f"disabled destination {args.destination_id}: {args.reason.strip()}")
    return 0
