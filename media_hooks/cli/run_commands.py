"""``media-hooks run``: the Dagster delivery job, from the command line, waited for."""

from __future__ import annotations

import argparse
import os
import time

from media_hooks.cli.output import print_json, table
from media_hooks.core import numeric
from media_hooks.core.config import RUNTIMES, Settings, run_runtime, shards_from_env
from media_hooks.core.errors import RuntimeFailure, first_line
from media_hooks.observe import figures, health
from media_hooks.store import db
from media_hooks.store.secret_store import SecretBox

SUMMARY_COLUMNS = ("claimed", "succeeded", "retried", "dead", "ambiguous")
# One claim is one transaction: a page stays small however large the backlog (invariant 7).
PAGE_SIZE = numeric.Range(1, 10_000, low_inclusive=True, integer=True)
MAX_SECONDS = numeric.Range(0, 365 * numeric.DAY_SECONDS, unit="seconds")
INTERRUPTED = "interrupted (Ctrl-C), canceled"


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
        "--shards",
        type=numeric.argument(numeric.COUNT),
        metavar="N",
        help="delivery steps the destinations are split into (default: MEDIA_HOOKS_SHARDS, else "
        "one per Celery worker process when the run uses the celery executor, else one)",
    )
    run.add_argument(
        "--runtime",
        choices=RUNTIMES,
        help="which program delivers: python (the engine) or node (the Node.js worker, "
        "launched by the delivery step through Dagster Pipes; `npm ci --prefix node` first) "
        "(default: MEDIA_HOOKS_RUNTIME, else python)",
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
        help="bound the command's wall time: at S seconds the run in progress is stopped "
        "(its unsent deliveries become due again) and no other starts",
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
        "shards": args.shards,
        "runtime": args.runtime,
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


def _released(done, error: BaseException | None) -> str:
    if done is not None:
        return f"{done.released} delivery(ies) due again"
    return (
        f"the database is unreachable ({first_line(error)}), so its deliveries wait: the next "
        "`media-hooks run` (or the lag sensor) releases them"
    )


class _Report:
    """What the command prints: a line per event for people, one document for programs."""

    def __init__(self, as_json: bool, log_path) -> None:
        self.as_json = as_json
        self.log_path = log_path
        self.document: dict = {
            "recovered": [],
            "runs": [],
            "stopped": None,
            "failed": None,
            "attention": [],
        }

    def recovered(self, done: list) -> None:
        for run in done:
            self.document["recovered"].append(
                {"run_id": run.run_id, "reason": run.marked_failed, "released": run.released}
            )
            if not self.as_json:
                print(f"recovered {run.describe()}")

    def run(self, summary: dict) -> None:
        self.document["runs"].append(summary)
        if not self.as_json:
            _print_run(summary)

    def stopped(self, run_id: str | None, reason: str, settled, error) -> None:
        released = settled.released if settled is not None else None
        self.document["stopped"] = {"run_id": run_id, "reason": reason, "released": released}
        if not self.as_json:
            print(f"run {run_id or '?'} stopped: {reason}; {_released(settled, error)}")

    def failed(self, run_id: str | None, reason: str, settled, error) -> RuntimeFailure:
        released = settled.released if settled is not None else None
        self.document["failed"] = {"run_id": run_id, "reason": reason, "released": released}
        self.finish()
        what = f"delivery run {run_id}" if run_id else "a delivery run"
        return RuntimeFailure(
            f"{what} failed: {reason}; {_released(settled, error)} (details: the Dagster UI, "
            f"`media-hooks dev`, and {self.log_path})"
        )

    def attention(self, lines: list[str]) -> None:
        """What no run can fix (a destination disabled), so that a run that sent nothing
        never ends quietly."""
        self.document["attention"] = lines
        if not self.as_json:
            for line in lines:
                print(f"attention: {line} (`media-hooks destination list`)")

    def finish(self) -> None:
        if self.as_json:
            print_json(self.document)


def _mine(supervisor, reason: str):
    """Settles the runs this process was executing; the first one's id and what it released."""
    settled, error = supervisor.settle_mine(reason)
    first = settled[0] if settled else None
    return (first.run_id if first else None), first, error


def run_deliveries(args: argparse.Namespace) -> int:
    started = time.monotonic()  # --max-seconds counts from here
    settings = Settings.from_env()
    SecretBox.from_env()  # a malformed key is refused here, not by every delivery step
    # So is a malformed shard count, before a run starts.
    shards_from_env()
    # And a runtime that cannot serve the run (a bad MEDIA_HOOKS_RUNTIME, node with filters).
    run_runtime(args.runtime, "--runtime", filtered=bool(args.event_type or args.asset_id))
    url = db.ready_url(settings)
    # Dagster loads only when there is work to run: usage errors stay fast.
    from media_hooks.cli.supervision import DagsterConsole, RunInterrupted, RunSupervisor

    # Step processes then reuse this ready database instead of resolving the default again.
    os.environ["MEDIA_HOOKS_DATABASE_URL"] = url
    console = DagsterConsole(settings.home / "logs" / "run.log")
    report = _Report(args.json, console.path)
    supervisor = RunSupervisor(
        url, settings, console, max_seconds=args.max_seconds, started=started
    )
    config = _claim_config(args)
    with supervisor.watchdog as watchdog:
        try:
            supervisor.open()
            report.recovered(supervisor.recover())
        except RuntimeFailure:
            raise
        except Exception as exc:  # Dagster's storage unreachable, most likely
            console.log_error()
            raise RuntimeFailure(
                f"cannot reach Dagster's storage: {first_line(exc)} (details in {console.path})"
            ) from None
        while True:
            try:
                run = supervisor.execute(config)
            except RunInterrupted as interrupted:
                # The run ended canceled; its rows are released before the command stops.
                settled, error = supervisor.settle(interrupted.run_id, INTERRUPTED)
                report.stopped(interrupted.run_id, INTERRUPTED, settled, error)
                report.finish()
                raise
            except KeyboardInterrupt:
                if not watchdog.expired:
                    _mine(supervisor, INTERRUPTED)
                    raise
                run_id, settled, error = _mine(supervisor, supervisor.stop_reason)
                report.stopped(run_id, supervisor.stop_reason, settled, error)
                break
            except Exception as exc:
                # Dagster itself failed (its storage unreachable...): the run is on record as
                # this process's, once the storage answers again.
                reason = first_line(exc)
                run_id, settled, error = _mine(supervisor, reason)
                raise report.failed(run_id, reason, settled, error) from None
            if not run.success:
                settled, error = supervisor.settle(run.run_id, run.failure or "failed")
                if watchdog.expired:
                    report.stopped(run.run_id, supervisor.stop_reason, settled, error)
                    break
                raise report.failed(run.run_id, run.failure, settled, error)
            report.run(run.summary.as_dict())
            if not args.until_idle or _idle(url, config) or watchdog.expired:
                break
    with db.connect(url, autocommit=True) as conn:
        report.attention(health.attention(figures.measure(conn, history=False), args.destination))
    report.finish()
    return 0
