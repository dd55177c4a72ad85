"""Runs launched as the daemon launches them (``instance.launch_run``), through the instance's
``WarmRunLauncher``: forked from the warm server, terminated, failed before they start, and
launched again after the server died.

The runs are real: created for ``deliver_webhooks`` with its code origin, as the daemon
creates them, delivering this test's rows to a receiver the test starts.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Callable, Iterator

import psutil
import pytest
from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, reconstructable
from dagster._core.errors import DagsterInvariantViolationError

from media_hooks.orchestration import launcher as launcher_module
from media_hooks.orchestration import run_workers
from media_hooks.orchestration.definitions import deliver_webhooks_job
from media_hooks.orchestration.jobs import DELIVERY_EXECUTION
from media_hooks.orchestration.launcher import (
    LaunchUnanswered,
    WarmRunLauncher,
    ZygoteUnavailable,
)
from media_hooks.orchestration.running import delivery_run_config
from media_hooks.receiver import Receiver, Reply
from media_hooks_tests.factories import add_deliveries, add_destination, states
from media_hooks_tests.interleaving import wait_for

# What these prove is process mechanics (forks, signals and Dagster's run records), the same
# on any PostgreSQL version: CI runs them on the embedded server only.
pytestmark = pytest.mark.one_server

FINISH_SECONDS = 120.0  # a loaded machine starting the server and the run
HELD_SECONDS = 10.0


@pytest.fixture
def launcher(instance: DagsterInstance) -> WarmRunLauncher:
    launcher = instance.run_launcher
    assert isinstance(launcher, WarmRunLauncher)  # what the project's dagster.yaml configures
    return launcher


def _create_run(instance: DagsterInstance, database_url: str, origin=None) -> str:
    """A run of ``deliver_webhooks`` as the daemon creates one: with its code origin."""
    run = instance.create_run_for_job(
        deliver_webhooks_job(),
        run_config=delivery_run_config(
            {}, execution=DELIVERY_EXECUTION, resources={"postgres": {"database_url": database_url}}
        ),
        job_code_origin=origin or reconstructable(deliver_webhooks_job).get_python_origin(),
    )
    return run.run_id


def _finished(instance: DagsterInstance, run_id: str):
    wait_for(
        lambda: instance.get_run_by_id(run_id).is_finished,
        f"run {run_id} to finish",
        FINISH_SECONDS,
    )
    return instance.get_run_by_id(run_id)


def _engine_messages(instance: DagsterInstance, run_id: str) -> list[str]:
    records = instance.get_records_for_run(run_id, of_type=DagsterEventType.ENGINE_EVENT).records
    return [record.event_log_entry.dagster_event.message or "" for record in records]


@pytest.fixture
def receiver_at(conn) -> Iterator[Callable[..., Receiver]]:
    started: list[Receiver] = []

    def start(**options) -> Receiver:
        receiver = Receiver(**options).start()
        started.append(receiver)
        add_destination(conn, "cdn", receiver.url, timeout_seconds=120, max_in_flight=2)
        return receiver

    yield start
    for receiver in started:
        receiver.stop()


def test_launched_runs_are_forked_from_one_warm_server_and_deliver(
    instance, launcher, database_url, conn, receiver_at
):
    receiver = receiver_at()
    add_deliveries(conn, "cdn", 3)
    first = _create_run(instance, database_url)

    instance.launch_run(first, workspace=None)
    server = launcher.zygote.pid
    assert _finished(instance, first).status == DagsterRunStatus.SUCCESS
    assert states(conn) == {"succeeded": 3}

    add_deliveries(conn, "cdn", 2, prefix="second-")
    second = _create_run(instance, database_url)
    instance.launch_run(second, workspace=None)
    assert _finished(instance, second).status == DagsterRunStatus.SUCCESS
    assert states(conn) == {"succeeded": 5}
    assert receiver.effects == 5

    # One server forked both; each run was executed by the process it forked, as Dagster's
    # own run worker executes one (its "Started process for run" event).
    assert launcher.zygote.pid == server and psutil.pid_exists(server)
    for run_id in (first, second):
        worker = run_workers.worker_of(instance.get_run_by_id(run_id))
        assert worker is not None and worker.pid not in (os.getpid(), server)
        messages = _engine_messages(instance, run_id)
        assert f"Launched in a process forked from the warm run server (pid {worker.pid})." in (
            messages
        )
        assert f"Started process for run (pid: {worker.pid})." in messages


def test_terminate_from_another_process_cancels_a_run_mid_send(
    instance, launcher, dagster_home, database_url, conn, receiver_at
):
    # Holds each request long enough for the terminate request to arrive while it waits.
    receiver = receiver_at(reply=Reply(delay_seconds=HELD_SECONDS))
    add_deliveries(conn, "cdn", 4)
    run_id = _create_run(instance, database_url)
    instance.launch_run(run_id, workspace=None)
    assert receiver.wait_for(lambda r: r.max_in_flight >= 2, timeout=FINISH_SECONDS)

    # The webserver's instance, not the daemon's, asks (the UI's Terminate button).
    with DagsterInstance.from_config(str(dagster_home)) as webserver:
        assert webserver.run_launcher.terminate(run_id) is True

    assert _finished(instance, run_id).status == DagsterRunStatus.CANCELED
    # The two sends in flight ended; the other two were never sent, and nothing is left
    # leased to the canceled run.
    assert receiver.request_count == 2
    assert "leased" not in states(conn)
    assert sum(states(conn).values()) == 4


def test_a_run_that_cannot_start_fails_at_once(instance, launcher, database_url, conn):
    add_destination(conn, "cdn", "http://127.0.0.1:9/")
    origin = reconstructable(deliver_webhooks_job).get_python_origin()
    missing = origin._replace(
        repository_origin=origin.repository_origin._replace(
            code_pointer=origin.repository_origin.code_pointer._replace(fn_name="no_such_job")
        )
    )
    run_id = _create_run(instance, database_url, origin=missing)

    instance.launch_run(run_id, workspace=None)

    run = _finished(instance, run_id)
    assert run.status == DagsterRunStatus.FAILURE  # not STARTING until run monitoring gives up
    # Why, in the run's own log: the error loading its job.
    logged = [r.event_log_entry for r in instance.get_records_for_run(run_id).records]
    errors = [entry.dagster_event.event_specific_data.error for entry in logged if _is_error(entry)]
    assert any("no_such_job" in error.message for error in errors), errors


def _is_error(entry) -> bool:
    data = entry.dagster_event.event_specific_data if entry.dagster_event else None
    return getattr(data, "error", None) is not None


def test_a_dead_server_is_replaced_by_the_next_launch(
    instance, launcher, database_url, conn, receiver_at
):
    receiver_at()
    add_deliveries(conn, "cdn", 1)
    warmup = _create_run(instance, database_url)
    instance.launch_run(warmup, workspace=None)
    assert _finished(instance, warmup).status == DagsterRunStatus.SUCCESS
    dead = launcher.zygote.pid
    os.kill(dead, signal.SIGKILL)
    wait_for(lambda: not psutil.pid_exists(dead) or _zombie(dead), "the server to die")

    add_deliveries(conn, "cdn", 2, prefix="after-")
    run_id = _create_run(instance, database_url)
    instance.launch_run(run_id, workspace=None)

    assert _finished(instance, run_id).status == DagsterRunStatus.SUCCESS
    assert launcher.zygote.pid not in (None, dead)
    assert states(conn) == {"succeeded": 3}


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_run_of_another_interpreter_goes_to_its_code_server(instance, launcher, database_url):
    origin = reconstructable(deliver_webhooks_job).get_python_origin()
    elsewhere = origin._replace(
        repository_origin=origin.repository_origin._replace(
            executable_path=sys.executable + "-elsewhere"
        )
    )
    run_id = _create_run(instance, database_url, origin=elsewhere)
    server = launcher.zygote.pid

    # The DefaultRunLauncher's path: it needs the workspace's code server, which a run
    # launched without one cannot reach.
    with pytest.raises(DagsterInvariantViolationError, match="requires a workspace"):
        instance.launch_run(run_id, workspace=None)
    assert launcher.zygote.pid == server
    assert instance.get_run_by_id(run_id).status == DagsterRunStatus.FAILURE


def test_a_server_that_cannot_start_fails_the_launch_and_says_why(
    instance, launcher, database_url, monkeypatch
):
    launcher.zygote.close()
    monkeypatch.setattr(launcher_module, "ZYGOTE_MODULE", "media_hooks.no_such_module")
    run_id = _create_run(instance, database_url)

    # With no code server to fall back on (the daemon passes its workspace), the launch fails
    # and the run with it: nothing is left STARTING.
    with pytest.raises(ZygoteUnavailable, match="did not start"):
        instance.launch_run(run_id, workspace=None)
    assert launcher.zygote.pid is None
    assert instance.get_run_by_id(run_id).status == DagsterRunStatus.FAILURE
    assert any("did not start" in message for message in _engine_messages(instance, run_id))


def test_a_server_that_takes_the_run_and_ends_is_not_asked_again(
    instance, launcher, database_url, monkeypatch
):
    launcher.zygote.close()
    monkeypatch.setattr(
        launcher_module, "ZYGOTE_MODULE", "media_hooks_tests.orchestration.silent_zygote"
    )
    run_id = _create_run(instance, database_url)

    # It may have forked a process that executes the run: launching it again (another server,
    # the code server) could start a second one. The launch fails instead, and the run with it.
    with pytest.raises(LaunchUnanswered, match="did not answer: it ended"):
        instance.launch_run(run_id, workspace=None)
    assert launcher.zygote.pid is None
    assert instance.get_run_by_id(run_id).status == DagsterRunStatus.FAILURE


def test_terminating_a_run_whose_process_is_gone_says_so(instance, launcher, database_url):
    run_id = _create_run(instance, database_url)
    # This process's pid with another start time: a pid reused after the worker died.
    gone = run_workers.Worker(run_id, socket.gethostname(), os.getpid(), started=0.0)
    instance.add_run_tags(run_id, gone.tag())

    assert launcher.terminate(run_id) is False

    assert instance.get_run_by_id(run_id).status == DagsterRunStatus.CANCELING
    assert f"Cannot interrupt the run: its process ({gone.describe()}) is gone." in (
        _engine_messages(instance, run_id)
    )
