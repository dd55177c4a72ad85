"""`media-hooks run` killed, bounded and cut off from its database (issue 10, items 1, 2, 4).

Each test runs the command as a real process (in a session of its own, so that it can be
killed with its whole process group), then checks Dagster's run state, the delivery pool and
the rows. The Dagster instance is the module's own (``own_instance``), shared with the command
through MEDIA_HOOKS_DAGSTER_STORAGE_URL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from dagster import DagsterEventType, DagsterRunStatus, RunsFilter

from media_hooks.devtools.receiver import Receiver, Reply
from media_hooks.orchestration import instance as instance_module
from media_hooks.orchestration.ops.delivery import DELIVERY_POOL
from media_hooks.orchestration.recovery import RELEASED_TAG
from media_hooks_tests.conftest import run_cli, start_cli
from media_hooks_tests.factories import add_deliveries, add_destination, states
from media_hooks_tests.orchestration.conftest import hold_pool_slot, slot_holders
from media_hooks_tests.outage import database_proxy

# How long Python takes to start before `media-hooks run` starts counting --max-seconds.
STARTUP_ALLOWANCE = 10.0
# Long enough for a loaded machine to start the command and its run's first steps.
MAX_SECONDS = 25
GRACE_SECONDS = 15.0  # the default MEDIA_HOOKS_RUN_STOP_GRACE_SECONDS


@pytest.fixture
def env(cli_env, own_storage_url):
    return dict(cli_env, MEDIA_HOOKS_DAGSTER_STORAGE_URL=own_storage_url)


@pytest.fixture
def pool_of_one(own_instance):
    """The delivery pool limited to one step at a time: one leaked slot stops every run."""
    own_instance.event_log_storage.set_concurrency_slots(DELIVERY_POOL, 1)
    return own_instance.event_log_storage


def _start_cli(*args: str, env: dict[str, str]) -> subprocess.Popen:
    return start_cli(*args, env=env, own_session=True)


def _delivery_runs(instance) -> list:
    return list(instance.get_runs(RunsFilter(job_name="deliver_webhooks")))


def _end_message(instance, run_id: str) -> str:
    ends = instance.get_records_for_run(
        run_id, of_type={DagsterEventType.RUN_FAILURE, DagsterEventType.RUN_CANCELED}
    ).records
    return ends[-1].event_log_entry.dagster_event.message


def test_a_killed_run_leaves_nothing_stuck_for_the_next(
    env, conn, own_instance, pool_of_one, gated
):
    receiver, gate = gated
    add_destination(conn, "cdn", receiver.url, timeout_seconds=120, max_in_flight=2)
    ids = add_deliveries(conn, "cdn", 6)

    killed = _start_cli("run", env=env)
    assert receiver.wait_for(lambda r: r.max_in_flight >= 2, timeout=120), killed.stderr
    os.killpg(killed.pid, signal.SIGKILL)  # the OOM killer, a lost node
    killed.wait(timeout=30)

    (dead,) = _delivery_runs(own_instance)
    assert dead.status == DagsterRunStatus.STARTED  # Dagster cannot tell
    assert slot_holders(pool_of_one) == [dead.run_id]  # the only slot of the pool
    assert states(conn) == {"enqueued": 4, "leased": 2}

    gate.open.set()
    done = run_cli("run", "--until-idle", "--max-seconds", "120", "--json", env=env, timeout=180)

    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    (recovered,) = document["recovered"]
    assert recovered["run_id"] == dead.run_id
    assert recovered["reason"].startswith(f"its worker process (pid {killed.pid} on ")
    assert recovered["released"] == 6
    assert sum(run["succeeded"] for run in document["runs"]) == 6
    failed = own_instance.get_run_by_id(dead.run_id)
    assert failed.status == DagsterRunStatus.FAILURE
    assert failed.tags[RELEASED_TAG] == "6"
    assert f"worker process (pid {killed.pid} on" in _end_message(own_instance, dead.run_id)
    assert slot_holders(pool_of_one) == []
    assert states(conn) == {"succeeded": 6}
    # The two sends the kill cut off are closed as ambiguous, the reason for their second send.
    cut_off = conn.execute(
        "SELECT outcome, retry_reason FROM delivery_attempt_all WHERE run_id = %s", (dead.run_id,)
    ).fetchall()
    assert (
        cut_off
        == [{"outcome": "ambiguous", "retry_reason": f"released: run {dead.run_id} failed"}] * 2
    )
    assert receiver.accepted_ids == set(ids)


def test_ctrl_c_cancels_the_run_and_hands_its_rows_back(env, conn, own_instance, gated):
    """Ctrl-C (SIGINT to the command's process group, as a terminal sends it) while requests
    are in flight: the run ends CANCELED, not FAILURE, with why in its canceling event; what it
    held is due again or recorded; the command says so and exits 130."""
    receiver, _ = gated  # holds every request: the sender's 3 s timeout ends them
    add_destination(conn, "cdn", receiver.url, timeout_seconds=3, max_in_flight=2)
    add_deliveries(conn, "cdn", 6)

    running = _start_cli("run", env=env)
    assert receiver.wait_for(lambda r: r.max_in_flight >= 2, timeout=120), running.stderr
    os.killpg(running.pid, signal.SIGINT)
    out, err = running.communicate(timeout=120)

    assert running.returncode == 130, (out, err)
    assert err.strip().endswith("media-hooks: interrupted"), err
    (run,) = _delivery_runs(own_instance)
    assert run.status == DagsterRunStatus.CANCELED
    canceling = own_instance.get_records_for_run(
        run.run_id, of_type=DagsterEventType.RUN_CANCELING
    ).records
    assert "interrupted (Ctrl-C)" in canceling[0].event_log_entry.dagster_event.message
    (line,) = out.splitlines()
    assert line.startswith(f"run {run.run_id} stopped: interrupted (Ctrl-C), canceled; ")
    assert set(states(conn)) == {"pending"}
    cut_short = conn.execute("SELECT outcome FROM delivery_attempt_all ORDER BY 1").fetchall()
    assert [r["outcome"] for r in cut_short] == ["ambiguous", "ambiguous"]
    assert slot_holders(own_instance.event_log_storage) == []


@pytest.mark.one_server
def test_max_seconds_stops_a_run_waiting_for_a_pool_slot(env, conn, own_instance, pool_of_one):
    add_destination(conn, "cdn", "http://127.0.0.1:9/cdn")
    add_deliveries(conn, "cdn", 4)
    blocker = "another-deployments-run"  # holds the pool's only slot; not ours to free
    hold_pool_slot(pool_of_one, blocker)

    started = time.monotonic()
    running = _start_cli("run", "--max-seconds", str(MAX_SECONDS), "--json", env=env)
    deadline = started + MAX_SECONDS
    while not {p.run_id for p in pool_of_one.get_concurrency_info(DELIVERY_POOL).pending_steps} - {
        blocker
    }:
        assert time.monotonic() < deadline, "the run's step never queued for the pool"
        time.sleep(0.1)  # another process's progress: nothing to wait on
    # Nothing is claimed before the delivery step has its slot: the rows wait, pending.
    assert states(conn) == {"pending": 4}
    out, err = running.communicate(timeout=120)
    elapsed = time.monotonic() - started

    assert running.returncode == 0, err
    assert elapsed < MAX_SECONDS + GRACE_SECONDS + STARTUP_ALLOWANCE
    stopped = json.loads(out)["stopped"]
    assert stopped["reason"] == f"--max-seconds {MAX_SECONDS} reached"
    assert stopped["released"] == 0
    run = own_instance.get_run_by_id(stopped["run_id"])
    assert run.status == DagsterRunStatus.CANCELED
    canceling = own_instance.get_records_for_run(
        run.run_id, of_type=DagsterEventType.RUN_CANCELING
    ).records
    assert (
        f"--max-seconds {MAX_SECONDS} reached" in canceling[0].event_log_entry.dagster_event.message
    )
    assert states(conn) == {"pending": 4}
    info = pool_of_one.get_concurrency_info(DELIVERY_POOL)
    assert [s.run_id for s in info.claimed_slots] == [blocker]
    assert [p.run_id for p in info.pending_steps] == [blocker]


@pytest.mark.one_server
def test_max_seconds_kills_a_run_that_does_not_stop(env, conn, own_instance, gated):
    receiver, _ = gated  # holds every request for two minutes: the step cannot stop sooner
    add_destination(conn, "cdn", receiver.url, timeout_seconds=120, max_in_flight=2)
    add_deliveries(conn, "cdn", 2)
    grace = 3.0

    started = time.monotonic()
    running = _start_cli(
        "run",
        "--max-seconds",
        str(MAX_SECONDS),
        env=dict(env, MEDIA_HOOKS_RUN_STOP_GRACE_SECONDS=str(grace)),
    )
    sending = receiver.wait_for(lambda r: r.max_in_flight >= 2, timeout=MAX_SECONDS)
    assert sending, "no send before --max-seconds"
    out, err = running.communicate(timeout=120)
    elapsed = time.monotonic() - started

    assert running.returncode == 1, (out, err)
    assert elapsed < MAX_SECONDS + grace + 5 + STARTUP_ALLOWANCE  # 5: its last words
    (line,) = err.splitlines()
    assert line.startswith("media-hooks: killed the delivery run(s) of this process: ")
    assert f"--max-seconds {MAX_SECONDS} reached, and it did not stop within 3 s" in line
    (run,) = _delivery_runs(own_instance)
    assert f"ended and released: {run.run_id} (2 due again)" in line
    # Failed by the command, or canceled by the run's own thread as its steps died: ended.
    assert run.status in (DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)
    assert run.tags[RELEASED_TAG] == "2"
    assert states(conn) == {"pending": 2}
    assert slot_holders(own_instance.event_log_storage) == []


def test_a_database_outage_fails_the_run_in_one_line_and_its_rows_come_back(
    env, conn, own_instance, server_url, database_url, own_storage_url, tmp_path
):
    """Both databases (the deliveries' and Dagster's, one server as on the embedded default)
    refuse connections mid-run, until the run has failed; then they come back."""
    with (
        Receiver(reply=Reply(delay_seconds=0.5)) as receiver,
        database_proxy(server_url) as proxy,
    ):
        for name in ("a", "b"):
            add_destination(conn, name, receiver.url + name, max_in_flight=2)
            add_deliveries(conn, name, 20)
        through_proxy = dict(
            env,
            MEDIA_HOOKS_DATABASE_URL=proxy.url(database_url),
            MEDIA_HOOKS_DAGSTER_STORAGE_URL=instance_module.as_url(proxy.url(own_storage_url)),
        )
        running = _start_cli("run", env=through_proxy)
        assert receiver.wait_for(lambda r: r.request_count >= 4, timeout=120)
        proxy.cut()
        # The command notes in its log when it starts waiting to settle the failed run.
        log = tmp_path / "home" / "logs" / "run.log"
        deadline = time.monotonic() + 180
        while "settling the run(s) of this process" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            assert running.poll() is None, running.communicate()
            time.sleep(0.2)  # another process's log: nothing to wait on
        proxy.restore()
        out, err = running.communicate(timeout=120)

        assert running.returncode == 1, (out, err)
        (line,) = err.splitlines()  # one line; Dagster's own output went to the log
        (run,) = _delivery_runs(own_instance)
        assert line.startswith(f"media-hooks: delivery run {run.run_id} failed: ")
        assert "delivery(ies) due again" in line
        failed = own_instance.get_run_by_id(run.run_id)
        assert failed.status == DagsterRunStatus.FAILURE
        assert RELEASED_TAG in failed.tags
        assert slot_holders(own_instance.event_log_storage) == []
    # Nothing waits for a timeout: what the run did not finish is due now.
    assert set(states(conn)) <= {"succeeded", "pending"}
    not_due = conn.execute(
        "SELECT count(*) AS n FROM webhook_delivery_all WHERE state = 'pending' AND next_attempt_at > now()"
    ).fetchone()["n"]
    assert not_due == 0
