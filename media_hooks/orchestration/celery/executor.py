"""The delivery job's ``celery`` executor (``orchestration/executors.py``): dagster-celery's,
with the deployment's settings. Each step is a Celery task on a ``media-hooks worker``, the
broker from ``MEDIA_HOOKS_CELERY_BROKER_URL``; setting that variable makes it the default, so the
schedule, the sensors and ``media-hooks run`` send their steps to the workers with no change to
any run config.

Before the first step is sent, the run's orchestrator asks the broker which workers serve the
steps' queue: a broker that does not answer, or no worker, fails the run at once with one line
(nothing claimed, no run left waiting for a worker that is not there), and the number of worker
processes becomes the run's default number of shards (``prepare`` reads it from the run's tag).

dagster-io/dagster#32915: a run launched by the CeleryRunLauncher executes inside a Celery task,
and dagster-celery's executor then reads its steps' results there, which Celery refuses ("Never
call result.get() within a task!"): it guards a task that blocks on others, which could wait for
ever when those others need the worker slot it holds. dagster-celery only reads a result once it
is ready (it polls), so the run's orchestration marks its reads as allowed, and the deadlock is
ruled out by the workers themselves: launched runs are served by ``media-hooks worker --runs``,
which never takes a step, so a run's steps never wait for a slot that a run holds.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import nullcontext
from typing import Any

from dagster import Executor

from media_hooks.orchestration.celery import settings as celery_settings
from media_hooks.orchestration.celery.settings import CelerySettings

# The run's Celery workers serving its steps, with their processes: {node: processes}.
WORKERS_TAG = "media_hooks/celery_step_workers"


def create_executor(config: dict[str, Any]) -> Executor:
    """The ``celery`` choice: dagster-celery's executor on the deployment's settings (a run's
    ``broker`` and ``config_source`` given in its run config take precedence)."""
    from dagster._core.execution.retries import RetryMode
    from dagster_celery.executor import CeleryExecutor

    from media_hooks.orchestration.celery import app as celery_app

    configured = CelerySettings.from_env()
    broker = config.get("broker") or (configured.broker_url if configured else None)
    if broker is None:
        raise celery_settings.missing_broker()
    settings = CelerySettings(
        broker, configured.queue_prefix if configured else celery_settings.DEFAULT_QUEUE
    )
    inner = CeleryExecutor(
        retries=RetryMode.from_config(config["retries"]),
        broker=broker,
        backend=config.get("backend") or celery_app.RESULT_BACKEND,
        include=config.get("include"),
        config_source=celery_app.config_source(settings, config.get("config_source")),
    )
    return CeleryDelivery(inner, settings)


class CeleryDelivery(Executor):
    """dagster-celery's executor, after a check that the broker answers and workers serve the
    steps' queue."""

    def __init__(self, inner: Executor, settings: CelerySettings) -> None:
        self._inner = inner
        self.settings = settings

    @property
    def retries(self):
        return self._inner.retries

    def app_args(self) -> dict:
        # dagster-celery's execution loop builds its application from the run's executor.
        return self._inner.app_args()

    def execute(self, plan_context, execution_plan) -> Iterator:
        from celery.result import allow_join_result
        from dagster_celery.make_app import make_app

        from media_hooks.orchestration.celery import app as celery_app

        app = make_app(self._inner.app_args())
        celery_app.check_broker(app, self.settings)
        workers = celery_app.step_slots(app, self.settings)
        if not workers:
            raise NoStepWorkers(
                f"no Celery worker serves the queue {self.settings.steps_queue} on "
                f"{self.settings.shown_broker}: start one with `media-hooks worker`"
            )
        plan_context.instance.add_run_tags(
            plan_context.run_id, {WORKERS_TAG: json.dumps(workers, separators=(",", ":"))}
        )
        events = self._inner.execute(plan_context, execution_plan)
        # In a run launched as a Celery task (the CeleryRunLauncher), see the module docstring.
        joins = allow_join_result if celery_settings.current_task() is not None else nullcontext
        while True:
            with joins():
                event = next(events, None)
            if event is None:
                return
            yield event


class NoStepWorkers(Exception):
    """No worker serves the steps' queue: the run would wait for one for ever."""


def step_processes(tags: dict[str, str]) -> int | None:
    """The number of Celery worker processes a run found serving its steps; None when its
    steps do not execute on Celery."""
    raw = tags.get(WORKERS_TAG)
    if not raw:
        return None
    try:
        return sum(int(n) for n in json.loads(raw).values()) or None
    except (ValueError, TypeError, AttributeError):
        return None
