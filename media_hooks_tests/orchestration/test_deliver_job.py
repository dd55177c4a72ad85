"""``deliver_webhooks`` on a real instance, real PostgreSQL and a local receiver."""

from __future__ import annotations

import json
import os

import pytest
from dagster import DagsterEventType, ReexecutionOptions, execute_job, reconstructable

from media_hooks.core import crashpoints
from media_hooks.devtools.receiver import Receiver, Reply
from media_hooks.orchestration.definitions import deliver_webhooks_job
from media_hooks.orchestration.running import delivery_run_config
from media_hooks.outbox.maintenance import sweeps
from media_hooks_tests.factories import add_deliveries, add_destination
from media_hooks_tests.orchestration.conftest import SPAWN, deliver
from media_hooks_tests.plans import sql_block

SPAWN_NO_RETRIES = {
    "config": {"multiprocess": {**SPAWN["config"]["multiprocess"], "retries": {"disabled": {}}}}
}


def _step_outputs(instance, run_id: str) -> dict[str, dict]:
    """Output metadata of every step of a run (all its outputs' together), by step key."""
    records = instance.get_records_for_run(run_id, of_type=DagsterEventType.STEP_OUTPUT).records
    outputs: dict[str, dict] = {}
    for r in records:
        metadata = r.event_log_entry.dagster_event.step_output_data.metadata
        outputs.setdefault(r.event_log_entry.step_key, {}).update(
            {k: v.value for k, v in metadata.items()}
        )
    return outputs


def test_three_destinations_one_step_per_destination_counts_rows_carry_the_run_id(
    instance, database_url, conn, receiver
):
    destinations = ["alpha", "beta-1", "gamma:x"]
    for d in destinations:
        add_destination(conn, d, receiver.url + d)
        add_deliveries(conn, d, 4)

    run = deliver(instance, database_url)

    assert run.success
    assert receiver.effects == 12
    assert run.summary.claimed == 12
    assert run.summary.totals["succeeded"] == 12
    assert set(run.summary.per_destination) == set(destinations)
    outputs = _step_outputs(instance, run.run_id)
    (step,) = [k for k in outputs if k.startswith("deliver_shard[")]
    assert step == "deliver_shard[shard_1_of_1]"
    assert (outputs[step]["destinations"], outputs[step]["claimed"]) == (3, 12)
    assert outputs[step]["succeeded"] == 12
    for d in destinations:  # the UI's per-destination table, in the step and the run
        assert f"| {d} | 4 | 4 | 4 |" in outputs[step]["per_destination"]
        assert f"| {d} | 4 | 4 | 4 |" in outputs["summarize_run"]["per_destination"]
    assert outputs["prepare"]["due_destinations"] == 3
    assert "gamma:x" in outputs["prepare"]["destinations"]
    assert outputs["summarize_run"]["succeeded"] == 12
    # The operator's queries in the run's metadata list its 12 dispatches and 12 attempts.
    dispatches, attempts = [
        conn.execute(statement).fetchall()
        for statement in sql_block(outputs["summarize_run"]["rows_of_this_run"])
    ]
    assert {r["state"] for r in dispatches} == {"succeeded"} and len(dispatches) == 12
    assert {r["outcome"] for r in attempts} == {"success"} and len(attempts) == 12
    outbox = conn.execute("SELECT DISTINCT run_id FROM dispatch_outbox").fetchall()
    assert [r["run_id"] for r in outbox] == [run.run_id]
    attempts = conn.execute("SELECT DISTINCT run_id FROM delivery_attempt_all").fetchall()
    assert [r["run_id"] for r in attempts] == [run.run_id]
    states = conn.execute("SELECT DISTINCT state FROM webhook_delivery_all").fetchall()
    assert [r["state"] for r in states] == ["succeeded"]
    tags = instance.get_run_by_id(run.run_id).tags
    assert tags["media_hooks/kind"] == "delivery"
    assert tags["media_hooks/cohort.filter"] == "all"
    assert tags["media_hooks/outcome"] == "all-delivered"
    assert (tags["media_hooks/claimed"], tags["media_hooks/delivered"]) == ("12", "12")
    worker = json.loads(tags["media_hooks/worker"])
    assert (worker["run_id"], worker["pid"]) == (run.run_id, os.getpid())


def test_a_capped_run_with_shards_claims_its_cap_when_every_due_destination_is_in_one_shard(
    instance, database_url, conn, receiver
):
    """Two shards, a cap of 6, and both due destinations hashed to the second shard: that
    shard takes the whole cap (an even split would have claimed 3 and left 3 due)."""
    for d in ("beta", "gamma"):  # both in shard 2 of 2 (crc32 % 2 == 1)
        add_destination(conn, d, receiver.url + d)
        add_deliveries(conn, d, 4)

    run = deliver(instance, database_url, {"max_rows": 6, "shards": 2})

    assert run.success
    assert run.summary.claimed == 6
    assert receiver.effects == 6
    outputs = _step_outputs(instance, run.run_id)
    assert outputs["deliver_shard[shard_2_of_2]"]["claimed"] == 6
    assert outputs["deliver_shard[shard_1_of_2]"]["claimed"] == 0


def test_a_cohort_run_takes_only_its_cohort_and_tags_the_run(
    instance, database_url, conn, receiver
):
    for d in ("alpha", "beta"):
        add_destination(conn, d, receiver.url + d)
        add_deliveries(conn, d, 3)
    run = deliver(instance, database_url, {"destination_ids": ["beta"], "max_rows": 2})
    assert run.success
    assert run.summary.as_dict()["destinations"] == {
        "beta": {"claimed": 2, "succeeded": 2, "retried": 0, "dead": 0, "ambiguous": 0}
    }
    assert instance.get_run_by_id(run.run_id).tags["media_hooks/cohort.destination_ids"] == "beta"
    pending = conn.execute(
        "SELECT destination_id, count(*) AS n FROM webhook_delivery_all WHERE state = 'pending' "
        "GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert [(r["destination_id"], r["n"]) for r in pending] == [("alpha", 3), ("beta", 1)]


def test_a_run_whose_receivers_refuse_everything_succeeds_and_says_so(instance, database_url, conn):
    """Receivers' answers never fail a run (only infrastructure faults do); the run list shows
    what became of it."""
    with (
        Receiver(reply=Reply(status=400)) as refusing,
        Receiver(reply=Reply(status=503)) as failing,
    ):
        add_destination(conn, "refusing", refusing.url)
        # Retried no sooner than an hour: the second run finds nothing due however late it starts.
        add_destination(
            conn, "failing", failing.url, backoff_base_seconds=3600, backoff_cap_seconds=3600
        )
        add_deliveries(conn, "refusing", 3)
        add_deliveries(conn, "failing", 2)
        run = deliver(instance, database_url)
    nothing_due = deliver(instance, database_url)

    assert run.success and nothing_due.success
    tags = instance.get_run_by_id(run.run_id).tags
    assert tags["media_hooks/outcome"] == "nothing-delivered"
    assert (tags["media_hooks/claimed"], tags["media_hooks/delivered"]) == ("5", "0")
    assert _step_outputs(instance, run.run_id)["summarize_run"]["outcome"] == "nothing-delivered"
    assert instance.get_run_by_id(nothing_due.run_id).tags["media_hooks/outcome"] == "nothing-due"


def test_a_rate_limited_destination_does_not_delay_another(instance, database_url, conn, receiver):
    add_destination(
        conn, "slow", receiver.url + "slow", rate_per_second=2, burst=1, max_in_flight=1
    )
    add_destination(
        conn, "fast", receiver.url + "fast", rate_per_second=1000, burst=100, max_in_flight=8
    )
    add_deliveries(conn, "slow", 10)
    add_deliveries(conn, "fast", 100)

    run = deliver(instance, database_url)

    assert run.success
    assert receiver.effects == 110
    arrivals = {"slow": [], "fast": []}
    for request in receiver.requests:
        arrivals[request.path.strip("/")].append(request.arrived_monotonic)
    slow_span = max(arrivals["slow"]) - min(arrivals["slow"])
    assert slow_span >= 4.0  # 10 requests at 2/s with a burst of 1
    # The fast destination's 100 deliveries are all done while the slow one is still sending.
    assert max(arrivals["fast"]) < max(arrivals["slow"]) - 2.0


@pytest.mark.one_server
def test_reexecution_from_failure_sends_no_succeeded_delivery_twice(
    instance, database_url, conn, receiver, monkeypatch
):
    # One send at a time in practice (a start every 100 ms, on the limiter's exact timeline),
    # with in-flight slots to spare: the slot the crashed worker held stays taken until its
    # lease ends. The crash at the 5th send (400 ms in) comes after the first outcomes are
    # recorded (at most RECORD_MAX_DELAY_SECONDS, 200 ms, after they finish).
    add_destination(
        conn, "only", receiver.url + "only", max_in_flight=4, rate_per_second=10, burst=1
    )
    ids = add_deliveries(conn, "only", 8)
    # An infrastructure fault: the step process dies after the receiver accepted the 6th send
    # (fresh processes read the crash point; Dagster's step retries are off so the run fails).
    # The sends go out 50 ms apart to the millisecond (starts are granted ahead for their
    # moment): the first outcomes are recorded 0.2 s after the first send, 50 ms before the 6th.
    monkeypatch.setenv("MEDIA_HOOKS_CRASH_AT", crashpoints.AFTER_RECEIVER_ACCEPTED)
    monkeypatch.setenv("MEDIA_HOOKS_CRASH_AFTER", "5")
    failed = deliver(instance, database_url, execution=SPAWN_NO_RETRIES)
    monkeypatch.delenv("MEDIA_HOOKS_CRASH_AT")
    monkeypatch.delenv("MEDIA_HOOKS_CRASH_AFTER")
    assert not failed.success
    done_before = {
        r["delivery_id"]
        for r in conn.execute(
            "SELECT delivery_id FROM webhook_delivery_all WHERE state = 'succeeded'"
        )
    }
    assert 1 <= len(done_before) <= 5
    # What the run-failure sensor does as soon as Dagster reports the failure.
    assert sweeps.release_run(conn, failed.run_id) == len(ids) - len(done_before)

    run_config = delivery_run_config({}, resources={"postgres": {"database_url": database_url}})
    with execute_job(
        reconstructable(deliver_webhooks_job),
        instance=instance,
        run_config=run_config,
        reexecution_options=ReexecutionOptions.from_failure(failed.run_id, instance),
    ) as reexecuted:
        assert reexecuted.success
    follow_up = deliver(instance, database_url)
    assert follow_up.success

    assert receiver.accepted_ids == set(ids)
    sent = [r.webhook_id for r in receiver.requests]
    for delivery_id in done_before:
        assert sent.count(delivery_id) == 1, delivery_id
    # Only those the crash cut off between "accepted" and "recorded" went out again.
    assert len(sent) <= len(ids) + 2


@pytest.mark.parametrize("runtime", ["python", "node"])
def test_a_failure_to_record_outcomes_fails_the_step_without_a_dagster_retry(
    request, instance, database_url, conn, receiver, runtime
):
    """Hole 9: outcomes that cannot be recorded (here a database rule refuses them) are never
    hidden behind a step retry; the failure names the deliveries and the cause. The same with
    the Node worker in the step."""
    if runtime == "node":
        request.getfixturevalue("node")
    add_destination(conn, "only", receiver.url + "only")
    add_deliveries(conn, "only", 2)
    conn.execute(
        """
        CREATE FUNCTION refuse_outcomes() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'outcomes refused by a test rule'; END $$;
        -- An attempt of this layout is written once, when its outcome is recorded.
        CREATE TRIGGER refuse_outcomes BEFORE INSERT ON delivery_attempt_v2
            FOR EACH ROW EXECUTE FUNCTION refuse_outcomes();
        """
    )

    run = deliver(instance, database_url, {"runtime": runtime})

    assert not run.success
    assert receiver.effects == 2
    retries = instance.get_records_for_run(
        run.run_id, of_type=DagsterEventType.STEP_UP_FOR_RETRY
    ).records
    assert retries == []
    (failure,) = instance.get_records_for_run(
        run.run_id, of_type=DagsterEventType.STEP_FAILURE
    ).records
    message = failure.event_log_entry.dagster_event.step_failure_data.error.message
    assert "could not record" in message and "outcomes refused by a test rule" in message
    assert "d-only-1" in message


def test_an_infrastructure_fault_in_a_delivery_step_is_retried_by_dagster(
    instance, database_url, conn, receiver
):
    """A fault outside the webhook table's own retries (here the database refuses the first
    claim) fails the step, and Dagster runs it again; the deliveries go out once."""
    add_destination(conn, "only", receiver.url + "only")
    add_deliveries(conn, "only", 2)
    conn.execute(
        """
        CREATE SEQUENCE claims_seen;
        CREATE FUNCTION refuse_the_first_claim() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            -- nextval survives the rollback the refusal causes: only the first claim fails.
            IF nextval('claims_seen') = 1 THEN RAISE EXCEPTION 'a passing fault'; END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER refuse_the_first_claim BEFORE INSERT ON dispatch_outbox_v3
            FOR EACH ROW EXECUTE FUNCTION refuse_the_first_claim();
        """
    )

    run = deliver(instance, database_url)

    assert run.success
    assert receiver.effects == 2 and len(receiver.requests) == 2
    retries = instance.get_records_for_run(
        run.run_id, of_type=DagsterEventType.STEP_UP_FOR_RETRY
    ).records
    assert [r.event_log_entry.step_key for r in retries] == ["deliver_shard[shard_1_of_1]"]
