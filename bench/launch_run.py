"""Executes one run the benchmark's sensor loop created, as the daemon's run launcher would.

    python -m bench.launch_run RUN_ID     (DAGSTER_HOME and the storage from the environment)

The loop in ``bench.latency`` evaluates the lag sensor and, for each run it requests, creates
the run in the instance at once (so the next tick sees it in flight, as under the daemon) and
starts this process to execute it: a process of its own, importing the project, like the
process Dagster's default run launcher starts.
"""

from __future__ import annotations

import sys

from dagster import DagsterInstance, reconstructable

# Dagster's own entry point for executing an existing run (what `dagster api execute_run`
# calls); the Dagster family is pinned exactly, so its private path is stable here.
from dagster._core.execution.api import execute_run

LAG_SENSOR = "delivery_lag_sensor"


def lag_sensor_job():
    """The job the lag sensor targets, with its resources: what each step process rebuilds."""
    from media_hooks.orchestration.definitions import defs

    return defs.resolve_job_def(defs.resolve_sensor_def(LAG_SENSOR).job_name)


def main() -> int:
    # Imported by name, not as __main__, so that step processes can rebuild the job from it.
    from bench.launch_run import lag_sensor_job as target

    with DagsterInstance.get() as instance:
        run = instance.get_run_by_id(sys.argv[1])
        result = execute_run(reconstructable(target), run, instance)
    return 0 if result.success else 1


if __name__ == "__main__":
    sys.exit(main())
