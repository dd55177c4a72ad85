"""``media-hooks check``: is anything inconsistent? (media_hooks.observe.checks)

One line per invariant, ``holds`` or how many rows break it and up to five of their ids. Exit
status 0 when every invariant holds, 1 when one does not (as for an environment failure: a
monitor's alert fires on either), 2 for a usage mistake.
"""

from __future__ import annotations

import argparse

from media_hooks.cli.output import print_json, table
from media_hooks.core import numeric
from media_hooks.core.config import Settings
from media_hooks.observe import checks
from media_hooks.observe.inspection import format_time
from media_hooks.store import db


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "check",
        help="check the invariants on the live database (read-only); exit 1 if one is broken",
    )
    parser.add_argument(
        "--all",
        action="store_true",
        dest="full",
        help="read the whole history, not only the window (slower: whole-table scans)",
    )
    parser.add_argument(
        "--window",
        type=numeric.argument(numeric.SECONDS_UP_TO_30_DAYS),
        default=checks.DEFAULT_WINDOW_SECONDS,
        metavar="SECONDS",
        help="how far back the history checks read (default: %(default)g, a day)",
    )
    parser.add_argument(
        "--lease-margin",
        type=numeric.argument(
            numeric.Range(0, numeric.DAY_SECONDS, low_inclusive=True, unit="seconds")
        ),
        default=checks.DEFAULT_LEASE_MARGIN_SECONDS,
        metavar="SECONDS",
        help="how long past its end a lease may wait for a sweep (default: %(default)g)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.set_defaults(handler=run_check)


def render(report: checks.Report) -> str:
    rows = []
    for result in report.results:
        if result.holds:
            rows.append([result.name, "holds"])
        else:
            rows.append([result.name, f"{result.violations} broken: {', '.join(result.examples)}"])
    read = "all history" if report.since is None else f"history since {format_time(report.since)}"
    verdict = (
        "every invariant holds" if report.holds else f"{len(report.failed())} invariant(s) broken"
    )
    return (
        f"checked at {format_time(report.checked_at)} ({read})\n"
        f"{table(['invariant', 'result'], rows)}\n{verdict}"
    )


def run_check(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    url = db.ready_url(settings)
    options = checks.Options(
        full=args.full,
        window_seconds=args.window,
        lease_margin_seconds=args.lease_margin,
        hold_seconds=settings.lease_seconds,
    )
    with db.connect(url, autocommit=True, role=db.Role.OPERATOR, settings=settings) as conn:
        report = checks.run(conn, options)
    if args.json:
        print_json(report.as_dict())
    else:
        print(render(report))
    return 0 if report.holds else 1
