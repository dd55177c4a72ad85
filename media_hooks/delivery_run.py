"""One whole delivery run without Dagster: sweep, claim, plan, deliver, report.

The Dagster job runs the same steps as separate ops; this is the same protocol for a host
timer, a script, a benchmark or a test ("keep cron replaceable").
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg_pool import ConnectionPool

from media_hooks import db, sweeps
from media_hooks.cohort import Cohort
from media_hooks.config import Settings
from media_hooks.delivery import DeliveryCounts, deliver_batches, tally
from media_hooks.reconciler import ClaimFigures, claim_due, plan_batches


@dataclass(frozen=True)
class RunReport:
    run_id: str
    sweeps: sweeps.SweepFigures
    claim: ClaimFigures
    totals: DeliveryCounts
    by_destination: dict[str, DeliveryCounts]


def deliver_due(
    pool: ConnectionPool,
    run_id: str,
    settings: Settings,
    cohort: Cohort | None = None,
    *,
    page_size: int = 250,
    max_rows: int | None = None,
    batch_size: int = 1000,
    **delivery_options,
) -> RunReport:
    with db.borrow(pool, db.Role.SWEEPS, settings) as conn:
        swept = sweeps.run_sweeps(conn, settings)
    with db.borrow(pool, db.Role.RECONCILER, settings) as conn:
        claim = claim_due(conn, run_id, cohort or Cohort(), page_size=page_size, max_rows=max_rows)
        batches = plan_batches(conn, run_id, batch_size=batch_size)
    totals, by_destination = tally(
        (batch.destination_id, counts)
        for batch, counts in deliver_batches(pool, run_id, batches, settings, **delivery_options)
    )
    return RunReport(run_id, swept, claim, totals, by_destination)
