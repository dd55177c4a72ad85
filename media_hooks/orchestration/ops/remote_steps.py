"""What a delivery step does because it may execute on another host than its run's
orchestration (a Celery worker, a Kubernetes pod): the run's process can neither hand back what
a dead attempt of the step claimed nor interrupt the step when the run is canceled.

- ``release_earlier_attempt``: a step executing again (its worker died and the broker gave its
  task to another worker, or Dagster retried it) first makes due again what the earlier attempt
  left claimed on its destinations, for this attempt to deliver.
- ``stopped_with_the_run``: a step on a Celery worker watches its run, and hands back what it
  holds once the run is canceling, canceled or failed, as an interrupted step does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
from dagster import DagsterEventType, DagsterRunStatus, OpExecutionContext

from media_hooks.orchestration.celery.settings import current_task
from media_hooks.outbox import destinations
from media_hooks.outbox.maintenance import sweeps


def _started_before(context: OpExecutionContext) -> bool:
    """Whether an earlier attempt of this step started in this run: a Dagster retry, or the
    Celery task of a worker that died, delivered again to another worker."""
    if context.retry_number > 0:
        return True
    starts = context.instance.get_records_for_run(
        context.run_id, of_type=DagsterEventType.STEP_START
    ).records
    step_key = context.get_step_execution_context().step.key
    return sum(1 for r in starts if r.event_log_entry.step_key == step_key) > 1


def release_earlier_attempt(
    context: OpExecutionContext, conn: psycopg.Connection, serves: Callable[[str], bool]
) -> None:
    """What an earlier attempt of this step left claimed becomes due again, for this attempt
    to deliver: a worker that died mid-step hands nothing back itself."""
    if not _started_before(context):
        return
    served = [
        d["destination_id"]
        for d in destinations.list_destinations(conn)
        if serves(d["destination_id"])
    ]
    released = sweeps.release_step(conn, context.run_id, served)
    context.log.warning(
        f"an earlier attempt of this step started in this run: {released} delivery(ies) it "
        "left claimed are due again"
    )


# How often a step on a Celery worker looks whether its run is still wanted.
RUN_WATCH_SECONDS = 2.0
_STOPPING = (DagsterRunStatus.CANCELING, DagsterRunStatus.CANCELED, DagsterRunStatus.FAILURE)


@contextmanager
def stopped_with_the_run(context: OpExecutionContext) -> Iterator[threading.Event]:
    """An event set once the run is canceling, canceled or failed. A step in its run's own
    process gets the run's interrupt; one on a Celery worker does not (dagster-celery only
    revokes a task that has not started), so it watches the run, and then hands back what it
    holds as an interrupted step does."""
    stop = threading.Event()
    if current_task() is None:
        yield stop
        return
    done = threading.Event()

    def watch() -> None:
        while not done.wait(RUN_WATCH_SECONDS):
            run = context.instance.get_run_by_id(context.run_id)
            if run is None or run.status in _STOPPING:
                context.log.warning(f"the run is {run.status.value if run else 'gone'}: stopping")
                stop.set()
                return

    watcher = threading.Thread(target=watch, name="run-watch", daemon=True)
    watcher.start()
    try:
        yield stop
    finally:
        done.set()
        watcher.join()
