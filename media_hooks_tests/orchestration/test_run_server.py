"""`media-hooks run` handed to the warm run server (media_hooks.cli.warm, orchestration.run_server).

Every test runs the command as a real process against a real server process: the run executes
in a child of the server, and the command only waits for it. What must hold is what holds for
a command that runs its run itself: its output and exit status, Ctrl-C, a kill of the command
(the run dies with it, and the next run recovers it), a crash inside the run; and without a
server, a run in the command's own process that leaves one behind for the next.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from dagster import DagsterRunStatus, RunsFilter

from media_hooks import crashpoints
from media_hooks.cli import warm
from media_hooks.orchestration import run_workers
from media_hooks.receiver import Receiver, Reply
from media_hooks_tests.conftest import REPO, run_cli, start_cli
from media_hooks_tests.factories import add_deliveries, add_destination, states

# What these prove is process mechanics (sockets, forks and signals), the same on any
# PostgreSQL version: CI runs them on the embedded server only.
pytestmark = pytest.mark.one_server

DEADLINE_SECONDS = 60.0


def _wait_until(condition, what: str, timeout: float = DEADLINE_SECONDS):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)  # another process's state: nothing to wait on but polling it
    pytest.fail(f"timed out waiting for {what}")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def env(cli_env, own_storage_url):
    return dict(
        cli_env, MEDIA_HOOKS_DAGSTER_STORAGE_URL=own_storage_url, MEDIA_HOOKS_WARM_RUNS="on"
    )


@pytest.fixture
def home(env) -> Path:
    return Path(env["MEDIA_HOOKS_HOME"])


def _server_pids(env: dict[str, str]) -> list[int]:
    # Not warm.server_pid: a server's socket is named for the command's interpreter and import
    # path, which are not this test process's.
    return [server.pid for server in warm.servers(Path(env["MEDIA_HOOKS_HOME"]))]


def _stop_servers(env: dict[str, str], home: Path) -> None:
    running = warm.servers(home)
    for server in running:  # the runs a failed test left (a server ends after its runs)
        for child in psutil.Process(server.pid).children():
            child.kill()
    run_cli("warm", "stop", env=env)
    for server in running:
        _wait_until(lambda pid=server.pid: _gone(pid), f"run server {server.pid} to end")


@pytest.fixture
def server(env, home) -> Iterator[int]:
    """A warm run server for this test's home: its pid."""
    started = run_cli("warm", "start", "--json", env=env, timeout=180)
    assert started.returncode == 0, started.stderr
    document = json.loads(started.stdout)
    assert document["started"] is True
    yield document["pid"]
    _stop_servers(env, home)


def _delivery_runs(instance) -> list:
    return list(instance.get_runs(RunsFilter(job_name="deliver_webhooks")))


def _worker(instance):
    """The worker process of the only delivery run, once it is recorded."""

    def recorded():
        runs = _delivery_runs(instance)
        return run_workers.worker_of(runs[0]) if runs else None

    return _wait_until(recorded, "the run's worker to be recorded")


def _one_run(env: dict[str, str], instance, succeeded: int):
    """``media-hooks run --json`` to its end: the command's process and the run's worker."""
    command = start_cli("run", "--json", env=env)
    out, err = command.communicate(timeout=180)
    assert command.returncode == 0, err
    (run,) = json.loads(out)["runs"]
    assert run["succeeded"] == succeeded
    return command, run_workers.worker_of(instance.get_run_by_id(run["run_id"]))


def test_a_handed_over_run_delivers_and_prints_as_the_commands_own(
    env, conn, receiver, own_instance, server
):
    add_destination(conn, "cdn", receiver.url)
    add_deliveries(conn, "cdn", 5)

    command, worker = _one_run(env, own_instance, succeeded=5)

    assert receiver.effects == 5
    # The run executed in a child of the server, not in the command's process.
    assert worker.pid not in (command.pid, server)
    assert _server_pids(env) == [server]
    assert states(conn) == {"succeeded": 5}


def test_a_misspelt_switch_is_one_line_and_exit_2(env):
    done = run_cli("run", env={**env, "MEDIA_HOOKS_WARM_RUNS": "yes"})

    assert done.returncode == 2
    assert done.stderr == "media-hooks: MEDIA_HOOKS_WARM_RUNS must be 'on' or 'off', got 'yes'\n"


def test_a_caller_that_connects_and_says_nothing_does_not_hold_up_the_next(
    env, home, conn, receiver, own_instance, server
):
    add_destination(conn, "cdn", receiver.url)
    add_deliveries(conn, "cdn", 2)
    (running,) = warm.servers(home)
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as silent:
        silent.connect(str(running.socket))

        command, worker = _one_run(env, own_instance, succeeded=2)

    assert worker.pid not in (command.pid, server)  # handed over, not run cold


def test_a_usage_error_is_one_line_and_exit_2(env, server):
    done = run_cli("run", "--page-size", "0", env=env)

    assert done.returncode == 2
    assert done.stderr.strip() == (
        "media-hooks: argument --page-size: must be a whole number at least 1 and at most 10000, "
        "got '0' (see `media-hooks run --help`)"
    )
    assert done.stdout == ""


def test_ctrl_c_reaches_the_run_which_hands_back_its_rows(env, conn, own_instance, server):
    with Receiver(script=lambda info: Reply(delay_seconds=3)) as slow:
        add_destination(conn, "cdn", slow.url, max_in_flight=2)
        add_deliveries(conn, "cdn", 6)

        command = start_cli("run", env=env, own_session=True)
        assert slow.wait_for(lambda r: r.max_in_flight >= 2, timeout=120), command.stderr
        worker = _worker(own_instance)
        command.send_signal(signal.SIGINT)
        _, err = command.communicate(timeout=120)

    assert command.returncode == 130, err
    assert err.strip().splitlines()[-1] == "media-hooks: interrupted"
    assert _gone(worker.pid)
    (run,) = _delivery_runs(own_instance)
    assert run.is_finished and run.status != DagsterRunStatus.SUCCESS
    # The requests in flight finished; the rest wait for the next run, none leased.
    left = states(conn)
    assert 2 <= left.get("succeeded", 0) < 6, left
    assert left.keys() <= {"succeeded", "pending"}, left


def test_a_signal_the_command_was_started_ignoring_does_not_reach_its_run(
    env, conn, own_instance, server
):
    with Receiver(script=lambda info: Reply(delay_seconds=1)) as slow:
        add_destination(conn, "cdn", slow.url, max_in_flight=1)
        add_deliveries(conn, "cdn", 3)

        # As `nohup` or a script's `&` starts it: SIGINT ignored, and so in its own process.
        command = subprocess.Popen(
            [sys.executable, "-m", "media_hooks.cli", "run", "--json"],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
        assert slow.wait_for(lambda r: r.max_in_flight >= 1, timeout=120), command.stderr
        command.send_signal(signal.SIGINT)
        out, err = command.communicate(timeout=120)

    assert command.returncode == 0, err
    assert json.loads(out)["runs"][0]["succeeded"] == 3


def test_a_killed_command_takes_its_run_with_it_and_the_next_run_recovers_it(
    env, conn, own_instance, gated, server
):
    receiver, gate = gated
    add_destination(conn, "cdn", receiver.url, timeout_seconds=120, max_in_flight=2)
    ids = add_deliveries(conn, "cdn", 6)

    killed = start_cli("run", env=env, own_session=True)
    assert receiver.wait_for(lambda r: r.max_in_flight >= 2, timeout=120), killed.stderr
    worker = _worker(own_instance)
    os.killpg(killed.pid, signal.SIGKILL)  # the command only: its run is the server's child
    killed.wait(timeout=30)

    _wait_until(lambda: _gone(worker.pid), "the run's process to die with its command")
    (dead,) = _delivery_runs(own_instance)
    assert dead.status == DagsterRunStatus.STARTED  # killed: Dagster cannot tell
    assert states(conn) == {"enqueued": 4, "leased": 2}

    gate.open.set()
    done = run_cli("run", "--until-idle", "--json", env=env, timeout=180)

    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    (recovered,) = document["recovered"]
    assert recovered["run_id"] == dead.run_id
    assert recovered["reason"].startswith(f"its worker process (pid {worker.pid} on ")
    assert recovered["released"] == 6
    assert states(conn) == {"succeeded": 6}
    assert receiver.accepted_ids == set(ids)
    assert _server_pids(env) == [server]


def test_a_crash_inside_the_run_is_the_commands_exit(env, home, conn, receiver, server):
    add_destination(conn, "cdn", receiver.url)
    add_deliveries(conn, "cdn", 3)

    done = run_cli("run", env={**env, "MEDIA_HOOKS_CRASH_AT": crashpoints.BEFORE_CLAIM_COMMIT})

    assert done.returncode == crashpoints.CRASH_EXIT_STATUS, done.stderr
    # Said where the command puts what Dagster's steps print, as it does in its own process.
    assert "crash point before_claim_commit reached" in (home / "logs" / "run.log").read_text()
    assert states(conn) == {"pending": 3}  # the claim never committed
    assert receiver.request_count == 0


def test_a_run_killed_inside_the_server_ends_the_command_by_the_same_signal(
    env, conn, own_instance, gated, server
):
    receiver, _ = gated
    add_destination(conn, "cdn", receiver.url, timeout_seconds=120, max_in_flight=1)
    add_deliveries(conn, "cdn", 2)

    command = start_cli("run", env=env, own_session=True)
    assert receiver.wait_for(lambda r: r.max_in_flight >= 1, timeout=120), command.stderr
    os.kill(_worker(own_instance).pid, signal.SIGKILL)  # the OOM killer picks the run

    command.communicate(timeout=60)
    assert command.returncode == -signal.SIGKILL


def test_without_a_server_the_run_is_its_own_and_leaves_one_for_the_next(
    env, home, conn, receiver, own_instance
):
    add_destination(conn, "cdn", receiver.url)
    add_deliveries(conn, "cdn", 2)
    try:
        command, worker = _one_run(env, own_instance, succeeded=2)
        assert worker.pid == command.pid  # no server yet: its own process

        (server,) = _wait_until(
            lambda: [s for s in warm.servers(home) if s.listening()], "a server for the next run"
        )
        folder = warm.run_folder(home)
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700  # its socket runs as this user
        add_deliveries(conn, "cdn", 2, prefix="again")
        again, worker = _one_run(env, own_instance, succeeded=2)
        assert worker.pid not in (again.pid, server.pid)  # handed to the server
        status = json.loads(run_cli("warm", "status", "--json", env=env).stdout)
        assert status["servers"] == [
            {"pid": server.pid, "socket": str(server.socket), "current": True}
        ]
    finally:
        _stop_servers(env, home)
    assert warm.servers(home) == []


def test_with_warm_runs_off_no_server_is_asked_or_started(
    env, conn, receiver, own_instance, server
):
    add_destination(conn, "cdn", receiver.url)
    add_deliveries(conn, "cdn", 2)
    off = {**env, "MEDIA_HOOKS_WARM_RUNS": "off"}

    command, worker = _one_run(off, own_instance, succeeded=2)

    assert worker.pid == command.pid  # its own process
    refused = run_cli("warm", "start", env=off)
    assert refused.returncode == 2
    assert refused.stderr.startswith("media-hooks: warm runs are off (MEDIA_HOOKS_WARM_RUNS=off")


def test_an_idle_server_ends_and_removes_its_socket(env, home):
    started = run_cli("warm", "start", "--idle-seconds", "1", "--json", env=env, timeout=180)
    assert started.returncode == 0, started.stderr
    document = json.loads(started.stdout)

    _wait_until(lambda: _gone(document["pid"]), "the idle server to end")
    assert not Path(document["socket"]).exists()
    assert warm.servers(home) == []


def test_a_server_answers_only_its_own_interpreter_and_code(monkeypatch, tmp_path: Path):
    mine = warm.socket_path(tmp_path)
    monkeypatch.setattr(sys, "path", [*sys.path, str(tmp_path)])
    assert warm.socket_path(tmp_path) != mine
    assert mine.parent == warm.run_folder(tmp_path)


def _checkout_copy(folder: Path) -> Path:
    """A copy of the package under ``folder`` whose run code says on stderr when it is imported
    and when it runs (a command started from ``folder`` finds this copy first)."""
    package = folder / "media_hooks"
    shutil.copytree(REPO / "media_hooks", package, ignore=shutil.ignore_patterns("__pycache__"))
    commands = package / "cli" / "run_commands.py"
    source = commands.read_text().replace(
        "def run_deliveries(args: argparse.Namespace) -> int:\n",
        "def run_deliveries(args: argparse.Namespace) -> int:\n"
        "    print('the copy runs', file=sys.stderr)\n",
    )
    commands.write_text(
        f"{source}\nimport sys\n\nprint(f'the copy loads in {{os.getpid()}}', file=sys.stderr)\n"
    )
    return folder


def _run_from(folder: Path, env: dict[str, str]) -> str:
    """``media-hooks run`` started in ``folder``: what it printed on stderr."""
    done = run_cli("run", "--json", env=env, cwd=folder)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_a_run_keeps_the_servers_code_until_the_checkout_or_its_settings_change(
    env, home, tmp_path: Path
):
    checkout = _checkout_copy(tmp_path / "checkout")
    started = run_cli("warm", "start", "--json", env=env, timeout=180, cwd=checkout)
    assert started.returncode == 0, started.stderr
    server = json.loads(started.stdout)["pid"]
    try:
        # Unchanged: the child runs the code its server loaded, without importing it again.
        assert _run_from(checkout, env) == "the copy runs\n"
        # Another checkout on the caller's import path: its own code, imported afresh.
        assert _run_from(REPO, env) == ""
        # A setting the definitions read as they load, set otherwise than the server's.
        paris = _run_from(checkout, {**env, "MEDIA_HOOKS_SCHEDULE_TIMEZONE": "Europe/Paris"})
        assert paris.startswith("the copy loads in ")
        assert paris.endswith("the copy runs\n")
        assert _run_from(checkout, env) == "the copy runs\n"
        # A changed file, even one the run never imports itself (SQL): imported afresh.
        query = checkout / "media_hooks" / "sql" / "queries" / "retention.sql"
        query.write_text(query.read_text() + "\n")
        changed = _run_from(checkout, env)
        assert changed.startswith("the copy loads in ")
        assert changed.endswith("the copy runs\n")
        assert _server_pids(env) == [server]  # every run was handed to the same server
    finally:
        _stop_servers(env, home)


def test_code_that_fails_to_load_leaves_the_server_up_and_fails_each_run_as_its_own_would(
    env, home, tmp_path: Path
):
    checkout = _checkout_copy(tmp_path / "checkout")
    definitions = checkout / "media_hooks" / "orchestration" / "definitions.py"
    definitions.write_text(definitions.read_text() + "\nraise RuntimeError('refused')\n")
    started = run_cli("warm", "start", "--json", env=env, timeout=180, cwd=checkout)
    assert started.returncode == 0, started.stderr
    server = json.loads(started.stdout)["pid"]
    try:
        warm_run = run_cli("run", env=env, cwd=checkout)
        cold_run = run_cli("run", env={**env, "MEDIA_HOOKS_WARM_RUNS": "off"}, cwd=checkout)

        assert warm_run.returncode == cold_run.returncode == 1
        for done in (warm_run, cold_run):
            assert done.stderr.rstrip().endswith("RuntimeError: refused"), done.stderr
        assert _server_pids(env) == [server]  # the run failed in its child, not the server
    finally:
        _stop_servers(env, home)
