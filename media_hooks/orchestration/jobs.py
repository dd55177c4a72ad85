"""The jobs, and the executor that makes destinations deliver in parallel.

Executor: Dagster's multiprocess executor, each mapped step in its own process, at most
``MAX_CONCURRENT_STEPS`` at once, forked from a forkserver that has this project preloaded.
Mapped steps per destination batch are the unit the UI shows, retries and re-executes; in
separate processes a slow or rate-limited destination never holds up another's step. The
in-process executor runs steps one after another (one slow destination would delay all the
others). Plain spawn costs 2–3 s per step here (a fresh interpreter importing Dagster); the
preloaded forkserver forks a warm one instead. Past one machine, the same job runs under the
Celery or Kubernetes executors (one pod / worker per step) against the same PostgreSQL: the
row protocol, not the executor, keeps deliveries single.

``delivery_executor`` is that multiprocess executor, which first records on the run the process
that orchestrates its steps (``run_workers``): what tells a run whose process was killed from a
run that is merely slow, since Dagster records no such thing for runs it cannot monitor.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from dagster import Executor, ExecutorDefinition, InitExecutorContext, job, multiprocess_executor

from media_hooks.orchestration import run_workers
from media_hooks.orchestration.config import DeliverConfig
from media_hooks.orchestration.ops.delivery import (
    claim_due_pages,
    deliver_destination_batch,
    partition_by_destination,
    summarize_run,
)
from media_hooks.orchestration.ops.operator import (
    discard_dead_deliveries,
    purge_terminal_deliveries,
    requeue_deliveries,
)

DELIVERY_RUN_TAG = {"media_hooks/kind": "delivery"}
# Steps at once within one run: twice the cores, at least 4. On 2 cores, 4 step processes
# deliver 10,000 rows about 1.5x faster than 10 at once (measured with the former bench/dagster_overhead.py), and a
# slow destination's step holds one slot for at most the engine's permit wait (60 s) before
# it hands its rows back. Raise it per run (Launchpad: execution config) when more
# destinations than slots need strict isolation; the op pool caps delivery steps across runs.
MAX_CONCURRENT_STEPS = max(4, 2 * (os.cpu_count() or 2))

DELIVERY_EXECUTION = {
    "config": {
        "max_concurrent": MAX_CONCURRENT_STEPS,
        "start_method": {
            "forkserver": {"preload_modules": ["media_hooks.orchestration.definitions"]}
        },
    }
}


# The Launchpad opens on this: every cohort field with its default, ready to edit.
DELIVERY_DEFAULT_CONFIG = {
    "execution": DELIVERY_EXECUTION,
    "ops": {
        "claim_due_pages": {
            "config": {
                name: field.get_default() for name, field in DeliverConfig.model_fields.items()
            }
        }
    },
}


class _RecordsItsWorker(Executor):
    """An executor that records this process as the run's worker, then lets ``inner`` run it."""

    def __init__(self, inner: Executor) -> None:
        self._inner = inner

    @property
    def retries(self):
        return self._inner.retries

    @property
    def step_dependency_config(self):
        return self._inner.step_dependency_config

    def execute(self, plan_context, execution_plan) -> Iterator:
        worker = run_workers.this_process(plan_context.run_id)
        plan_context.instance.add_run_tags(plan_context.run_id, worker.tag())
        yield from self._inner.execute(plan_context, execution_plan)


def _create_delivery_executor(init_context: InitExecutorContext) -> Executor:
    return _RecordsItsWorker(multiprocess_executor.executor_creation_fn(init_context))


delivery_executor = ExecutorDefinition(
    name="multiprocess",
    config_schema=multiprocess_executor.config_schema,
    requirements=multiprocess_executor.get_requirements,
    executor_creation_fn=_create_delivery_executor,
    description="Dagster's multiprocess executor; records the run's worker process first.",
)


@job(
    description="Delivers due webhooks: claim due pages into the outbox under this run's id, "
    "then one mapped step per destination batch, in parallel, then a summary. Safe to run at "
    "any time and to overlap: the row protocol divides the work. Fails only on an "
    "infrastructure fault; what receivers answered is in its tags (media_hooks/outcome).",
    tags=DELIVERY_RUN_TAG,
    executor_def=delivery_executor,
    config=DELIVERY_DEFAULT_CONFIG,
)
def deliver_webhooks():
    claimed = claim_due_pages()
    results = partition_by_destination(claimed).map(deliver_destination_batch)
    summarize_run(claimed, results.collect())


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
