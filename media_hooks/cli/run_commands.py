"""``media-hooks run``: the Dagster delivery job, from the command line, waited for."""

from __future__ import annotations

import argparse
import os
import time

from media_hooks import db, figures, sweeps
from media_hooks.cli.output import print_json, table
from media_hooks.config import Settings
from media_hooks.errors import RuntimeFailure, UserError

SUMMARY_COLUMNS = ("claimed", "succeeded", "retried", "dead", "ambiguous")


def register(commands: argparse._SubParsersAction) -> None:
    run = commands.add_parser(
        "run",
        help="run the Dagster delivery job (the one the schedule launches) and wait for it",
    )
    run.add_argument(
        "--destination",
        action="append",
        default=[],
        metavar="ID",
        help="deliver only to this destination (repeatable; default: every destination)",
    )
    run.add_argument(
        "--event-type",
        action="append",
        default=[],
        metavar="T",
        help="deliver only events of this type (repeatable; default: every type)",
    )
    run.add_argument(
        "--asset-id",
        action="append",
        default=[],
        metavar="A",
        help="deliver only events about this asset (repeatable; default: every asset)",
    )
    run.add_argument("--max-rows", type=int, metavar="N", help="most rows one run claims")
    run.add_argument("--page-size", type=int, metavar="N", help="rows claimed per transaction")
    run.add_argument(
        "--until-idle",
        action="store_true",
        help="repeat runs until nothing in the cohort is due (or --max-seconds passes)",
    )
    run.add_argument("--max-seconds", type=float, metavar="S", help="stop repeating after S")
    run.add_argument("--json", action="store_true", help="print one JSON document")
    run.set_defaults(handler=run_deliveries)


def _check(args: argparse.Namespace) -> None:
    for name in ("max_rows", "page_size"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if args.max_seconds is not None and args.max_seconds <= 0:
        raise UserError(f"--max-seconds must be greater than 0, got {args.max_seconds}")


def _claim_config(args: argparse.Namespace) -> dict:
    config = {
        "destination_ids": args.destination,
        "event_types": args.event_type,
        "asset_ids": args.asset_id,
        "max_rows": args.max_rows,
        "page_size": args.page_size,
    }
    return {key: value for key, value in config.items() if value not in (None, [])}


def _print_run(document: dict) -> None:
    totals = ", ".join(f"{column} {document[column]}" for column in SUMMARY_COLUMNS)
    print(f"run {document['run_id']}: {totals}")
    rows = [
        [destination, *(counts[column] for column in SUMMARY_COLUMNS)]
        for destination, counts in document["destinations"].items()
    ]
    if rows:
        print(table(["destination", *SUMMARY_COLUMNS], rows))


def _idle(url: str, config: dict) -> bool:
    from media_hooks.orchestration.config import CohortConfig

    cohort_fields = ("destination_ids", "event_types", "asset_ids")
    cohort = CohortConfig(**{k: v for k, v in config.items() if k in cohort_fields}).cohort()
    with db.connect(url, autocommit=True) as conn:
        return not figures.cohort_due(conn, cohort)


def _release(url: str, run_id: str) -> int:
    """What the run-failure sensor does under the daemon, done at once for a CLI run."""
    with db.connect(url, autocommit=True) as conn:
        return sweeps.release_run(conn, run_id)


def run_deliveries(args: argparse.Namespace) -> int:
    _check(args)
    settings = Settings.from_env()
    url = db.ready_url(settings)
    # Dagster loads only when there is work to run: usage errors stay fast.
    from media_hooks.orchestration.instance import open_instance
    from media_hooks.orchestration.running import execute_delivery

    # Step processes then reuse this ready database instead of resolving the default again.
    os.environ["MEDIA_HOOKS_DATABASE_URL"] = url
    instance = open_instance(settings)
    config = _claim_config(args)
    deadline = time.monotonic() + args.max_seconds if args.max_seconds else None
    runs: list[dict] = []
    while True:
        run = execute_delivery(instance, config, tags={"media_hooks/trigger": "cli"})
        if not run.success:
            released = _release(url, run.run_id)
            raise RuntimeFailure(
                f"delivery run {run.run_id} failed ({released} delivery(ies) made due again); "
                "its steps' errors are in the Dagster UI (`media-hooks dev`)"
            )
        runs.append(run.summary.as_dict())
        if not args.json:
            _print_run(runs[-1])
        if not args.until_idle or _idle(url, config):
            break
        if deadline is not None and time.monotonic() >= deadline:
            break
    if args.json:
        print_json({"runs": runs})
    return 0
