"""``media-hooks discard``: close dead deliveries unsent (an ordered queue's dead head)."""

from __future__ import annotations

import argparse
import getpass

from media_hooks.cli.output import print_json
from media_hooks.core.errors import UserError
from media_hooks.core.identifiers import validate_identifier
from media_hooks.outbox.maintenance.discard import discard
from media_hooks.store import db

DESCRIPTION = """\
Closes dead deliveries unsent: each stays dead, recorded as discarded (who and why), and is no
longer a dead letter. On a destination with --ordering asset a dead delivery holds the later
deliveries of its asset ("held behind dead delivery X"): discarding it lets them go, in order;
`media-hooks requeue` instead sends it again first. A delivery that is not dead is left alone
and named."""


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "discard",
        help="close dead deliveries unsent (lets an ordered queue go on)",
        description=DESCRIPTION,
    )
    parser.add_argument("delivery_ids", nargs="+", metavar="DELIVERY_ID", help="dead deliveries")
    parser.add_argument("--reason", required=True, metavar="TEXT", help="why (kept with each)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.set_defaults(handler=run_discard)


def run_discard(args: argparse.Namespace) -> int:
    # Checked before the database is touched: a mistake costs no server start.
    for delivery_id in args.delivery_ids:
        validate_identifier(delivery_id, "delivery id")
    if not args.reason.strip():
        raise UserError("discarding needs a reason (--reason TEXT)")
    with db.connect(db.ready_url(), role=db.Role.OPERATOR) as conn:
        result = discard(
            conn, args.delivery_ids, reason=args.reason, requested_by=getpass.getuser()
        )
    if args.json:
        print_json({"discarded": list(result.discarded), "not_discarded": result.refused})
        return 0
    print(f"discarded {len(result.discarded)}: {', '.join(result.discarded) or 'none'}")
    for delivery_id, why in sorted(result.refused.items()):
        print(f"not discarded {delivery_id}: it is {why} (only a dead delivery is discarded)")
    return 0
