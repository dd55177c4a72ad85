"""The delivery job's ops: claim → partition by destination → deliver (mapped) → summarize.

Each op is a few lines over the engine and reports what it did as output metadata, so the run
page answers "what did this run claim, send, retry, give up on, and where are its rows".
"""

import time
from dataclasses import dataclass, field

from dagster import (
    Backoff,
    DynamicOut,
    DynamicOutput,
    Failure,
    MetadataValue,
    OpExecutionContext,
    Out,
    Output,
    RetryPolicy,
    op,
)

from media_hooks import db, figures, reconciler, requeue, sweeps
from media_hooks.delivery import DeliveryCounts, OutcomesNotRecorded, deliver_batch, tally
from media_hooks.orchestration import recovery
from media_hooks.orchestration.config import DeliverConfig
from media_hooks.orchestration.metadata import (
    cohort_tags,
    counts_table,
    mapping_key,
    outcome_tags,
    rows_of_run,
)
from media_hooks.orchestration.resources import DeliverySettingsResource, PostgresResource

# The op pool (dagster.yaml, concurrency > pools) caps delivery steps across all runs.
DELIVERY_POOL = "media_hooks_delivery"
COUNT_COLUMNS = (
    "attempted",
    "succeeded",
    "retried",
    "rate_limited",
    "ambiguous",
    "dead",
    "skipped",
    "deferred",
    "guard_refused",
)


@dataclass(frozen=True)
class Claimed:
    """What claim_due_pages hands on: the run's id (its outbox rows) and the batch size."""

    run_id: str
    claimed: int
    batch_size: int


@dataclass(frozen=True)
class BatchResult:
    destination_id: str
    mapping_key: str
    size: int
    counts: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


def _requeue_dead(context: OpExecutionContext, conn, config: DeliverConfig) -> int:
    result = requeue.requeue(
        conn,
        config.cohort(),
        states=("dead",),
        reason=config.requeue_reason,
        requested_by=f"dagster run {context.run_id}",
    )
    context.log.info(f"requeued {result.moved} dead letter(s) (requeue {result.requeue_id})")
    return result.moved


def _recover_dead_runs(context: OpExecutionContext, conn, settings) -> list[recovery.Recovered]:
    recovered = recovery.recover(
        context.instance,
        conn,
        context.job_name,
        window_seconds=recovery.window_seconds(settings.enqueue_timeout_seconds),
    )
    for done in recovered:
        context.log.warning(f"recovered {done.describe()}")
    return recovered


@op(
    description="Recovers dead delivery runs (marks them failed, frees their pool slots, "
    "releases their rows), sweeps expired leases and stale enqueues, optionally requeues the "
    "cohort's dead letters, then claims due pages into the outbox under this run's id.",
    out=Out(Claimed),
)
def claim_due_pages(
    context: OpExecutionContext,
    config: DeliverConfig,
    postgres: PostgresResource,
    delivery_settings: DeliverySettingsResource,
) -> Output[Claimed]:
    config.check()
    cohort = config.cohort()
    context.instance.add_run_tags(context.run_id, cohort_tags(cohort))
    started = time.monotonic()
    settings = delivery_settings.settings()
    with postgres.connection(db.Role.RECONCILER) as conn:
        before = figures.measure(conn)
        recovered = _recover_dead_runs(context, conn, settings)
        swept = sweeps.run_sweeps(conn, settings)
        requeued = _requeue_dead(context, conn, config) if config.include_dead else 0
        claim = reconciler.claim_due(
            conn,
            context.run_id,
            cohort,
            page_size=config.page_size or delivery_settings.default_page_size,
            max_rows=config.max_rows or delivery_settings.default_max_rows,
        )
    claimed = Claimed(
        run_id=context.run_id,
        claimed=claim.claimed,
        batch_size=config.batch_size or delivery_settings.default_batch_size,
    )
    return Output(
        claimed,
        metadata={
            "claimed": claim.claimed,
            "pages": claim.pages,
            "per_destination": MetadataValue.md(
                counts_table(
                    {d: {"claimed": n} for d, n in claim.by_destination.items()}, ["claimed"]
                )
            ),
            "oldest_due_age_seconds": MetadataValue.float(before.oldest_due_age_seconds or 0.0),
            "relay_lag_seconds": MetadataValue.float(before.relay_lag_seconds or 0.0),
            "recovered_runs": MetadataValue.md(
                "\n".join(f"- {done.describe()}" for done in recovered) or "none"
            ),
            "swept_expired_leases": swept.expired_leases,
            "swept_stale_enqueues": swept.stale_enqueues,
            "breaker_disabled": swept.breaker_disabled,
            "superseded": swept.superseded,
            "parked_held": swept.parked,
            "requeued_dead": requeued,
            "cohort": MetadataValue.json(cohort.describe()),
            "seconds": MetadataValue.float(time.monotonic() - started),
        },
    )


@op(
    description="One dynamic output per destination batch (capped in size), keyed by a "
    "readable mapping key; the real destination id travels in the batch.",
    out=DynamicOut(reconciler.Batch),
)
def partition_by_destination(
    context: OpExecutionContext, claimed: Claimed, postgres: PostgresResource
):
    with postgres.connection() as conn:
        batches = reconciler.plan_batches(conn, claimed.run_id, batch_size=claimed.batch_size)
    numbers: dict[str, int] = {}
    for batch in batches:
        numbers[batch.destination_id] = numbers.get(batch.destination_id, 0) + 1
        key = mapping_key(batch.destination_id, numbers[batch.destination_id])
        yield DynamicOutput(
            batch,
            mapping_key=key,
            metadata={"destination_id": batch.destination_id, "size": batch.size},
        )
    context.log.info(f"{len(batches)} batch(es) for {len(numbers)} destination(s)")


@op(
    description="Delivers one destination batch through the engine, honouring the destination's "
    "global limits. A destination's failures are counted, not raised; only infrastructure "
    "faults fail the step (and Dagster retries those; webhook retries are the table's), except "
    "outcomes the database refused to record: that failure is final, never hidden by a retry.",
    pool=DELIVERY_POOL,
    retry_policy=RetryPolicy(max_retries=2, delay=2, backoff=Backoff.EXPONENTIAL),
    out=Out(BatchResult),
)
def deliver_destination_batch(
    context: OpExecutionContext,
    batch: reconciler.Batch,
    postgres: PostgresResource,
    delivery_settings: DeliverySettingsResource,
) -> Output[BatchResult]:
    started = time.monotonic()
    try:
        counts = deliver_batch(postgres.pool, context.run_id, batch, delivery_settings.settings())
    except OutcomesNotRecorded as exc:
        # A step retry would find these deliveries leased, skip them and end green, leaving
        # their outcomes to lease expiry: the failure must show.
        raise Failure(
            description=str(exc),
            metadata={"destination_id": batch.destination_id, "deliveries": exc.delivery_ids},
            allow_retries=False,
        ) from exc
    seconds = time.monotonic() - started
    result = BatchResult(
        destination_id=batch.destination_id,
        mapping_key=context.get_mapping_key() or "",
        size=batch.size,
        counts=counts.as_dict(),
        seconds=seconds,
    )
    return Output(
        result,
        metadata={
            "destination_id": batch.destination_id,
            "batch_size": batch.size,
            **{name: counts.as_dict().get(name, 0) for name in COUNT_COLUMNS},
            "seconds": MetadataValue.float(seconds),
            "deliveries_per_second": MetadataValue.float(
                counts.attempted / seconds if seconds else 0.0
            ),
        },
    )


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    claimed: int
    totals: dict[str, int]
    per_destination: dict[str, dict[str, int]]

    def as_dict(self) -> dict:
        """The CONTRACT.md shape of ``media-hooks run --json``, per run."""
        keys = ("succeeded", "retried", "dead", "ambiguous")
        return {
            "run_id": self.run_id,
            "claimed": self.claimed,
            **{k: self.totals.get(k, 0) for k in keys},
            "destinations": {
                d: {"claimed": c.get("claimed", 0), **{k: c.get(k, 0) for k in keys}}
                for d, c in sorted(self.per_destination.items())
            },
        }


def summarize(run_id: str, claimed: Claimed, results: list[BatchResult]) -> RunSummary:
    totals, per_destination = tally((r.destination_id, DeliveryCounts(**r.counts)) for r in results)
    sizes: dict[str, int] = {}
    for result in results:
        sizes[result.destination_id] = sizes.get(result.destination_id, 0) + result.size
    return RunSummary(
        run_id=run_id,
        claimed=claimed.claimed,
        totals=totals.as_dict(),
        per_destination={
            d: {"claimed": sizes[d], **c.as_dict()} for d, c in per_destination.items()
        },
    )


@op(
    description="Fans in: totals and per-destination counts, how to list this run's rows, and "
    "the run's outcome as tags for the run list (media_hooks/outcome, media_hooks/delivered)."
)
def summarize_run(
    context: OpExecutionContext, claimed: Claimed, results: list[BatchResult]
) -> Output[RunSummary]:
    summary = summarize(claimed.run_id, claimed, results)
    tags = outcome_tags(summary.claimed, summary.totals)
    context.instance.add_run_tags(context.run_id, tags)
    return Output(
        summary,
        metadata={
            "outcome": tags["media_hooks/outcome"],
            "claimed": summary.claimed,
            **{name: summary.totals.get(name, 0) for name in COUNT_COLUMNS},
            "per_destination": MetadataValue.md(
                counts_table(summary.per_destination, ("claimed", *COUNT_COLUMNS))
            ),
            "rows_of_this_run": MetadataValue.md(rows_of_run(claimed.run_id)),
            "steps": len(results),
        },
    )
