"""One whole delivery run without Dagster: sweep, then deliver each due destination.

Each destination with due work gets a thread that claims its deliveries a page at a time as it
sends them (media_hooks.engine.delivery.deliver_destinations): memory stays bounded by the page size
whatever the backlog, and no destination waits behind another's. The Dagster job runs the same
steps as ops; this is the same protocol for a host timer, a script, a benchmark or a test
("keep cron replaceable").
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass

from psycopg_pool import ConnectionPool

from media_hooks.core.config import Settings
from media_hooks.engine.counts import DeliveryCounts, DestinationResult, tally
from media_hooks.engine.delivery import deliver_destinations
from media_hooks.outbox.claims import ClaimFigures, due_destinations
from media_hooks.outbox.cohort import Cohort
from media_hooks.outbox.maintenance import sweeps
from media_hooks.store import db

DEFAULT_CLAIM_PAGE_SIZE = 250


@dataclass(frozen=True)
class RunReport:
    run_id: str
    sweeps: sweeps.SweepFigures
    claim: ClaimFigures
    totals: DeliveryCounts
    by_destination: dict[str, DeliveryCounts]


def claim_figures(results: list[DestinationResult], page_size: int) -> ClaimFigures:
    """What a run's destinations claimed, in all and each."""
    claimed = Counter({r.destination_id: r.claimed for r in results if r.claimed})
    return ClaimFigures(
        claimed=claimed.total(),
        pages=sum(-(-r.claimed // page_size) for r in results),
        by_destination=dict(claimed),
    )


def deliver_due(
    pool: ConnectionPool,
    run_id: str,
    settings: Settings,
    cohort: Cohort | None = None,
    *,
    page_size: int = DEFAULT_CLAIM_PAGE_SIZE,
    max_rows: int | None = None,
    stop: threading.Event | None = None,
    **delivery_options,
) -> RunReport:
    cohort = cohort or Cohort()
    with db.borrow(pool, db.Role.SWEEPS, settings) as conn:
        swept = sweeps.run_sweeps(conn, settings)
    with db.borrow(pool, db.Role.RECONCILER, settings) as conn:
        destination_ids = due_destinations(conn, cohort)
    results = list(
        deliver_destinations(
            pool,
            run_id,
            destination_ids,
            settings,
            cohort=cohort,
            claim_page_size=page_size,
            max_rows=max_rows,
            stop=stop,
            **delivery_options,
        )
    )
    totals, by_destination = tally((r.destination_id, r.counts) for r in results)
    return RunReport(run_id, swept, claim_figures(results, page_size), totals, by_destination)
