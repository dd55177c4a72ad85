"""Which process executes a delivery run, and whether it is still alive.

Dagster's run monitoring asks the run launcher whether a run's worker is healthy, but the
DefaultRunLauncher of ``media-hooks dev`` cannot tell, and ``media-hooks run`` executes its runs
in its own process with no launcher at all: a run whose process was killed stays STARTED for
ever. So the job's executor (``jobs.delivery_executor``) records, as the run starts, the process
that orchestrates its steps: host, pid and the process's start time in the tag ``WORKER_TAG``.
On the same host, that worker is gone when the pid no longer exists, is a zombie, or belongs to
a process started at another time (the pid was reused). A worker on another host is not
judged here: a launcher that checks its workers (Kubernetes, Docker, ECS) with Dagster's run
monitoring covers it, and the lease and enqueue timeouts cover its rows whatever happens.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass

import psutil
from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter

WORKER_TAG = "media_hooks/worker"
# /proc gives start times in clock ticks: the same process reads the same time to the tick.
_START_TIME_TOLERANCE = 0.5

IN_PROGRESS = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]


@dataclass(frozen=True)
class Worker:
    # The run the tag was written for: a re-executed run may copy its parent's tags.
    run_id: str
    host: str
    pid: int
    started: float

    def tag(self) -> dict[str, str]:
        return {WORKER_TAG: json.dumps(asdict(self), separators=(",", ":"))}

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"

    def is_gone(self) -> bool | None:
        """True when this worker process no longer runs; None when it cannot tell (another
        host)."""
        if self.host != socket.gethostname():
            return None
        try:
            process = psutil.Process(self.pid)
            if process.status() == psutil.STATUS_ZOMBIE:
                return True
            return abs(process.create_time() - self.started) > _START_TIME_TOLERANCE
        except psutil.NoSuchProcess:
            return True


def this_process(run_id: str) -> Worker:
    worker = process_of(run_id, os.getpid())
    assert worker is not None  # this process exists
    return worker


def process_of(run_id: str, pid: int) -> Worker | None:
    """Process ``pid`` of this host as ``run_id``'s worker; None when it no longer runs."""
    try:
        started = psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return None
    return Worker(run_id=run_id, host=socket.gethostname(), pid=pid, started=started)


def worker_of(run: DagsterRun) -> Worker | None:
    """The worker recorded for ``run``, or None (not started yet, or an unreadable tag)."""
    raw = run.tags.get(WORKER_TAG)
    if not raw:
        return None
    try:
        worker = Worker(**json.loads(raw))
    except (ValueError, TypeError):
        return None
    return worker if worker.run_id == run.run_id else None


def runs_in_progress(instance: DagsterInstance, job_name: str) -> list[DagsterRun]:
    return list(instance.get_runs(RunsFilter(job_name=job_name, statuses=IN_PROGRESS)))


def runs_of_this_process(instance: DagsterInstance, job_name: str) -> list[DagsterRun]:
    """Runs of ``job_name`` still in progress whose worker is this process."""
    me = this_process("")
    return [
        run
        for run in runs_in_progress(instance, job_name)
        if (worker := worker_of(run)) is not None
        and (worker.host, worker.pid, worker.started) == (me.host, me.pid, me.started)
    ]
