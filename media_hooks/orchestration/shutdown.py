"""Stopping the runs a local Dagster (``media-hooks dev``) still executes, before it goes away.

A run whose process is killed along with its Dagster stays STARTED until the next recovery
pass finds its worker gone. A run canceled through its launcher instead ends CANCELED, its
steps hand back what they hold, and its rows are released at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from dagster import DagsterEventType, DagsterInstance, DagsterRun, RunsFilter

from media_hooks.orchestration import run_workers

_POLL_SECONDS = 0.5


def worker_pid(instance: DagsterInstance, run: DagsterRun) -> int | None:
    """The pid of the process executing ``run``: recorded by the delivery executor, else the
    process that reported the run's start."""
    worker = run_workers.worker_of(run)
    if worker is not None:
        return worker.pid
    starts = instance.get_records_for_run(
        run.run_id, of_type=DagsterEventType.RUN_START, limit=1
    ).records
    event = starts[0].event_log_entry.dagster_event if starts else None
    return event.pid if event is not None else None


def cancel_runs_in(
    instance: DagsterInstance, pids: Iterable[int], *, timeout_seconds: float
) -> list[DagsterRun]:
    """Cancels, through the run launcher, every run in progress executed by one of ``pids``,
    and waits up to ``timeout_seconds`` for them to end. Returns the runs it canceled."""
    pids = set(pids)
    canceled = []
    for run in instance.get_runs(filters=RunsFilter(statuses=run_workers.IN_PROGRESS)):
        if worker_pid(instance, run) not in pids:
            continue
        try:
            if instance.run_launcher.terminate(run.run_id):
                canceled.append(run)
        except Exception:  # its code server is gone: the recovery pass after the stop marks it
            continue
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        current = [instance.get_run_by_id(run.run_id) for run in canceled]
        if all(run is None or run.is_finished for run in current):
            break
        time.sleep(_POLL_SECONDS)  # other processes finishing: nothing to wait on
    return canceled
