"""The deployment's Celery application: the same settings on the client (a run that sends its
steps, the launcher that sends runs) and on every worker; the broker's reachability; which
workers serve the delivery steps; and a worker's start.
"""

from __future__ import annotations

import logging
import os
import socket
import warnings
from typing import Any

from celery import Celery
from celery.exceptions import DuplicateTaskNameWarning
from dagster_celery.config import dict_wrapper
from dagster_celery.make_app import make_app

from media_hooks.core.errors import RuntimeFailure, first_line
from media_hooks.orchestration.celery.settings import CelerySettings

# dagster-celery defines its task again for every step (and run) it sends; the first definition
# serves them all, so Celery's warning would only repeat in every run's log.
warnings.filterwarnings("ignore", category=DuplicateTaskNameWarning)

# Results go back to the client that sent the task, over the broker: only a run's own
# orchestrator reads a step's result, and nothing reads a run task's.
RESULT_BACKEND = "rpc://"
# How long a question to every worker (which queues, how many processes) waits for answers.
INSPECT_SECONDS = 1.0
# A connection to the broker that does not succeed within this is a broker that is down.
CONNECT_SECONDS = 4.0


class BrokerUnreachable(RuntimeFailure):
    """The broker did not answer: one line naming it, never its password."""


def _conf(settings: CelerySettings) -> dict[str, Any]:
    return {
        "task_default_queue": settings.steps_queue,
        # A step's task is acknowledged when it ends, not when it starts: the task of a worker
        # that dies mid-step (SIGKILL, a lost host) goes back to the queue, to another worker,
        # where the step first releases what the dead one left claimed (ops/delivery.py).
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        # One task at a time per worker process and none reserved ahead: a shard waits in the
        # queue for a free process, never behind a busy one.
        "worker_prefetch_multiplier": 1,
        "broker_connection_timeout": CONNECT_SECONDS,
        # Publishing gives up after a few quick tries: a broker that is down fails the run
        # (or the launch) with one line, instead of holding it.
        "broker_transport_options": {
            "max_retries": 2,
            "interval_start": 0,
            "interval_step": 0.5,
            "interval_max": 1,
        },
        "task_publish_retry_policy": {"max_retries": 2, "interval_start": 0, "interval_step": 0.5},
    }


def config_source(settings: CelerySettings, overrides: dict[str, Any] | None = None) -> dict:
    """The Celery settings of the deployment, with a run's own ``config_source`` on top."""
    return {**_conf(settings), **(overrides or {})}


def make(settings: CelerySettings) -> Celery:
    """The application, as dagster-celery builds it (its queues and routes) with ours."""
    return make_app(
        {
            "broker": settings.broker_url,
            "backend": RESULT_BACKEND,
            "include": [],
            "config_source": dict_wrapper(config_source(settings)),
        }
    )


def check_broker(app: Celery, settings: CelerySettings) -> None:
    """Connects to the broker once; BrokerUnreachable when it does not answer."""
    try:
        with app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1, timeout=CONNECT_SECONDS)
    except Exception as exc:
        raise BrokerUnreachable(
            f"cannot reach the Celery broker at {settings.shown_broker}: {first_line(exc)}"
        ) from None


def step_slots(app: Celery, settings: CelerySettings) -> dict[str, int]:
    """The workers serving the delivery steps' queue, each with its number of processes (one
    step at a time each). Asked of the workers through the broker: those that answer within
    ``INSPECT_SECONDS``."""
    queues = app.control.inspect(timeout=INSPECT_SECONDS).active_queues() or {}
    nodes = sorted(
        node
        for node, served in queues.items()
        if any(q["name"] == settings.steps_queue for q in served)
    )
    if not nodes:
        return {}
    stats = (
        app.control.inspect(destination=nodes, timeout=INSPECT_SECONDS, limit=len(nodes)).stats()
        or {}
    )
    return {
        node: int(stats.get(node, {}).get("pool", {}).get("max-concurrency", 1)) for node in nodes
    }


def run_worker(
    app: Celery, settings: CelerySettings, *, runs: bool, concurrency: int, name: str, loglevel: str
) -> None:
    """Starts a worker of ``app`` in this process until it is stopped: the delivery steps'
    tasks, or with ``runs`` the launched runs' (CeleryRunLauncher)."""
    from dagster_celery.tasks import create_execute_job_task, create_resume_job_task, create_task

    if runs:
        # A run is not delivered again to another worker when its worker dies: Dagster's run
        # monitoring marks it failed (launcher.py), and the next run takes up its work. Nothing
        # reads a run task's result.
        for create in (create_execute_job_task, create_resume_job_task):
            create(app, acks_late=False, ignore_result=True)
    else:
        create_task(app)
    # The project's code, loaded once here, before Celery forks its processes: a task starts
    # on code that is already imported.
    import media_hooks.orchestration.definitions  # noqa: F401

    # Celery puts every logger at the worker's level; Dagster's storage loads alembic, whose
    # INFO lines (a dozen "setup plugin" per process) say nothing about the work.
    logging.getLogger("alembic").setLevel(logging.WARNING)

    app.worker_main(
        [
            "worker",
            f"--queues={settings.runs_queue if runs else settings.steps_queue}",
            f"--concurrency={concurrency}",
            f"--hostname={name}",
            f"--loglevel={loglevel}",
            # No gossip or mingle between workers: they share nothing but the broker and
            # PostgreSQL, and a start then takes a second less.
            "--without-gossip",
            "--without-mingle",
        ]
    )


def default_name(runs: bool) -> str:
    """A node name unique on this host (Celery's own default is the same for every worker)."""
    return f"media_hooks_{'runs' if runs else 'steps'}_{os.getpid()}@{socket.gethostname()}"
