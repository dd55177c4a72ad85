"""Delivery steps on two real Celery workers (issue 31, items 2 and 3): a run's shards land on
both, every destination's limits hold at a real receiver while both workers send to it, and a
worker killed mid-run with its whole process group loses nothing.

Each test starts two ``media-hooks worker`` processes (their own homes, their own process
groups), runs ``media-hooks run`` as a user does, with the Celery broker configured, and reads
what happened from Dagster's event log (which worker executed which step), the receiver's log
and the tables.
"""

from __future__ import annotations

import json
import signal
import time
import zlib
from collections import defaultdict

import pytest
from dagster import RunsFilter

from media_hooks.devtools.celery_workers import attempted_by_worker, executions
from media_hooks.devtools.receiver import ReceivedRequest, Receiver, Reply
from media_hooks_tests.conftest import run_cli, run_cli_together, start_cli
from media_hooks_tests.envelope import envelope_excess
from media_hooks_tests.factories import add_deliveries, add_destination, states
from media_hooks_tests.interleaving import wait_for

# Long, and what they prove does not depend on the PostgreSQL version.
pytestmark = pytest.mark.one_server
RATE, BURST, IN_FLIGHT = 10.0, 2, 2
ANSWER = Reply(delay_seconds=0.2)


def _destinations(per_shard: int, shards: int = 2) -> list[str]:
    """Destination ids, ``per_shard`` in each of ``shards`` shards (ops/delivery.py, Shard)."""
    chosen: dict[int, list[str]] = defaultdict(list)
    n = 0
    while any(len(chosen[i]) < per_shard for i in range(shards)):
        name = f"pub-{n}"
        bucket = zlib.crc32(name.encode()) % shards
        if len(chosen[bucket]) < per_shard:
            chosen[bucket].append(name)
        n += 1
    return [d for i in range(shards) for d in chosen[i]]


def _add_publishers(conn, receiver: Receiver, ids: list[str], each: int) -> None:
    for destination_id in ids:
        add_destination(
            conn,
            destination_id,
            f"{receiver.url}{destination_id}",
            rate_per_second=RATE,
            burst=BURST,
            max_in_flight=IN_FLIGHT,
            timeout_seconds=5,
        )
        add_deliveries(conn, destination_id, each)


def _by_destination(requests: list[ReceivedRequest]) -> dict[str, list[ReceivedRequest]]:
    found: dict[str, list[ReceivedRequest]] = defaultdict(list)
    for request in requests:
        found[request.path.strip("/")].append(request)
    return found


def _most_in_flight(requests: list[ReceivedRequest]) -> int:
    edges = sorted(
        [(r.arrived_monotonic, 1) for r in requests]
        + [(r.finished_monotonic, -1) for r in requests]
    )
    now = most = 0
    for _, change in edges:
        now += change
        most = max(most, now)
    return most


def _delivery_runs(instance) -> list:
    return list(instance.get_runs(RunsFilter(job_name="deliver_webhooks")))


def test_shards_land_on_both_workers_and_limits_hold_across_them(
    conn, celery_env, own_instance, workers
):
    started = workers.start(2)
    nodes = {w.name for w in started}
    ids = _destinations(per_shard=2)
    with Receiver(reply=ANSWER) as receiver:
        _add_publishers(conn, receiver, ids, 30)

        # One run: its shards follow the workers (two processes, two shards), one on each.
        one = run_cli("run", "--json", env=celery_env, timeout=240)

        assert one.returncode == 0, one.stderr
        (summary,) = json.loads(one.stdout)["runs"]
        assert summary["succeeded"] == 4 * 30
        (run,) = _delivery_runs(own_instance)
        executed = executions(own_instance, run.run_id)
        shards = sorted(step for step in executed if step.startswith("deliver_shard"))
        assert shards == ["deliver_shard[shard_1_of_2]", "deliver_shard[shard_2_of_2]"]
        assert {executed[step][-1] for step in shards} == nodes
        by_worker = attempted_by_worker(own_instance, run.run_id)
        assert set(by_worker) == nodes and sum(by_worker.values()) == 4 * 30
        assert all(count >= 30 for count in by_worker.values()), by_worker

        # Two runs at once, one shard each, small pages: both workers send to every
        # destination at the same time, and its limits (in PostgreSQL) hold across them.
        for destination_id in ids:
            add_deliveries(conn, destination_id, 40, prefix="both")
        first_request = len(receiver.requests)
        both = run_cli_together(
            "run", "--shards", "1", "--page-size", "4", "--json", env=celery_env, timeout=240
        )

        assert [r.returncode for r in both] == [0, 0], [r.stderr for r in both]
        assert states(conn) == {"succeeded": 4 * 70}
        second = [r for r in _delivery_runs(own_instance) if r.run_id != run.run_id]
        assert len(second) == 2
        (a, b) = (executions(own_instance, r.run_id)["deliver_shard[shard_1_of_1]"] for r in second)
        assert {a[-1], b[-1]} == nodes
        shared = conn.execute(
            "SELECT d.destination_id, count(DISTINCT a.run_id) AS runs FROM delivery_attempt_all a "
            "JOIN webhook_delivery_all d USING (delivery_id) WHERE d.delivery_id LIKE 'both-%%' "
            "GROUP BY 1"
        ).fetchall()
        assert {r["destination_id"]: r["runs"] for r in shared} == dict.fromkeys(ids, 2)
        for destination_id, requests in _by_destination(receiver.requests[first_request:]).items():
            assert (
                envelope_excess((r.arrived_monotonic for r in requests), rate=RATE, burst=BURST)
                <= 0
            ), destination_id
            assert _most_in_flight(requests) <= IN_FLIGHT, destination_id
        for destination_id, requests in _by_destination(receiver.requests[:first_request]).items():
            assert (
                envelope_excess((r.arrived_monotonic for r in requests), rate=RATE, burst=BURST)
                <= 0
            ), destination_id
            assert _most_in_flight(requests) <= IN_FLIGHT, destination_id


def test_a_worker_killed_mid_run_loses_nothing(conn, celery_env, own_instance, workers):
    env = dict(celery_env, MEDIA_HOOKS_LEASE_SECONDS="10")
    started = workers.start(2, MEDIA_HOOKS_LEASE_SECONDS="10")
    ids = _destinations(per_shard=2)
    each = 60
    with Receiver(reply=ANSWER) as receiver:
        _add_publishers(conn, receiver, ids, each)
        running = start_cli("run", "--until-idle", "--max-seconds", "200", "--json", env=env)
        try:

            def both_shards_started() -> bool:
                runs = _delivery_runs(own_instance)
                executed = executions(own_instance, runs[-1].run_id) if runs else {}
                return sum(s.startswith("deliver_shard") for s in executed) == 2

            wait_for(both_shards_started, "both shards on their workers", timeout=180)
            (run,) = _delivery_runs(own_instance)
            executed = executions(own_instance, run.run_id)
            step = "deliver_shard[shard_1_of_2]"
            (victim_name,) = executed[step]
            (victim,) = [w for w in started if w.name == victim_name]
            (survivor,) = [w for w in started if w is not victim]
            victim_ids = ids[:2]  # shard 1's destinations (_destinations)

            def mid_delivery() -> bool:
                sent = _by_destination(receiver.requests)
                return all(len(sent.get(d, [])) >= 10 for d in victim_ids)

            wait_for(mid_delivery, "the victim's shard mid-delivery", timeout=120)
            killed_at = time.monotonic()
            workers.kill(victim)  # its host is lost: no process of it hands anything back
            out, err = running.communicate(timeout=300)
        finally:
            if running.poll() is None:
                running.send_signal(signal.SIGKILL)
                running.wait()

    assert running.returncode == 0, err
    # Nothing lost: every delivery succeeded, once.
    assert states(conn) == {"succeeded": 4 * each}
    twice = conn.execute(
        "SELECT delivery_id FROM delivery_attempt_all WHERE outcome = 'success' "
        "GROUP BY 1 HAVING count(*) > 1"
    ).fetchall()
    assert twice == []
    # Every request the receiver saw more than once had an ambiguous attempt before it.
    repeated = [i for i, n in receiver.requests_by_id.items() if n > 1]
    explained = {
        r["delivery_id"]
        for r in conn.execute(
            "SELECT DISTINCT delivery_id FROM delivery_attempt_all WHERE outcome = 'ambiguous'"
        ).fetchall()
    }
    assert set(repeated) <= explained, set(repeated) - explained
    # (Not vacuous: the kill cut requests off in flight, closed as ambiguous, sent again.)
    assert explained
    check = run_cli("check", env=env)
    assert check.returncode == 0, check.stdout + check.stderr
    # The killed worker's shard executed again on the other worker, which delivered its
    # destinations, well within two minutes of the kill.
    assert executions(own_instance, run.run_id)[step] == [victim.name, survivor.name]
    sent = _by_destination(receiver.requests)
    assert max(r.arrived_monotonic for d in victim_ids for r in sent[d]) < killed_at + 120
    released = [
        r.event_log_entry.user_message
        for r in own_instance.get_records_for_run(run.run_id).records
        if "an earlier attempt of this step" in (r.event_log_entry.user_message or "")
    ]
    assert len(released) == 1 and not released[0].startswith(
        "an earlier attempt of this step started in this run: 0 "
    ), released
    # The limits held across the two workers' sends to the killed worker's destinations.
    for destination_id in victim_ids:
        requests = sent[destination_id]
        assert (
            envelope_excess((r.arrived_monotonic for r in requests), rate=RATE, burst=BURST) <= 0
        ), destination_id
        assert _most_in_flight(requests) <= IN_FLIGHT, destination_id
    assert receiver.accepted_ids == {f"d-{d}-{n}" for d in ids for n in range(1, each + 1)}
