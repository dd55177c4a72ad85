"""Operator jobs' ops: requeue a cohort, discard dead deliveries, and retention."""

from dagster import MetadataValue, OpExecutionContext, Output, op

from media_hooks.orchestration.config import DiscardConfig, RequeueConfig, RetentionConfig
from media_hooks.orchestration.metadata import cohort_tags, markdown_table
from media_hooks.orchestration.resources import PostgresResource, step_outputs
from media_hooks.outbox.maintenance import discard, requeue, retention

DAY = 86400.0


@op(
    description="Makes a cohort due now (same delivery_id, fresh budget, audited); dry run by default."
)
def requeue_deliveries(
    context: OpExecutionContext, config: RequeueConfig, postgres: PostgresResource
) -> Output[dict]:
    cohort = config.cohort()
    context.instance.add_run_tags(context.run_id, cohort_tags(cohort))
    with postgres.connection() as conn:
        result = requeue.requeue(
            conn,
            cohort,
            states=tuple(config.states),
            reason=config.reason,
            requested_by=config.requested_by,
            dry_run=config.dry_run,
        )
    verb = "would move" if config.dry_run else "moved"
    context.log.info(f"{verb} {result.matched} delivery(ies): {result.by_state}")
    return Output(
        {"matched": result.matched, "moved": result.moved, "by_state": result.by_state},
        metadata={
            "dry_run": config.dry_run,
            "matched": result.matched,
            "moved": result.moved,
            "in_flight_left_alone": result.in_flight,
            "requeue_id": result.requeue_id if result.requeue_id is not None else "none",
            "by_state": MetadataValue.md(
                markdown_table(["state", "deliveries"], sorted(result.by_state.items()))
            ),
            "sample": MetadataValue.json(result.sample),
        },
    )


@op(description="Closes dead deliveries unsent (discarded); names those that were not dead.")
def discard_dead_deliveries(
    context: OpExecutionContext, config: DiscardConfig, postgres: PostgresResource
) -> Output[dict]:
    with postgres.connection() as conn:
        result = discard.discard(
            conn, config.delivery_ids, reason=config.reason, requested_by=config.requested_by
        )
    context.log.info(f"discarded {len(result.discarded)} delivery(ies)")
    return Output(
        {"discarded": list(result.discarded), "not_discarded": result.refused},
        metadata={
            "discarded": len(result.discarded),
            "not_discarded": MetadataValue.md(
                markdown_table(["delivery", "state"], sorted(result.refused.items()))
            ),
        },
    )


@op(description="Purges terminal deliveries past the window in bounded batches; keeps tombstones.")
def purge_terminal_deliveries(
    context: OpExecutionContext, config: RetentionConfig, postgres: PostgresResource
) -> Output[dict]:
    policy = retention.RetentionPolicy(
        retain_seconds=config.retain_days * DAY,
        tombstone_seconds=config.tombstone_days * DAY,
        batch_size=config.batch_size,
        max_batches=config.max_batches,
    )
    with postgres.connection() as conn:
        figures = retention.run_retention(conn, policy)
        # Runs' step outputs go with the deliveries' window: older runs are not re-executed.
        outputs = step_outputs.purge(conn, policy.retain_seconds, max_batches=config.max_batches)
    if figures.truncated:
        context.log.warning("max_batches reached: the next retention run carries on")
    for held in figures.held_ranges:
        context.log.warning(f"retention: {held}")
    done = {**figures.as_dict(), "step_outputs_deleted": outputs}
    return Output(done, metadata=done)
