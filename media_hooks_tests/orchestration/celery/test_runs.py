"""Runs launched onto Celery workers (issue 31, items 2 and 3): the instance
``dagster-celery.yaml`` and its CeleryRunLauncher, with real workers on a real broker.

A launched run executes on a ``media-hooks worker --runs`` process and its steps on a steps
worker (dagster-io/dagster#32915's combination); a canceled run hands back what it holds; and a
run whose worker was SIGKILLed is marked failed by Dagster's own run monitoring (its function
called as the daemon calls it), after which the project's recovery releases its rows and the
next run delivers them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, reconstructable
from dagster._daemon.monitoring.run_monitoring import monitor_started_run

from media_hooks.devtools.celery_workers import executions
from media_hooks.devtools.receiver import Receiver, Reply
from media_hooks.orchestration.celery.settings import NODE_TAG
from media_hooks.orchestration.definitions import deliver_webhooks_job
from media_hooks.orchestration.instance import CELERY_INSTANCE_TEMPLATE
from media_hooks.orchestration.running import delivery_run_config
from media_hooks_tests.conftest import run_cli
from media_hooks_tests.factories import add_deliveries, add_destination, states
from media_hooks_tests.interleaving import wait_for

# Long, and what they prove does not depend on the PostgreSQL version.
pytestmark = pytest.mark.one_server
SILENCE_SECONDS = 2
FINISHED_SECONDS = 180


@pytest.fixture
def celery_instance(
    tmp_path: Path, celery_env: dict[str, str], own_instance, monkeypatch
) -> Iterator[DagsterInstance]:
    """An instance of ``dagster-celery.yaml`` (a worker judged gone after 2 s of silence) on
    the module's own, wiped storage: what the daemon and the webserver of the deployment use."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    launcher = "  class: CeleryRunLauncher\n"
    text = CELERY_INSTANCE_TEMPLATE.read_text()
    assert launcher in text
    silence = f"  config:\n    worker_silence_seconds: {SILENCE_SECONDS}\n"
    (home / "dagster.yaml").write_text(text.replace(launcher, launcher + silence))
    for key in (
        "MEDIA_HOOKS_CELERY_BROKER_URL",
        "MEDIA_HOOKS_CELERY_QUEUE",
        "MEDIA_HOOKS_DAGSTER_STORAGE_URL",
    ):
        monkeypatch.setenv(key, celery_env[key])
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with DagsterInstance.from_config(str(home)) as instance:
        yield instance


def _launch(instance: DagsterInstance, run_config: dict | None = None) -> DagsterRun:
    """A delivery run created with its code origin and launched, as the daemon does."""
    job = deliver_webhooks_job()
    run = instance.create_run_for_job(
        job_def=job,
        run_config=run_config or {},
        tags=job.tags,
        job_code_origin=reconstructable(deliver_webhooks_job).get_python_origin(),
    )
    instance.launch_run(run.run_id, workspace=None)  # the Celery launcher needs none
    return run


def _finished(instance: DagsterInstance, run_id: str) -> DagsterRun:
    wait_for(lambda: instance.get_run_by_id(run_id).is_finished, "the run to end", FINISHED_SECONDS)
    return instance.get_run_by_id(run_id)


def test_a_launched_run_on_a_run_worker_sends_its_steps_to_a_steps_worker(
    conn, celery_instance, workers
):
    (runner,) = workers.start(1, runs=True)
    (stepper,) = workers.start(1)
    with Receiver(reply=Reply(delay_seconds=0.05)) as receiver:
        add_destination(conn, "pub", receiver.url, rate_per_second=20, burst=2)
        add_deliveries(conn, "pub", 20)

        done = _finished(celery_instance, _launch(celery_instance).run_id)

        assert done.status == DagsterRunStatus.SUCCESS
        assert states(conn) == {"succeeded": 20}
        # The run's orchestration on the run worker; every step on the steps worker.
        assert done.tags[NODE_TAG] == runner.name
        executed = executions(celery_instance, done.run_id)
        assert set(executed) == {"prepare", "deliver_shard[shard_1_of_1]", "summarize_run"}
        assert {w for workers_of in executed.values() for w in workers_of} == {stepper.name}

        # Canceled through the launcher: the run ends CANCELED and its steps, on another
        # worker, hand back what they hold: nothing stays claimed.
        add_deliveries(conn, "pub", 400, prefix="slow")
        conn.execute("UPDATE webhook_destination SET rate_per_second = 5")
        run = _launch(celery_instance)
        wait_for(lambda: receiver.request_count >= 25, "the second run to deliver", 120)
        assert celery_instance.run_launcher.terminate(run.run_id)

        assert _finished(celery_instance, run.run_id).status == DagsterRunStatus.CANCELED
        # The step on the steps worker sees the cancel at its next look (every 2 s).
        wait_for(
            lambda: set(states(conn)) == {"succeeded", "pending"},
            "the canceled run's step to hand back what it held",
            60,
        )
        assert sum(states(conn).values()) == 420


def test_run_monitoring_fails_a_run_whose_worker_was_killed(
    conn, celery_env, celery_instance, workers
):
    (runner,) = workers.start(1, runs=True)
    with Receiver(reply=Reply(delay_seconds=0.2)) as receiver:
        add_destination(conn, "pub", receiver.url, rate_per_second=10, burst=2, max_in_flight=2)
        ids = add_deliveries(conn, "pub", 60)
        # The steps in the run worker's own process: the run is the worker's only task.
        in_process = delivery_run_config({}, execution={"config": {"in_process": {}}})
        run = _launch(celery_instance, in_process)
        wait_for(lambda: receiver.request_count >= 10, "the run to deliver", 120)
        workers.kill(runner)

        # Dagster's run monitoring, as the daemon runs it every poll interval.
        def monitored_failed() -> bool:
            record = celery_instance.get_run_record_by_id(run.run_id)
            if record.dagster_run.status == DagsterRunStatus.STARTED:
                monitor_started_run(celery_instance, None, record, logging.getLogger("test"))
            return celery_instance.get_run_by_id(run.run_id).status == DagsterRunStatus.FAILURE

        wait_for(monitored_failed, "run monitoring to fail the run", 60)
        messages = [
            r.event_log_entry.dagster_event.message
            for r in celery_instance.get_records_for_run(run.run_id).records
            if r.event_log_entry.dagster_event is not None
        ]
        assert any(f"no answer from the Celery worker {runner.name}" in (m or "") for m in messages)
        assert set(states(conn)) >= {"enqueued"}  # left claimed by the dead run

        # The project's recovery (here `media-hooks run`, on the local default) releases the
        # failed run's rows, and its run delivers them.
        local = {k: v for k, v in celery_env.items() if not k.startswith("MEDIA_HOOKS_CELERY_")}
        done = run_cli("run", "--until-idle", "--max-seconds", "150", "--json", env=local)

        assert done.returncode == 0, done.stderr
    assert states(conn) == {"succeeded": 60}
    repeated = {i for i, n in receiver.requests_by_id.items() if n > 1}
    ambiguous = {
        r["delivery_id"]
        for r in conn.execute(
            "SELECT delivery_id FROM delivery_attempt_all WHERE outcome = 'ambiguous'"
        ).fetchall()
    }
    assert repeated <= ambiguous
    assert receiver.accepted_ids == set(ids)
    check = run_cli("check", env=local)
    assert check.returncode == 0, check.stdout
