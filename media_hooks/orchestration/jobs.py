"""The jobs, and the executor the delivery job runs with.

Executor: in-process by default. A delivery step delivers a shard of the due destinations
(all of them by default) through the engine, each destination in a thread of its own that
claims its deliveries a page at a time: the way ``delivery_run.deliver_due`` does, at its speed.
A slow or rate-limited destination never holds up another (each has its thread), and a run
costs one process, not one per step (a step process cost 1-3 s to start, and the executor ran at
most ``2 x cores`` of them, so slow destinations queued behind each other). The executor is
a choice of Dagster's (``executors.py``): in-process, multiprocess, or on other hosts Celery
workers or Kubernetes Jobs, each shard a step, against the same PostgreSQL: the row protocol,
not the executor, keeps deliveries single.

``delivery_executor`` first records on the run the process that orchestrates its steps
(``run_workers``): what tells a run whose process was killed from a run that is merely slow,
since Dagster records no such thing for runs it cannot monitor. And a run executed in the
process that was asked to stop it (``interrupts_cancel``: Ctrl-C on ``media-hooks run``) is
marked canceling when the interrupt reaches it, so it ends CANCELED as a run terminated from
the UI does, not FAILURE.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar

from dagster import (
    DagsterEvent,
    DagsterEventType,
    DagsterExecutionInterruptedError,
    DagsterRunStatus,
    Executor,
    ExecutorDefinition,
    InitExecutorContext,
    job,
)

# Private paths: the Dagster family is pinned exactly (pyproject.toml), so they are stable here.
from dagster._core.errors import raise_execution_interrupts
from dagster._core.events import EngineEventData
from dagster._core.execution.plan.objects import ErrorSource

from media_hooks.orchestration import executors, run_workers
from media_hooks.orchestration.celery.settings import node_tag
from media_hooks.orchestration.config import DeliverConfig
from media_hooks.orchestration.ops.delivery import deliver_shard, prepare, summarize_run
from media_hooks.orchestration.ops.operator import (
    discard_dead_deliveries,
    purge_terminal_deliveries,
    requeue_deliveries,
)

DELIVERY_RUN_TAG = {"media_hooks/kind": "delivery"}
DELIVERY_EXECUTION = {"config": {executors.default_choice(): {}}}


# The Launchpad opens on this: every field of the run's config with its default, ready to edit.
DELIVERY_DEFAULT_CONFIG = {
    "execution": DELIVERY_EXECUTION,
    "ops": {
        "prepare": {
            "config": {
                name: field.get_default() for name, field in DeliverConfig.model_fields.items()
            }
        }
    },
}


# Set while a delivery run executes in the process its user stops with Ctrl-C (running.py).
_INTERRUPT_CANCELS: ContextVar[str | None] = ContextVar(
    "media_hooks_interrupt_cancels", default=None
)


@contextmanager
def interrupts_cancel(why: str) -> Iterator[None]:
    """Within: an interrupt of a delivery run executed here is a request to stop it, ``why``
    (Dagster counts an interrupt nobody asked for as a failure: a launched run's process killed
    from outside is one)."""
    token = _INTERRUPT_CANCELS.set(why)
    try:
        yield
    finally:
        _INTERRUPT_CANCELS.reset(token)


def _mark_canceling(plan_context) -> None:
    """The run, interrupted where an interrupt is a stop request, is canceling (if nobody said
    so first): Dagster then ends it CANCELED."""
    why = _INTERRUPT_CANCELS.get()
    run = plan_context.instance.get_run_by_id(plan_context.run_id)
    if why is not None and run is not None and run.status == DagsterRunStatus.STARTED:
        plan_context.instance.report_run_canceling(run, f"media_hooks: {why}")


def _interrupted(event: DagsterEvent) -> bool:
    return event.is_step_failure and event.step_failure_data.error_source == ErrorSource.INTERRUPT


class _RecordsItsWorker(Executor):
    """An executor that records this process as the run's worker, then lets ``inner`` run it."""

    def __init__(self, inner: Executor) -> None:
        self._inner = inner

    def __getattr__(self, name: str):
        # What an executor's own loop asks of the run's executor (dagster-celery: app_args).
        return getattr(self._inner, name)

    @property
    def retries(self):
        return self._inner.retries

    @property
    def step_dependency_config(self):
        return self._inner.step_dependency_config

    def execute(self, plan_context, execution_plan) -> Iterator:
        worker = run_workers.this_process(plan_context.run_id)
        # In a run launched as a Celery task, its worker's name too: the launcher asks it.
        plan_context.instance.add_run_tags(plan_context.run_id, {**worker.tag(), **node_tag()})
        events = self._inner.execute(plan_context, execution_plan)
        # Dagster's in-process executor does not look for interrupts while a step waits for a
        # pool slot: a run stopped then (canceled, --max-seconds) would wait for the slot first.
        # While it waits, an interrupt is raised at once, as it is in a step's own code.
        waiting = False
        while True:
            try:
                with raise_execution_interrupts() if waiting else nullcontext():
                    event = next(events, None)
            except (KeyboardInterrupt, DagsterExecutionInterruptedError):
                _mark_canceling(plan_context)
                raise
            if event is None:
                return
            if _waits_for_a_pool_slot(event):
                waiting = True
            elif event.is_step_start:
                waiting = False
            elif _interrupted(event):
                _mark_canceling(plan_context)
            yield event


def _waits_for_a_pool_slot(event: DagsterEvent) -> bool:
    """The engine event an executor emits while a step is blocked by its pool's limit."""
    data = event.event_specific_data
    return (
        event.event_type == DagsterEventType.ENGINE_EVENT
        and isinstance(data, EngineEventData)
        and "pool" in (data.metadata or {})
    )


def _create_delivery_executor(init_context: InitExecutorContext) -> Executor:
    return _RecordsItsWorker(executors.create(init_context))


delivery_executor = ExecutorDefinition(
    name="delivery",
    config_schema=executors.config_field(),
    requirements=executors.requirements,
    executor_creation_fn=_create_delivery_executor,
    description="Dagster's in-process (the local default), multiprocess, Celery or Kubernetes "
    "executor, chosen by run config or MEDIA_HOOKS_EXECUTOR (orchestration/executors.py); "
    "records the run's worker process first.",
)


@job(
    description="Delivers due webhooks: prepare (recovery, sweeps, which destinations have due "
    "work), then one step per shard of destinations (one by default) in which every "
    "destination delivers concurrently, claiming its deliveries a page at a time under this "
    "run's id, then a summary. Safe to run at any time and to overlap: the row protocol "
    "divides the work. Fails only on an infrastructure fault; what receivers answered is in "
    "its tags (media_hooks/outcome).",
    tags=DELIVERY_RUN_TAG,
    executor_def=delivery_executor,
    config=DELIVERY_DEFAULT_CONFIG,
)
def deliver_webhooks():
    prepared, shards = prepare()
    results = shards.map(deliver_shard)
    summarize_run(prepared, results.collect())


@job(description="Requeues a cohort (dead letters by default); dry run unless told otherwise.")
def requeue_cohort():
    requeue_deliveries()


@job(
    description="Discards dead deliveries (closed unsent, no longer dead letters): an ordered "
    "queue's dead head lets the asset's later deliveries go."
)
def discard_dead():
    discard_dead_deliveries()


@job(description="Deletes terminal deliveries past the retention window; keeps tombstones.")
def retention():
    purge_terminal_deliveries()
