"""``media-hooks inspect DELIVERY_ID``: one delivery's story in time order, and its verdict."""

from __future__ import annotations

import argparse

from media_hooks.cli.output import print_json, table
from media_hooks.core.config import Settings
from media_hooks.core.errors import UserError
from media_hooks.core.identifiers import validate_identifier
from media_hooks.observe.inspection import (
    EventStory,
    Story,
    find_event,
    format_time,
    inspect_delivery,
    inspect_event,
)
from media_hooks.store import db


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "inspect",
        help="a delivery's whole story (dispatches, attempts, requeues, runs) and its verdict; "
        "or an event's deliveries and their verdicts",
    )
    parser.add_argument(
        "delivery_id",
        metavar="DELIVERY_ID",
        help="the delivery's id, as emit or status print it; or an event id (emit --event-id)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.set_defaults(handler=run_inspect)


def render(story: Story) -> str:
    d = story.delivery
    head = (
        f"delivery {d['delivery_id']}: {d['event_type']} for asset {d['asset_id']} "
        f"to destination {d['destination_id']}\n"
        f"state {d['state']}, {d['attempt_count']} attempt(s), "
        f"{d['budget_used']} of {d['max_attempts']} of the retry budget used, "
        f"{d['dispatch_count']} dispatch(es)"
    )
    lines = table(["when", "what"], [[format_time(e.at), e.text] for e in story.events])
    runs = ", ".join(story.run_ids) if story.run_ids else "none yet"
    return f"{head}\n\n{lines}\n\nverdict: {story.verdict.text}\nDagster runs: {runs}"


def render_event(story: EventStory) -> str:
    e = story.event
    head = (
        f"event {e['event_id']}: {e['event_type']} for asset {e['asset_id']}, recorded "
        f"{format_time(e['created_at'])}"
    )
    if not e["destination_ids"]:
        return f"{head}\nmatched no destination (no subscription matched its type)"
    rows = [
        [s.delivery["destination_id"], s.delivery["delivery_id"], s.verdict.text]
        for s in story.deliveries
    ]
    return f"{head}\n\n{table(['destination', 'delivery', 'verdict'], rows)}"


def run_inspect(args: argparse.Namespace) -> int:
    validate_identifier(args.delivery_id, "delivery id")
    url = db.ready_url(Settings.from_env())
    with db.connect(url, autocommit=True) as conn:
        try:
            story = inspect_delivery(conn, args.delivery_id)
        except UserError:
            if find_event(conn, args.delivery_id) is None:
                raise UserError(
                    f"no delivery {args.delivery_id!r} (and no event by that id)"
                ) from None
            event_story = inspect_event(conn, args.delivery_id)
            if args.json:
                print_json(event_story.as_dict())
            else:
                print(render_event(event_story))
            return 0
    if args.json:
        print_json(story.as_dict())
    else:
        print(render(story))
    return 0
