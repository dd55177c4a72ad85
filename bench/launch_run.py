"""Delivery runs launched as the daemon launches them: through the instance's run launcher
(the project's ``WarmRunLauncher``, forking each run from its warm server), or in a fresh
interpreter, as Dagster's DefaultRunLauncher has its code server start each run.

    python -m bench.launch_run RUN_ID     (the fresh interpreter; DAGSTER_HOME and the
                                           storage from the environment)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from dagster import DagsterInstance, DagsterRun, reconstructable
from dagster._core.instance.ref import InstanceRef  # private; Dagster is pinned
from dagster._serdes import serialize_value

from bench.processes import python_command, start
from media_hooks.orchestration import run_workers
from media_hooks.orchestration.definitions import deliver_webhooks_job

if TYPE_CHECKING:  # not imported by the fresh interpreter, whose start is measured
    from bench.session import Session

LAG_SENSOR = "delivery_lag_sensor"


@contextmanager
def daemon_instance(
    session: Session, url: str, storage: str, *, warm: bool = True
) -> Iterator[tuple[DagsterInstance, dict[str, str]]]:
    """An instance of its own DAGSTER_HOME on the session's database and Dagster storage, this
    process's environment bound to them as a daemon's is, with its launcher's warm server
    started (``warm``: a deployed daemon's is after its first run); and the environment of a
    run's process."""
    from bench.session import environment

    home = session.dagster_home()
    env = session.env(url, storage, DAGSTER_HOME=str(home))
    with environment(**env), DagsterInstance.from_config(str(home)) as instance:
        if warm:
            instance.run_launcher.zygote.start()
        yield instance, env


def create_run(
    instance: DagsterInstance, run_config: Mapping[str, Any], tags: Mapping[str, str]
) -> DagsterRun:
    """A ``deliver_webhooks`` run as the daemon creates one: with its code origin."""
    job = deliver_webhooks_job()
    return instance.create_run_for_job(
        job_def=job,
        run_config=run_config,
        tags={**job.tags, **tags},
        job_code_origin=reconstructable(deliver_webhooks_job).get_python_origin(),
    )


def launch(
    instance: DagsterInstance, run_id: str, env: dict[str, str], *, warm: bool
) -> subprocess.Popen | None:
    """Launches the run: through the instance's launcher (``warm``), or in a fresh
    interpreter, whose process is returned."""
    if warm:
        instance.launch_run(run_id, workspace=None)
        return None
    return start(python_command("bench.launch_run", run_id), env)


def _process_ended(run: DagsterRun, process) -> bool:
    if process is not None:
        return process.poll() is not None
    worker = run_workers.worker_of(run)
    return worker is not None and worker.is_gone() is True


def settled(instance: DagsterInstance, run_id: str, process) -> DagsterRun:
    """The run as it stands, failed first when its process ended before it did (as the
    daemon's run monitoring would fail it, so that the sensor may request another)."""
    run = instance.get_run_by_id(run_id)
    if run.is_finished or not _process_ended(run, process):
        return run
    run = instance.get_run_by_id(run_id)  # again: what the process wrote before it ended
    if not run.is_finished:
        instance.report_run_failed(run)
    return instance.get_run_by_id(run_id)


def wait_finished(instance: DagsterInstance, run_id: str, process, timeout: float) -> DagsterRun:
    """The run once it finished (or failed, when its process ended first, or at ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        run = settled(instance, run_id, process)
        if run.is_finished:
            return run
        if time.monotonic() > deadline:
            instance.report_run_failed(run)
            return instance.get_run_by_id(run_id)
        time.sleep(0.01)


def main() -> int:
    from media_hooks.orchestration.zygote import execute

    ref = serialize_value(InstanceRef.from_dir(os.environ["DAGSTER_HOME"]))
    return execute(sys.argv[1], ref)


if __name__ == "__main__":
    sys.exit(main())
