"""``media-hooks run``: the Dagster delivery job, from the command line, waited for."""

from __future__ import annotations

import argparse
import os
import time

from media_hooks import db, figures, numeric, sweeps
from media_hooks.cli.output import print_json, table
from media_hooks.config import Settings
from media_hooks.errors import RuntimeFailure
from media_hooks.secret_store import SecretBox

SUMMARY_COLUMNS = ("claimed", "succeeded", "retried", "dead", "ambiguous")
# One claim is one transaction: a page stays small however large the backlog (invariant 7).
PAGE_SIZE = numeric.Range(1, 10_000, low_inclusive=True, integer=True)
MAX_SECONDS = numeric.Range(0, 365 * numeric.DAY_SECONDS, unit="seconds")


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
    run.add_argument(
        "--max-rows",
        type=numeric.argument(numeric.COUNT),
        metavar="N",
        help="most rows one run claims",
    )
    run.add_argument(
        "--page-size",
        type=numeric.argument(PAGE_SIZE),
        metavar="N",
        help="rows claimed per transaction (at most 10000)",
    )
    run.add_argument(
        "--until-idle",
        action="store_true",
        help="repeat runs until nothing in the cohort is due (or --max-seconds passes)",
    )
    run.add_argument(
        "--max-seconds",
        type=numeric.argument(MAX_SECONDS),
        metavar="S",
        help="stop repeating after S seconds (at most a year)",
    )
    run.add_argument("--json", action="store_true", help="print one JSON document")
    run.set_defaults(handler=run_deliveries)


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
    settings = Settings.from_env()
    SecretBox.from_env()  # a malformed key is refused here, not by every delivery step
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
