"""Failure boundaries of the Node.js worker, and the two runtimes at once.

A Node worker killed at each named point (MEDIA_HOOKS_CRASH_AT, as for the Python engine), or
SIGKILLed with a request in flight, leaves every delivery terminal or discoverably due: after
the leases lapse and the maintenance sweeps run, `media-hooks check` holds and a second worker
delivers each delivery exactly once to a deduplicating receiver. A Python and a Node worker
on the same destinations at once share its limits and never record two successes."""

from __future__ import annotations

import dataclasses
import json
import signal
import threading

import pytest
from dagster import (
    DagsterInstance,
    PipesSubprocessClient,
    asset,
    materialize,
)

from media_hooks.core import crashpoints
from media_hooks.devtools.receiver import Receiver, Reply
from media_hooks.engine.delivery_run import deliver_due
from media_hooks.outbox import claims, rate_limits
from media_hooks.outbox.maintenance import sweeps
from media_hooks_tests.conftest import REPO, run_cli
from media_hooks_tests.crashes import (
    assert_interruption_is_on_record,
    wait_until_swept_work_is_due,
)
from media_hooks_tests.envelope import envelope_excess
from media_hooks_tests.factories import add_deliveries, add_destination, states
from media_hooks_tests.interleaving import in_background, wait_for
from media_hooks_tests.node.conftest import CLI, run_worker, start_worker, worker_report

COUNT = 4


def _short_leases(env: dict[str, str]) -> dict[str, str]:
    return dict(env, MEDIA_HOOKS_LEASE_SECONDS="1", MEDIA_HOOKS_ENQUEUE_TIMEOUT_SECONDS="1")


def _recover(conn, settings) -> None:
    """What the next run's maintenance does before it delivers: lapsed leases end as
    ambiguous attempts, stale enqueues are due again."""
    wait_until_swept_work_is_due(conn)
    sweeps.run_sweeps(conn, dataclasses.replace(settings, enqueue_timeout_seconds=1.0))


def _check_holds(cli_env: dict[str, str]) -> None:
    checked = run_cli("check", env=cli_env)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize("point", crashpoints.POINTS)
def test_a_node_worker_killed_at_each_point_loses_and_duplicates_nothing(
    node, node_env, cli_env, conn, settings, point
):
    with Receiver() as receiver:
        add_destination(conn, "cdn", url=receiver.url, max_in_flight=1, timeout_seconds=0.2)
        ids = add_deliveries(conn, "cdn", COUNT)

        env = dict(_short_leases(node_env), MEDIA_HOOKS_CRASH_AT=point)
        crashed = run_worker(node, "cdn", "--run-id", "run-crashed", env=env)
        assert crashed.returncode == crashpoints.CRASH_EXIT_STATUS, crashed.stderr
        assert f"crash point {point} reached" in crashed.stderr

        _recover(conn, settings)
        _check_holds(cli_env)
        recovered = run_worker(node, "cdn", "--run-id", "run-recovery", env=_short_leases(node_env))
        assert recovered.returncode == 0, recovered.stderr

        assert states(conn) == {"succeeded": COUNT}
        assert receiver.accepted_ids == set(ids)
        assert {r.webhook_id for r in receiver.requests} <= set(ids)
        assert all(r.idempotency_key == r.webhook_id for r in receiver.requests)
        assert receiver.effects == COUNT
    assert_interruption_is_on_record(conn, point)
    _check_holds(cli_env)


def test_a_node_worker_sigkilled_with_a_request_in_flight_is_recovered(
    node, node_env, cli_env, conn, settings
):
    arrived, release = threading.Event(), threading.Event()

    def hold_the_first(info):
        if info.seen_before == 0 and not arrived.is_set():
            arrived.set()
            release.wait(30)
        return Reply()

    with Receiver(script=hold_the_first) as receiver:
        add_destination(conn, "cdn", url=receiver.url, max_in_flight=1, timeout_seconds=5)
        ids = add_deliveries(conn, "cdn", COUNT)
        worker = start_worker(node, "cdn", "--run-id", "run-killed", env=_short_leases(node_env))
        try:
            assert arrived.wait(30), "the first request never arrived"
            worker.send_signal(signal.SIGKILL)
            worker.wait(timeout=30)
        finally:
            release.set()
            worker.kill()
            worker.communicate()
        assert worker.returncode == -signal.SIGKILL
        # The receiver committed the held request: its answer was never read.
        wait_for(lambda: receiver.effects == 1, "the held request to commit")

        assert states(conn)["leased"] == 1
        # Its lease is held for the longest a send can take (3 x 5 s + 2 s), then lapses.
        conn.execute("UPDATE webhook_delivery_all SET lease_until = now() WHERE state = 'leased'")
        _recover(conn, settings)
        _check_holds(cli_env)
        worker_report(run_worker(node, "cdn", "--json", env=node_env))

        assert states(conn) == {"succeeded": COUNT}
        assert receiver.effects == COUNT and receiver.accepted_ids == set(ids)
    lost = conn.execute(
        "SELECT delivery_id, outcome, error FROM delivery_attempt_all WHERE run_id = 'run-killed'"
    ).fetchall()
    assert [a["outcome"] for a in lost] == ["ambiguous"]
    assert "lease expired" in lost[0]["error"]
    _check_holds(cli_env)


def test_python_and_node_workers_at_once_share_the_limits_and_never_succeed_twice(
    node, node_env, cli_env, conn, pool, settings
):
    rate, burst, in_flight, count = 40.0, 4, 4, 160
    with Receiver(reply=Reply(delay_seconds=0.05)) as receiver:
        add_destination(
            conn,
            "cdn",
            url=receiver.url,
            max_in_flight=in_flight,
            rate_per_second=rate,
            burst=burst,
        )
        add_deliveries(conn, "cdn", count)
        worker = start_worker(
            node, "cdn", "--json", "--run-id", "run-node", "--page-size", "10", env=node_env
        )
        try:
            # Both runtimes must deliver: on a loaded machine the Node worker can take seconds
            # to start, and a Python run started first would take every page alone.
            wait_for(
                lambda: claims.run_dispatched(conn, "run-node"), "the Node worker's first claim", 60
            )
            with in_background(lambda: deliver_due(pool, "run-python", settings, page_size=10)):
                out, err = worker.communicate(timeout=120)
        finally:
            worker.kill()
            worker.wait()
        assert worker.returncode == 0, err
        starts = sorted(r.arrived_monotonic for r in receiver.requests)
        assert receiver.max_in_flight <= in_flight
        assert receiver.effects == count
        assert set(receiver.requests_by_id.values()) == {1}
    assert envelope_excess(starts, rate=rate, burst=burst) <= 0
    assert states(conn) == {"succeeded": count}
    by_run = conn.execute(
        "SELECT run_id, count(*) AS n FROM delivery_attempt_all WHERE outcome = 'success' "
        "GROUP BY run_id ORDER BY run_id"
    ).fetchall()
    assert {r["run_id"] for r in by_run} == {"run-node", "run-python"}, by_run
    assert sum(r["n"] for r in by_run) == count
    assert json.loads(out)["destinations"]["cdn"]["succeeded"] == next(
        r["n"] for r in by_run if r["run_id"] == "run-node"
    )
    assert rate_limits.in_flight(conn, "cdn") == []
    _check_holds(cli_env)


def _launched_by_dagster(node: str, env: dict[str, str], *destinations: str):
    """A materialization of an asset whose code launches the worker with Dagster's own
    PipesSubprocessClient: the run's result, its instance's log entries, the custom messages."""
    reports: list = []

    @asset
    def delivered(context):
        client = PipesSubprocessClient(env=env, cwd=str(REPO))
        invocation = client.run(context=context, command=[node, str(CLI), "worker", *destinations])
        reports.extend(invocation.get_custom_messages())
        return invocation.get_materialize_result()

    with DagsterInstance.ephemeral() as instance:
        result = materialize([delivered], instance=instance, raise_on_error=False)
        return result, instance.all_logs(result.run_id), reports


def test_launched_through_dagster_pipes_its_logs_and_counts_reach_dagster(node, node_env, conn):
    """The run id comes from the Pipes context; the worker's log lines reach the step's log,
    its per-destination counts arrive as a custom message and as the materialization's
    metadata (one asset is in scope)."""
    with Receiver() as receiver:
        add_destination(conn, "cdn", url=receiver.url)
        add_deliveries(conn, "cdn", 3)
        result, logs, reports = _launched_by_dagster(node, node_env, "cdn")

    assert result.success
    (report,) = reports
    assert report["run_id"] == result.run_id
    assert (
        report["destinations"]["cdn"]["claimed"],
        report["destinations"]["cdn"]["succeeded"],
    ) == (
        3,
        3,
    )
    (materialization,) = result.asset_materializations_for_node("delivered")
    assert materialization.metadata["deliveries"].value == report
    messages = [entry.user_message for entry in logs]
    assert any(f"run {result.run_id}: delivering to cdn" in m for m in messages), messages
    runs = conn.execute("SELECT DISTINCT run_id FROM dispatch_outbox").fetchall()
    assert runs == [{"run_id": result.run_id}]


def test_a_failed_worker_closes_pipes_with_its_error(node, node_env, empty_database_url):
    env = dict(node_env, MEDIA_HOOKS_DATABASE_URL=empty_database_url)

    result, logs, reports = _launched_by_dagster(node, env, "cdn")

    assert not result.success and reports == []
    (closed,) = [
        entry.dagster_event.engine_event_data.error
        for entry in logs
        if entry.dagster_event is not None
        and entry.dagster_event.message == "[pipes] external process pipes closed with exception"
    ]
    assert closed.cls_name == "RuntimeFailure"
    assert "no media_hooks schema" in closed.message
