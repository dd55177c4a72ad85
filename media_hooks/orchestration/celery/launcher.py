"""dagster-celery's CeleryRunLauncher, for the instance ``dagster-celery.yaml``: each launched
run a Celery task on a ``media-hooks worker --runs`` process, which has the project's code loaded
(no process to start, no code to import per run).

What it adds to dagster-celery's launcher:

- The broker and the runs' queue come from the environment (``MEDIA_HOOKS_CELERY_BROKER_URL``,
  ``MEDIA_HOOKS_CELERY_QUEUE``), like the workers'; the instance YAML names no secret.
- A launch while the broker is down fails at once with one line naming the broker (never its
  password); Dagster records the run as failed, never STARTED.
- The health check that Dagster's run monitoring calls asks the run's worker itself. dagster-celery
  reads the run task's state from the result backend, and a worker killed with SIGKILL (its
  host lost, the OOM killer) leaves that state STARTED for ever, so its run would stay STARTED
  (dagster-io/dagster#33493). Here the worker that executes the run (recorded on the run by the
  delivery executor, ``jobs.py``) is asked whether it still runs the task: no, or no answer for
  ``worker_silence_seconds``, and Dagster marks the run failed. Its rows are then released by
  the run-failure sensor, and the lag sensor starts a catch-up run.
- A run is stopped (``terminate``) with SIGINT, Dagster's interrupt: the run's steps hand back
  what they hold and the run ends CANCELED, where dagster-celery's SIGTERM killed the process.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from dagster import Field, IntSource, StringSource
from dagster._core.launcher import CheckRunHealthResult, LaunchRunContext, WorkerStatus
from dagster._serdes import ConfigurableClassData
from dagster_celery.launcher import CeleryRunLauncher as DagsterCeleryRunLauncher
from dagster_celery.tags import DAGSTER_CELERY_TASK_ID_TAG

from media_hooks.orchestration.celery import app as celery_app
from media_hooks.orchestration.celery.settings import (
    DEFAULT_QUEUE,
    NODE_TAG,
    CelerySettings,
    missing_broker,
)

DEFAULT_SILENCE_SECONDS = 60
# States in which a worker reports a task it holds (celery.worker.control.query_task).
_HELD = {"active", "reserved"}


class CeleryRunLauncher(DagsterCeleryRunLauncher):
    def __init__(
        self,
        inst_data: ConfigurableClassData | None = None,
        broker: str | None = None,
        backend: str | None = None,
        include: list[str] | None = None,
        default_queue: str | None = None,
        config_source: dict | None = None,
        worker_silence_seconds: int = DEFAULT_SILENCE_SECONDS,
    ) -> None:
        configured = CelerySettings.from_env()
        if broker is None and configured is None:
            raise missing_broker()
        self.settings = CelerySettings(
            broker or configured.broker_url,
            configured.queue_prefix if configured else DEFAULT_QUEUE,
        )
        self.worker_silence_seconds = worker_silence_seconds
        # Runs whose worker did not answer, with when that was first seen (this process's
        # clock): a worker is judged gone only once it stayed silent that long.
        self._silent_since: dict[str, float] = {}
        super().__init__(
            default_queue=default_queue or self.settings.runs_queue,
            broker=self.settings.broker_url,
            backend=backend or celery_app.RESULT_BACKEND,
            include=include,
            config_source=celery_app.config_source(self.settings, config_source),
            inst_data=inst_data,
        )

    @classmethod
    def config_type(cls) -> dict[str, Any]:
        return {
            **super().config_type(),
            "broker": Field(
                StringSource,
                is_required=False,
                description="The broker's URL; default: MEDIA_HOOKS_CELERY_BROKER_URL.",
            ),
            "default_queue": Field(
                StringSource,
                is_required=False,
                description="The queue runs are sent to; default: <MEDIA_HOOKS_CELERY_QUEUE>_runs "
                "(media_hooks_runs), which `media-hooks worker --runs` serves.",
            ),
            "worker_silence_seconds": Field(
                IntSource,
                is_required=False,
                default_value=DEFAULT_SILENCE_SECONDS,
                description="A run whose worker has not answered for this long is marked "
                "failed by run monitoring.",
            ),
        }

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]
    ) -> CeleryRunLauncher:
        return cls(inst_data=inst_data, **config_value)

    def launch_run(self, context: LaunchRunContext) -> None:
        celery_app.check_broker(self.celery, self.settings)
        super().launch_run(context)

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id)
        if run is None or DAGSTER_CELERY_TASK_ID_TAG not in run.tags:
            return False
        self._instance.report_run_canceling(run)
        self.celery.control.revoke(
            run.tags[DAGSTER_CELERY_TASK_ID_TAG], terminate=True, signal="SIGINT"
        )
        return True

    def check_run_worker_health(self, run) -> CheckRunHealthResult:
        task_id = run.tags.get(DAGSTER_CELERY_TASK_ID_TAG)
        if task_id is None:
            # Not launched here (`media-hooks run` executes its runs itself): the project's
            # recovery judges its worker process (orchestration/recovery.py).
            return CheckRunHealthResult(WorkerStatus.RUNNING, "not a Celery-launched run")
        node = run.tags.get(NODE_TAG)
        answers = self._ask(task_id, node)
        if any(_holds(answer, task_id) for answer in answers.values()):
            self._silent_since.pop(run.run_id, None)
            return CheckRunHealthResult(WorkerStatus.RUNNING)
        if node is not None and node in answers:
            self._silent_since.pop(run.run_id, None)
            return CheckRunHealthResult(
                WorkerStatus.FAILED,
                f"the Celery worker {node} no longer executes this run's task (it restarted)",
            )
        first = self._silent_since.setdefault(run.run_id, time.monotonic())
        silent = time.monotonic() - first
        if silent < self.worker_silence_seconds:
            return CheckRunHealthResult(WorkerStatus.RUNNING, f"no answer for {silent:.0f} s")
        self._silent_since.pop(run.run_id, None)
        who = f"the Celery worker {node}" if node else "any Celery worker"
        return CheckRunHealthResult(
            WorkerStatus.FAILED,
            f"no answer from {who} about this run's task in {silent:.0f} s "
            "(killed, or its host lost)",
        )

    def _ask(self, task_id: str, node: str | None) -> dict[str, dict]:
        """Which workers hold ``task_id``: the recorded one, else any. Raises when the broker
        is unreachable: that is no evidence about the worker, and run monitoring then logs
        the error and judges nothing."""
        celery_app.check_broker(self.celery, self.settings)
        inspect = self.celery.control.inspect(
            destination=[node] if node else None,
            timeout=celery_app.INSPECT_SECONDS,
            limit=1 if node else None,
        )
        return inspect.query_task(task_id) or {}


def _holds(answer: dict, task_id: str) -> bool:
    state = (answer.get(task_id) or [None])[0]
    return state in _HELD
