"""Executing ``deliver_webhooks`` from Python (``media-hooks run``, the benchmark, tests).

The same job the schedule and sensors launch, run in this process's control with Dagster's
multiprocess executor against a persistent instance (the multiprocess executor needs one; an
ephemeral instance keeps nothing to re-execute from).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dagster import (
    DagsterEventType,
    DagsterInstance,
    JobExecutionResult,
    execute_job,
    reconstructable,
)
from dagster._core.execution.plan.objects import ErrorSource  # private; Dagster is pinned

from media_hooks.orchestration.definitions import deliver_webhooks_job
from media_hooks.orchestration.jobs import interrupts_cancel
from media_hooks.orchestration.ops.delivery import RunSummary


@dataclass(frozen=True)
class DeliveryRun:
    run_id: str
    success: bool
    summary: RunSummary | None
    # Why the run did not succeed, in one line (None when it did).
    failure: str | None = None
    canceled: bool = False
    interrupted: bool = False


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _error_line(error) -> str:
    """The one line of a Dagster error that says what went wrong."""
    # The innermost cause is the exception the op's code raised, not Dagster's wrapper.
    while error.cause is not None:
        error = error.cause
    lines = [line.strip() for line in error.message.splitlines() if line.strip()]
    # The multiprocess executor lists what killed its step processes under a header.
    child = next((line for line in lines if line.startswith("In process ")), None)
    if child is not None:
        return child.split(": ", 1)[-1]
    return lines[0] if lines else error.cls_name


def failure_of(result: JobExecutionResult) -> str | None:
    """Why a run did not succeed: its first step failure, else the error that ended the run,
    else the run's own end message."""
    if result.success:
        return None
    events = result.all_events
    for event in events:
        if event.is_step_failure and event.step_failure_data.error is not None:
            data = event.step_failure_data
            # A Failure's own description, without the class name Dagster puts before it.
            described = data.user_failure_data.description if data.user_failure_data else None
            return f"step {event.step_key} failed: {described or _error_line(data.error)}"
    ends = (DagsterEventType.RUN_FAILURE, DagsterEventType.RUN_CANCELED)
    for event in reversed(events):
        if event.event_type not in ends:
            continue
        data = event.job_failure_data if event.event_type == ends[0] else None
        if data is not None and data.error is not None:
            return _error_line(data.error)
        if event.message:
            return _first_line(event.message)
    return "the run ended without success"


def was_canceled(result: JobExecutionResult) -> bool:
    return any(e.event_type == DagsterEventType.RUN_CANCELED for e in result.all_events)


def was_interrupted(result: JobExecutionResult) -> bool:
    """Whether a step ended because this process was interrupted (Ctrl-C, a cancel)."""
    return any(
        e.is_step_failure and e.step_failure_data.error_source == ErrorSource.INTERRUPT
        for e in result.all_events
    )


def summary_of(result: JobExecutionResult) -> RunSummary | None:
    """The run's summary, as ``summarize_run`` recorded it in its output's metadata."""
    for event in result.events_for_node("summarize_run"):
        if event.is_successful_output:
            return RunSummary(**event.step_output_data.metadata["summary"].value)
    return None


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
        "ops": {"prepare": {"config": config}},
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
    """One run of ``deliver_webhooks``, waited for; never raises for a failed step. An
    interrupt of this process (Ctrl-C) cancels the run: it ends CANCELED."""
    run_config = delivery_run_config(
        config or {}, execution=execution, resources=resources, log_level=log_level
    )
    # Not opened as a context manager: that sets up the run's resources again, to load outputs
    # (the summary is read from the events instead).
    with interrupts_cancel("interrupted (Ctrl-C) in the process executing it"):
        result = execute_job(
            reconstructable(deliver_webhooks_job),
            instance=instance,
            run_config=run_config,
            tags=tags,
            raise_on_error=False,
        )
    return DeliveryRun(
        run_id=result.run_id,
        success=result.success,
        summary=summary_of(result) if result.success else None,
        failure=failure_of(result),
        canceled=was_canceled(result),
        interrupted=was_interrupted(result),
    )
