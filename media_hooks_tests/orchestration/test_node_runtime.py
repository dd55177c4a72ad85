"""``deliver_webhooks`` with the node runtime: its delivery step launches the Node.js worker
through Dagster Pipes, on a real instance, real PostgreSQL and a local receiver."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from dagster import DagsterEventType, DagsterRunStatus, RunsFilter

from media_hooks.orchestration.ops.delivery import RUNTIME_TAG
from media_hooks.orchestration.running import execute_delivery
from media_hooks_tests.conftest import run_cli, start_cli
from media_hooks_tests.factories import add_deliveries, add_destination, states
from media_hooks_tests.orchestration.conftest import deliver
from media_hooks_tests.orchestration.test_deliver_job import _step_outputs

STEP = "deliver_shard[shard_1_of_1]"
NODE = {"runtime": "node"}


def _step_failures(instance, run_id: str) -> list[str]:
    records = instance.get_records_for_run(run_id, of_type=DagsterEventType.STEP_FAILURE).records
    return [r.event_log_entry.dagster_event.step_failure_data.error.message for r in records]


def test_a_node_run_delivers_and_its_step_shows_what_a_python_step_shows(
    node, instance, database_url, conn, receiver, monkeypatch
):
    for d in ("alpha", "beta"):
        add_destination(conn, d, receiver.url + d)
        add_deliveries(conn, d, 3)
    # The deployment's default: the run's config names no runtime.
    monkeypatch.setenv("MEDIA_HOOKS_RUNTIME", "node")

    run = deliver(instance, database_url)

    assert run.success, run.failure
    assert receiver.effects == 6
    assert run.summary.totals["succeeded"] == 6
    outputs = _step_outputs(instance, run.run_id)
    step = outputs[STEP]
    assert (step["destinations"], step["claimed"], step["succeeded"], step["attempted"]) == (
        2,
        6,
        6,
        6,
    )
    for d in ("alpha", "beta"):
        assert f"| {d} | 3 | 3 | 3 |" in step["per_destination"]
        assert f"| {d} | 3 | 3 | 3 |" in outputs["summarize_run"]["per_destination"]
    assert outputs["prepare"]["runtime"] == "node"
    assert instance.get_run_by_id(run.run_id).tags[RUNTIME_TAG] == "node"
    # The worker's own log lines, through Pipes, in the step's log.
    logs = [e.user_message for e in instance.all_logs(run.run_id) if e.step_key == STEP]
    assert any(f"run {run.run_id}: delivering to alpha, beta" in m for m in logs), logs
    outbox = conn.execute("SELECT DISTINCT run_id FROM dispatch_outbox").fetchall()
    assert [r["run_id"] for r in outbox] == [run.run_id]


def test_a_capped_node_run_starts_no_worker_for_a_shard_its_cap_left_nothing(
    node, instance, database_url, conn, receiver
):
    for d in ("alpha", "beta"):  # shard 1 and shard 2 of 2 (crc32 % 2)
        add_destination(conn, d, receiver.url + d)
        add_deliveries(conn, d, 2)

    run = deliver(instance, database_url, {**NODE, "max_rows": 1, "shards": 2})

    assert run.success, run.failure
    assert run.summary.claimed == 1 and receiver.effects == 1
    outputs = _step_outputs(instance, run.run_id)
    claimed = [outputs[f"deliver_shard[shard_{i}_of_2]"]["claimed"] for i in (1, 2)]
    assert sorted(claimed) == [0, 1]


def test_a_worker_refusing_its_settings_fails_the_step_with_its_line_and_no_retry(
    node, instance, database_url, conn
):
    add_destination(conn, "cdn", "http://127.0.0.1:9/cdn")
    add_deliveries(conn, "cdn", 2)

    # A deployment override the Node worker refuses (leases last at most a day).
    run = execute_delivery(
        instance,
        NODE,
        resources={
            "postgres": {"database_url": database_url},
            "delivery_settings": {"lease_seconds": 100_000},
        },
    )

    assert not run.success
    assert run.failure.startswith(
        f"step {STEP} failed: node worker: MEDIA_HOOKS_LEASE_SECONDS must be "
    ), run.failure
    assert len(_step_failures(instance, run.run_id)) == 1
    assert states(conn) == {"pending": 2}


def test_without_node_the_step_fails_saying_how_to_install(
    instance, database_url, conn, monkeypatch, tmp_path: Path
):
    add_destination(conn, "cdn", "http://127.0.0.1:9/cdn")
    add_deliveries(conn, "cdn", 1)
    monkeypatch.setenv("PATH", str(tmp_path))  # no node on it

    run = deliver(instance, database_url, NODE)

    assert not run.success
    assert run.failure == (
        f"step {STEP} failed: the node runtime cannot start: node is not installed (install "
        f"Node 20 or later, then run `npm ci --prefix node` in "
        f"{Path(__file__).resolve().parents[2]})"
    )
    assert states(conn) == {"pending": 1}


@pytest.mark.parametrize(
    ("args", "env", "line"),
    [
        (["--runtime", "ruby"], {}, "argument --runtime: invalid choice: 'ruby'"),
        ([], {"MEDIA_HOOKS_RUNTIME": "ruby"}, "MEDIA_HOOKS_RUNTIME must be one of python, node"),
        (
            ["--runtime", "node", "--event-type", "x"],
            {},
            "the node runtime delivers whole destinations",
        ),
    ],
)
def test_a_runtime_that_cannot_serve_the_run_is_refused_in_one_line(cli_env, args, env, line):
    done = run_cli("run", *args, env=dict(cli_env, **env))

    assert done.returncode == 2
    (only,) = done.stderr.splitlines()
    assert line in only, only


def _node_processes(run_id: str) -> list[int]:
    """Node workers of this run still alive (their command line names the run id)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
            continue
        if b"media-hooks-node.js" in b" ".join(argv) and run_id.encode() in argv:
            found.append(int(entry.name))
    return found


def test_canceling_a_node_run_stops_the_worker_and_leaves_nothing_held(
    node, cli_env, own_storage_url, conn, own_instance, gated
):
    """Ctrl-C to `media-hooks run --runtime node` alone (not its process group): Dagster's
    interrupt reaches the step, which stops the worker; the worker hands back what it holds."""
    receiver, _ = gated  # holds every request: the destination's 3 s timeout ends them
    add_destination(conn, "cdn", receiver.url, timeout_seconds=3, max_in_flight=2)
    add_deliveries(conn, "cdn", 6)
    env = dict(cli_env, MEDIA_HOOKS_DAGSTER_STORAGE_URL=own_storage_url)

    running = start_cli("run", "--runtime", "node", env=env, own_session=True)
    assert receiver.wait_for(lambda r: r.max_in_flight >= 2, timeout=120), running.stderr
    (run,) = own_instance.get_runs(RunsFilter(job_name="deliver_webhooks"))
    assert _node_processes(run.run_id)
    os.kill(running.pid, signal.SIGINT)
    out, err = running.communicate(timeout=120)

    assert running.returncode == 130, (out, err)
    assert own_instance.get_run_by_id(run.run_id).status == DagsterRunStatus.CANCELED
    assert _node_processes(run.run_id) == []
    assert set(states(conn)) == {"pending"}
    cut_short = conn.execute("SELECT outcome FROM delivery_attempt_all ORDER BY 1").fetchall()
    assert [r["outcome"] for r in cut_short] == ["ambiguous", "ambiguous"]
    checked = run_cli("check", env=cli_env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
