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
"""

from __future__ import annotations

import os

from dagster import job, multiprocess_executor

from media_hooks.orchestration.ops.delivery import (
    claim_due_pages,
    deliver_destination_batch,
    partition_by_destination,
    summarize_run,
)
from media_hooks.orchestration.ops.operator import purge_terminal_deliveries, requeue_deliveries

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


@job(
    description="Delivers due webhooks: claim due pages into the outbox under this run's id, "
    "then one mapped step per destination batch, in parallel, then a summary. Safe to run at "
    "any time and to overlap: the row protocol divides the work.",
    tags=DELIVERY_RUN_TAG,
    executor_def=multiprocess_executor,
    config={"execution": DELIVERY_EXECUTION},
)
def deliver_webhooks():
    claimed = claim_due_pages()
    results = partition_by_destination(claimed).map(deliver_destination_batch)
    summarize_run(claimed, results.collect())


@job(description="Requeues a cohort (dead letters by default); dry run unless told otherwise.")
def requeue_cohort():
    requeue_deliveries()


@job(description="Deletes terminal deliveries past the retention window; keeps tombstones.")
def retention():
    purge_terminal_deliveries()
