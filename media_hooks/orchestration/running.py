"""Executing ``deliver_webhooks`` from Python (``media-hooks run``, the benchmark, tests).

The same job the schedule and sensors launch, run in this process's control with Dagster's
multiprocess executor against a persistent instance (the multiprocess executor needs one; an
ephemeral instance keeps nothing to re-execute from).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dagster import DagsterInstance, execute_job, reconstructable

from media_hooks.orchestration.definitions import deliver_webhooks_job
from media_hooks.orchestration.ops.delivery import RunSummary


@dataclass(frozen=True)
class DeliveryRun:
    run_id: str
    success: bool
    summary: RunSummary | None


def delivery_run_config(
    config: dict[str, Any],
    *,
    execution: dict[str, Any] | None = None,
    resources: dict[str, dict[str, Any]] | None = None,
    log_level: str = "WARNING",
) -> dict:
    """Run config for ``deliver_webhooks``: the claim op's config, and optionally the
    executor's and the resources' (e.g. ``{"postgres": {"database_url": ...}}``)."""
    run_config: dict[str, Any] = {
        "ops": {"claim_due_pages": {"config": config}},
        "loggers": {"console": {"config": {"log_level": log_level}}},
    }
    if execution is not None:
        run_config["execution"] = execution
    if resources:
        run_config["resources"] = {key: {"config": value} for key, value in resources.items()}
    return run_config


def execute_delivery(
    instance: DagsterInstance,
    config: dict[str, Any] | None = None,
    *,
    tags: dict[str, str] | None = None,
    execution: dict[str, Any] | None = None,
    resources: dict[str, dict[str, Any]] | None = None,
    log_level: str = "WARNING",
) -> DeliveryRun:
    """One run of ``deliver_webhooks``, waited for; never raises for a failed step."""
    run_config = delivery_run_config(
        config or {}, execution=execution, resources=resources, log_level=log_level
    )
    with execute_job(
        reconstructable(deliver_webhooks_job),
        instance=instance,
        run_config=run_config,
        tags=tags,
        raise_on_error=False,
    ) as result:
        summary = result.output_for_node("summarize_run") if result.success else None
        return DeliveryRun(run_id=result.run_id, success=result.success, summary=summary)
