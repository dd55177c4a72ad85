"""Delivery runs launched as the daemon launches them: each in a fresh interpreter running
``dagster api execute_run``, the command Dagster's DefaultRunLauncher has its code server start
for each run (without the code server itself, which a deployed daemon keeps running).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from dagster import DagsterInstance, DagsterRun, reconstructable
from dagster._core.instance.ref import InstanceRef  # private paths; Dagster is pinned
from dagster._grpc.types import ExecuteRunArgs
from dagster._serdes import serialize_value

from bench.processes import start
from media_hooks.orchestration.definitions import deliver_webhooks_job

if TYPE_CHECKING:  # not imported by the fresh interpreter, whose start is measured
    from bench.session import Session

LAG_SENSOR = "delivery_lag_sensor"


@contextmanager
def daemon_instance(
    session: Session, url: str, storage: str
) -> Iterator[tuple[DagsterInstance, dict[str, str]]]:
    """An instance of its own DAGSTER_HOME on the session's database and Dagster storage, this
    process's environment bound to them as a daemon's is; and the environment of a run's
    process."""
    from bench.session import environment

    home = session.dagster_home()
    env = session.env(url, storage, DAGSTER_HOME=str(home))
    with environment(**env), DagsterInstance.from_config(str(home)) as instance:
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


def launch(instance: DagsterInstance, run_id: str, env: dict[str, str]) -> subprocess.Popen:
    """Launches the run in a fresh interpreter, as the DefaultRunLauncher's code server does."""
    run = instance.get_run_by_id(run_id)
    args = ExecuteRunArgs(
        job_origin=run.job_code_origin,
        run_id=run_id,
        instance_ref=InstanceRef.from_dir(env["DAGSTER_HOME"]),
        set_exit_code_on_failure=True,
    )
    # The code server's command, with this interpreter: `dagster` need not be on PATH.
    return start(
        [sys.executable, "-m", "dagster", "api", "execute_run", serialize_value(args)], env
    )


def settled(instance: DagsterInstance, run_id: str, process: subprocess.Popen) -> DagsterRun:
    """The run as it stands, failed first when its process ended before it did (as the
    daemon's run monitoring would fail it, so that the sensor may request another)."""
    run = instance.get_run_by_id(run_id)
    if run.is_finished or process.poll() is None:
        return run
    run = instance.get_run_by_id(run_id)  # again: what the process wrote before it ended
    if not run.is_finished:
        instance.report_run_failed(run)
    return instance.get_run_by_id(run_id)


def wait_finished(
    instance: DagsterInstance, run_id: str, process: subprocess.Popen, timeout: float
) -> DagsterRun:
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
