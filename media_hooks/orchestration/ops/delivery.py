"""The delivery job's ops: prepare → deliver a shard of destinations (mapped) → summarize.

Each op is a few lines over the engine and reports what it did as output metadata, so the run
page answers "what did this run claim, send, retry, give up on, and where are its rows".
"""

import time
import zlib
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime

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
    RetryRequested,
    op,
)

from media_hooks.engine.counts import DeliveryCounts, tally
from media_hooks.engine.delivery import deliver_destinations
from media_hooks.engine.recording import OutcomesNotRecorded
from media_hooks.observe import figures
from media_hooks.orchestration import node_worker, outbox_asset, recovery
from media_hooks.orchestration.celery import executor as celery_steps
from media_hooks.orchestration.config import DeliverConfig
from media_hooks.orchestration.metadata import (
    ALERT_TAG,
    cohort_tags,
    counts_table,
    outcome_tags,
    rows_of_run,
)
from media_hooks.orchestration.ops import remote_steps
from media_hooks.orchestration.resources import DeliverySettingsResource, PostgresResource
from media_hooks.outbox import claims
from media_hooks.outbox.cohort import Cohort
from media_hooks.outbox.maintenance import requeue, sweeps
from media_hooks.store import db

# The op pool (dagster.yaml, concurrency > pools) caps delivery steps across all runs.
DELIVERY_POOL = "media_hooks_delivery"
RUNTIME_TAG = "media_hooks/runtime"
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
class Prepared:
    """What ``prepare`` hands on: the run's cohort and sizes, and how it splits destinations."""

    cohort: Cohort
    page_size: int
    max_rows: int | None
    shards: int
    due_destinations: int
    # Which program delivers: the Python engine or the Node.js worker (DeliverConfig.runtime).
    runtime: str = "python"
    # The database's clock as prepare began: the run's summary checks the history from here
    # (None in a Prepared an earlier release wrote: a re-execution checks the day).
    began_at: datetime | None = None


@dataclass(frozen=True)
class Shard:
    """One delivery step's part of the destinations: those whose bucket is ``index`` of
    ``count`` (a stable hash of the id), so a step and its re-execution serve the same ones."""

    index: int
    count: int
    prepared: Prepared
    # The shard's part of the run's row cap (None: no cap; see shard_caps).
    max_rows: int | None = None

    def serves(self, destination_id: str) -> bool:
        return zlib.crc32(destination_id.encode()) % self.count == self.index

    @property
    def mapping_key(self) -> str:
        return f"shard_{self.index + 1}_of_{self.count}"


@dataclass(frozen=True)
class ShardResult:
    mapping_key: str
    # Per destination: rows claimed and the delivery counts (DeliveryCounts.as_dict()).
    claimed: dict[str, int] = field(default_factory=dict)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
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
    "cohort's dead letters, finds the destinations with due work, and hands one shard of them "
    "to each delivery step (one shard by default). Claims nothing itself: each destination "
    "claims its own pages as it delivers.",
    out={"prepared": Out(Prepared), "shards": DynamicOut(Shard)},
)
def prepare(
    context: OpExecutionContext,
    config: DeliverConfig,
    postgres: PostgresResource,
    delivery_settings: DeliverySettingsResource,
):
    config.check()
    cohort = config.cohort()
    runtime = config.delivery_runtime()
    context.instance.add_run_tags(context.run_id, {**cohort_tags(cohort), RUNTIME_TAG: runtime})
    started = time.monotonic()
    settings = delivery_settings.settings()
    with postgres.connection(db.Role.RECONCILER) as conn:
        before = figures.measure(conn, history=False)
        recovered = _recover_dead_runs(context, conn, settings)
        swept = sweeps.run_sweeps(conn, settings)
        requeued = _requeue_dead(context, conn, config) if config.include_dead else 0
        due = claims.due_destinations(conn, cohort)
    # Unless the run or the deployment says, one shard per Celery worker process serving the
    # steps (the run's executor counted them), else one.
    shard_count = (
        config.shards
        or delivery_settings.configured_shards()
        or celery_steps.step_processes(context.run.tags)
        or 1
    )
    prepared = Prepared(
        cohort=cohort,
        page_size=config.page_size or delivery_settings.default_page_size,
        max_rows=config.max_rows or delivery_settings.default_max_rows,
        shards=shard_count,
        due_destinations=len(due),
        runtime=runtime,
        began_at=before.measured_at,
    )
    yield Output(
        prepared,
        output_name="prepared",
        metadata={
            "due_destinations": len(due),
            "runtime": runtime,
            "destinations": MetadataValue.md("\n".join(f"- {d}" for d in due) or "none"),
            "oldest_due_age_seconds": MetadataValue.float(before.oldest_due_age_seconds or 0.0),
            "relay_lag_seconds": MetadataValue.float(before.relay_lag_seconds or 0.0),
            "recovered_runs": MetadataValue.md(
                "\n".join(f"- {done.describe()}" for done in recovered) or "none"
            ),
            "swept_expired_leases": swept.expired_leases,
            "swept_stale_enqueues": swept.stale_enqueues,
            "breaker_disabled": swept.breaker_disabled,
            "superseded": swept.superseded,
            "woken_parked_heads": swept.woken_heads,
            "requeued_dead": requeued,
            "cohort": MetadataValue.json(cohort.describe()),
            "seconds": MetadataValue.float(time.monotonic() - started),
        },
    )
    shards = [Shard(index, prepared.shards, prepared) for index in range(prepared.shards)]
    served = [sum(1 for d in due if shard.serves(d)) for shard in shards]
    for shard, count, rows in zip(
        shards, served, shard_caps(prepared.max_rows, served), strict=True
    ):
        yield DynamicOutput(
            replace(shard, max_rows=rows),
            output_name="shards",
            mapping_key=shard.mapping_key,
            metadata={"shard_due_destinations": count, "shard_max_rows": rows},
        )


def shard_caps(max_rows: int | None, served: list[int]) -> list[int | None]:
    """Each shard's part of the run's row cap, in proportion to the due destinations it serves
    (the largest remainders take the rows left over): a shard with nothing due takes none of
    it, so a capped run claims up to its cap wherever its work hashed to."""
    if max_rows is None:
        return [None] * len(served)
    weights = served if any(served) else [1] * len(served)
    total = sum(weights)
    caps = [max_rows * weight // total for weight in weights]
    by_remainder = sorted(range(len(weights)), key=lambda i: -(max_rows * weights[i] % total))
    for index in by_remainder[: max_rows - sum(caps)]:
        caps[index] += 1
    return caps


def _deliver_shard(context: OpExecutionContext, shard: Shard, postgres, settings) -> ShardResult:
    """The shard's due destinations, delivered by the run's runtime."""
    prepared = shard.prepared
    with postgres.connection(db.Role.RECONCILER) as conn:
        remote_steps.release_earlier_attempt(context, conn, shard.serves)
        due = [d for d in claims.due_destinations(conn, prepared.cohort) if shard.serves(d)]
    if not due:
        return ShardResult(mapping_key=shard.mapping_key)
    started = time.monotonic()
    if prepared.runtime == "node":
        report = node_worker.deliver(
            context,
            due,
            database_url=postgres.url(),
            settings=settings,
            page_size=prepared.page_size,
            max_rows=shard.max_rows,
        )
        return ShardResult(
            shard.mapping_key, report.claimed, report.counts, time.monotonic() - started
        )
    return _deliver_in_python(context, shard, due, postgres, settings, started)


def _deliver_in_python(
    context: OpExecutionContext, shard: Shard, due: list[str], postgres, settings, started: float
) -> ShardResult:
    """Each destination in a thread of its own (the engine's deliver_destinations), on a pool
    with a connection for each. A canceled run's interrupt stops every destination, which
    hands back what it holds before the step ends."""
    prepared = shard.prepared
    result = ShardResult(mapping_key=shard.mapping_key)
    with (
        db.open_pool(postgres.url(), max_size=len(due) + 1, settings=settings) as pool,
        remote_steps.stopped_with_the_run(context) as stop,
    ):
        for done in deliver_destinations(
            pool,
            context.run_id,
            due,
            settings,
            cohort=prepared.cohort,
            claim_page_size=prepared.page_size,
            max_rows=shard.max_rows,
            stop=stop,
        ):
            result.claimed[done.destination_id] = done.claimed
            result.counts[done.destination_id] = done.counts.as_dict()
            context.log.info(
                f"{done.destination_id}: claimed {done.claimed}, "
                f"succeeded {done.counts.succeeded} in {done.seconds:.1f} s"
            )
    return ShardResult(
        result.mapping_key, result.claimed, result.counts, time.monotonic() - started
    )


# Infrastructure faults of a delivery step: two more tries, 2 s and then 6 s after a failure.
STEP_RETRY = RetryPolicy(max_retries=2, delay=2, backoff=Backoff.EXPONENTIAL)


@op(
    description="Delivers a shard of the due destinations (all of them by default) through the "
    "engine, each destination in a thread of its own that claims its deliveries a page at a "
    "time, honouring its global limits. A destination's failures are counted, not raised; "
    "only infrastructure faults fail the step (and Dagster retries those; webhook retries are "
    "the table's), except outcomes the database refused to record: that failure is final, "
    "never hidden by a retry.",
    pool=DELIVERY_POOL,
    out=Out(ShardResult),
)
def deliver_shard(
    context: OpExecutionContext,
    shard: Shard,
    postgres: PostgresResource,
    delivery_settings: DeliverySettingsResource,
) -> Output[ShardResult]:
    try:
        result = _deliver_shard(context, shard, postgres, delivery_settings.settings())
    except OutcomesNotRecorded as exc:
        # A step retry would not record them and would end green, leaving their outcomes to
        # lease expiry: the failure must show.
        raise Failure(
            description=str(exc),
            metadata={"deliveries": exc.delivery_ids},
            allow_retries=False,
        ) from exc
    except Failure:
        raise  # final by construction (the node runtime's bad settings or missing install)
    except Exception as exc:
        # Retried by request, not by a retry_policy on the op: under a policy Dagster turns the
        # interrupt of a canceled run into a retry, and an in-process run would then deliver
        # again in the same process and end green instead of canceled.
        raise RetryRequested(
            max_retries=STEP_RETRY.max_retries,
            seconds_to_wait=STEP_RETRY.calculate_delay(context.retry_number + 1),
        ) from exc
    totals, _ = tally((d, DeliveryCounts(**c)) for d, c in result.counts.items())
    per_destination = {
        d: {"claimed": result.claimed[d], **c} for d, c in sorted(result.counts.items())
    }
    return Output(
        result,
        metadata={
            "destinations": len(result.counts),
            "claimed": sum(result.claimed.values()),
            **{name: getattr(totals, name) for name in COUNT_COLUMNS},
            "per_destination": MetadataValue.md(
                counts_table(per_destination, ("claimed", *COUNT_COLUMNS))
            ),
            "seconds": MetadataValue.float(result.seconds),
            "deliveries_per_second": MetadataValue.float(
                totals.attempted / result.seconds if result.seconds else 0.0
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
        """The shape (docs/contract.md) of ``media-hooks run --json``, per run."""
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


def summarize(run_id: str, results: list[ShardResult]) -> RunSummary:
    totals, per_destination = tally(
        (d, DeliveryCounts(**c)) for result in results for d, c in result.counts.items()
    )
    claimed = {d: n for result in results for d, n in result.claimed.items()}
    return RunSummary(
        run_id=run_id,
        claimed=sum(claimed.values()),
        totals=totals.as_dict(),
        per_destination={
            d: {"claimed": claimed[d], **c.as_dict()} for d, c in per_destination.items()
        },
    )


@op(
    description="Fans in: totals and per-destination counts, how to list this run's rows, and "
    "the run's outcome as tags for the run list (media_hooks/outcome, media_hooks/delivered, "
    "and alert when it delivered nothing while work was due or a destination is disabled); "
    "then materializes media_hooks/outbox as the run leaves it and evaluates its checks."
)
def summarize_run(
    context: OpExecutionContext,
    prepared: Prepared,
    results: list[ShardResult],
    postgres: PostgresResource,
    delivery_settings: DeliverySettingsResource,
) -> Output[RunSummary]:
    summary = summarize(context.run_id, results)
    with postgres.connection() as conn:
        reading = outbox_asset.measure(
            conn, delivery_settings.settings(), since=prepared.began_at, history=False
        )
    f = reading.figures
    named = prepared.cohort.destination_ids
    # A run for named destinations answers for those only.
    disabled = [d for d in reading.disabled if not named or d.destination_id in named]
    tags = outcome_tags(
        summary.claimed,
        summary.totals,
        # Due deliveries, and none a run may send: all wait for paused or disabled destinations
        # (of its own destinations, when it names them).
        due_unsendable=any(d.waiting for d in disabled)
        if named
        else f.oldest_due_any_age_seconds is not None and not f.due_work,
        disabled=disabled,
    )
    context.instance.add_run_tags(context.run_id, tags)
    found = outbox_asset.record_after_run(context, reading, tags)
    return Output(
        summary,
        metadata={
            "outcome": tags["media_hooks/outcome"],
            "alert": tags.get(ALERT_TAG, "none"),
            "outbox_checks": outbox_asset.summary_line(found),
            "claimed": summary.claimed,
            **{name: summary.totals.get(name, 0) for name in COUNT_COLUMNS},
            "per_destination": MetadataValue.md(
                counts_table(summary.per_destination, ("claimed", *COUNT_COLUMNS))
            ),
            "rows_of_this_run": MetadataValue.md(rows_of_run(context.run_id)),
            "due_destinations": prepared.due_destinations,
            "steps": len(results),
            # Whole, for programs (`media-hooks run` reads it back from the event log).
            "summary": MetadataValue.json(asdict(summary)),
        },
    )
