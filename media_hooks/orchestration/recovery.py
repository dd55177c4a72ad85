"""Delivery runs that died: marked failed with the reason, their pool slots freed, their rows
released.

A delivery run that dies (SIGKILL, the OOM killer, a lost node, a database outage that outlived
its process) leaves three things behind: a Dagster run still STARTED, slots of the delivery
pool that every later run waits for, and its claimed rows ``enqueued`` or ``leased``. A run
that failed or was canceled leaves the last two. ``recover`` turns each such run into a failed
run with its reason, frees its slots (the event log storage's ``free_concurrency_slots_for_run``,
what the UI's "free slots" does) and releases its rows (``sweeps.release_run``), then tags the
run with what it released (``RELEASED_TAG``), so a later pass skips it.

Every path that can notice a dead run calls it: the run-failure sensor (for the run that just
failed), the lag sensor on every tick, the claim op at the start of every delivery run, and
``media-hooks run`` before its first run and after a failed one. It is idempotent: whichever
comes first does the work. A pass that finds the database or Dagster's storage unreachable does
what it can; the next pass does the rest.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import psycopg
from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter

from media_hooks.orchestration import run_workers
from media_hooks.outbox import claims
from media_hooks.outbox.maintenance import sweeps
from media_hooks.store.sqlfiles import query

RELEASED_TAG = "media_hooks/released"
UNSUCCESSFUL = [DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED]
# Failed runs looked at per pass, newest first; a pass that is not enough leaves the rest to
# the next one.
FAILED_RUNS_PER_PASS = 50


@dataclass(frozen=True)
class Recovered:
    run_id: str
    # Why this pass marked the run failed; None when Dagster already knew it had ended.
    marked_failed: str | None
    released: int
    slots_freed: int

    def describe(self) -> str:
        parts = [f"run {self.run_id}"]
        if self.marked_failed:
            parts.append(f"marked failed ({self.marked_failed})")
        parts.append(f"{self.released} delivery(ies) due again")
        if self.slots_freed:
            parts.append(f"{self.slots_freed} pool slot(s) freed")
        return ", ".join(parts)


def free_pool_slots(instance: DagsterInstance, run_id: str) -> int:
    """Frees every pool slot and pending claim of ``run_id``; returns how many slots it held."""
    storage = instance.event_log_storage
    infos = storage.get_concurrency_infos(sorted(storage.get_concurrency_keys()))
    held = sum(1 for info in infos.values() for slot in info.claimed_slots if slot.run_id == run_id)
    # A step of the in-process executor holds its slot with no pending-step row left.
    if held or run_id in storage.get_concurrency_run_ids():
        storage.free_concurrency_slots_for_run(run_id)
    return held


@contextmanager
def _one_at_a_time(conn: psycopg.Connection, *, wait: bool) -> Iterator[bool]:
    """The recovery lock (sql/queries/recovery.sql): yields whether this session holds it
    (``wait``: once it does). A pass under way makes another skip, a release waits for it: a
    dead run is reported once, and its tag counts each released row once."""
    if wait:
        conn.execute(query("recovery_lock"))
        held = True
    else:
        held = conn.execute(query("recovery_try_lock")).fetchone()["got"]
    try:
        yield held
    finally:
        if held:
            conn.execute(query("recovery_unlock"))


def release(
    instance: DagsterInstance, conn: psycopg.Connection, run: DagsterRun, *, reason: str | None
) -> Recovered:
    """Frees a finished run's slots and releases its rows, then records on the run how many
    rows were released in all.

    The tag is written only when this database holds the run's dispatches: a run of another
    deployment sharing the Dagster instance keeps waiting for its own."""
    with _one_at_a_time(conn, wait=True):
        slots = free_pool_slots(instance, run.run_id)
        released = sweeps.release_run(conn, run.run_id)
        if claims.run_dispatched(conn, run.run_id):
            current = instance.get_run_by_id(run.run_id) or run
            before = int(current.tags.get(RELEASED_TAG, "0"))
            instance.add_run_tags(run.run_id, {RELEASED_TAG: str(before + released)})
    return Recovered(run.run_id, reason, released, slots)


def _mark_dead(instance: DagsterInstance, run: DagsterRun, worker: run_workers.Worker) -> str:
    reason = f"its worker process ({worker.describe()}) is gone"
    current = instance.get_run_by_id(run.run_id)
    if current is None or current.is_finished:
        return reason
    message = f"media_hooks: {reason}; the run cannot finish"
    if current.status == DagsterRunStatus.CANCELING:
        instance.report_run_canceled(current, message)
    else:
        instance.report_run_failed(current, message)
    return reason


def dead_runs(
    instance: DagsterInstance, job_name: str
) -> list[tuple[DagsterRun, run_workers.Worker]]:
    """Runs in progress whose worker process is known to be gone."""
    found = []
    for run in run_workers.runs_in_progress(instance, job_name):
        worker = run_workers.worker_of(run)
        if worker is not None and worker.is_gone():
            found.append((run, worker))
    return found


def unreleased_runs(
    instance: DagsterInstance, job_name: str, window_seconds: float
) -> list[DagsterRun]:
    """Failed or canceled runs of the last ``window_seconds`` whose rows were not released.

    Older ones need no release: the enqueue-timeout and lease sweeps have made their rows due."""
    horizon = datetime.now(UTC) - timedelta(seconds=window_seconds)
    records = instance.get_run_records(
        filters=RunsFilter(job_name=job_name, statuses=UNSUCCESSFUL, updated_after=horizon),
        limit=FAILED_RUNS_PER_PASS,
    )
    return [r.dagster_run for r in records if RELEASED_TAG not in r.dagster_run.tags]


def window_seconds(enqueue_timeout_seconds: float) -> float:
    """How far back a pass looks for failed runs to release: past twice the enqueue timeout
    the sweeps have made their rows due anyway."""
    return 2 * enqueue_timeout_seconds


def recover(
    instance: DagsterInstance,
    conn: psycopg.Connection,
    job_name: str,
    *,
    window_seconds: float,
) -> list[Recovered]:
    """One recovery pass (see the module's docstring); the runs it did something for. A pass
    already under way elsewhere makes this one a no-op."""
    with _one_at_a_time(conn, wait=False) as mine:
        if not mine:
            return []
        reasons = {
            run.run_id: _mark_dead(instance, run, w) for run, w in dead_runs(instance, job_name)
        }
        done = [
            release(instance, conn, run, reason=reasons.get(run.run_id))
            for run in unreleased_runs(instance, job_name, window_seconds)
        ]
        return [d for d in done if d.marked_failed or d.released or d.slots_freed]
