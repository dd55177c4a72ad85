"""The operator jobs: retention on aged rows (tombstones kept), and requeue of a cohort."""

from __future__ import annotations

import logging

from media_hooks.orchestration.jobs import requeue_cohort, retention
from media_hooks.orchestration.resources import PostgresResource
from media_hooks.outbox.maintenance.retention import is_tombstoned
from media_hooks_tests.factories import add_deliveries, add_destination

DAY = 86400


def _resources(database_url: str) -> dict:
    return {"postgres": PostgresResource(database_url=database_url)}


def _past_the_range_before_the_first(conn) -> float:
    """A retention window, in days, that ends a minute after the range the migration made for
    what came before it (where a delivery created 40 days ago is), before any other ends."""
    return conn.execute(
        "SELECT extract(epoch FROM now() - upper_at - interval '1 minute')::float8 / 86400 AS d "
        "FROM media_hooks_partition WHERE child = 'delivery_history_before'"
    ).fetchone()["d"]


def test_retention_job_purges_aged_terminal_rows_and_keeps_tombstones(instance, database_url, conn):
    """This layout's aged deliveries go with their range, the previous layout's row by row in
    batches; every id stays recognised (its identity row is the tombstone)."""
    add_destination(conn, "live", "http://127.0.0.1:9/live")
    old = add_deliveries(conn, "live", 4, state="succeeded", age_seconds=40 * DAY)
    old_previous = add_deliveries(
        conn,
        "live",
        4,
        state="succeeded",
        prefix="previous",
        age_seconds=40 * DAY,
        previous_release=True,
    )
    recent = add_deliveries(conn, "live", 2, state="dead", prefix="recent")
    config = {"batch_size": 3, "retain_days": _past_the_range_before_the_first(conn)}
    result = retention.execute_in_process(
        run_config={"ops": {"purge_terminal_deliveries": {"config": config}}},
        resources=_resources(database_url),
        instance=instance,
    )
    assert result.success
    figures = result.output_for_node("purge_terminal_deliveries")
    assert (figures["deliveries"], figures["partitions_dropped"]) == (8, 1)
    assert (figures["tombstones_written"], figures["batches"]) == (4, 2)
    left = [r["delivery_id"] for r in conn.execute("SELECT delivery_id FROM webhook_delivery_all")]
    assert sorted(left) == sorted(recent)
    assert all(is_tombstoned(conn, delivery_id) for delivery_id in old + old_previous)
    # The previous layout's purge writes its tombstones' final state; a dropped range, nothing.
    tombs = [r["delivery_id"] for r in conn.execute("SELECT delivery_id FROM delivery_tombstone")]
    assert sorted(tombs) == sorted(old_previous)


def test_the_retention_job_keeps_a_range_an_open_delivery_holds_and_says_so(
    instance, database_url, conn
):
    add_destination(conn, "live", "http://127.0.0.1:9/live")
    add_deliveries(conn, "live", 2, state="succeeded", age_seconds=40 * DAY)
    add_deliveries(conn, "live", 1, prefix="waiting", age_seconds=40 * DAY)
    config = {"retain_days": _past_the_range_before_the_first(conn)}
    result = retention.execute_in_process(
        run_config={"ops": {"purge_terminal_deliveries": {"config": config}}},
        resources=_resources(database_url),
        instance=instance,
    )
    assert result.success
    figures = result.output_for_node("purge_terminal_deliveries")
    assert (figures["deliveries"], figures["partitions_dropped"]) == (0, 0)
    assert figures["partitions_held"] == 1
    (held,) = figures["held_ranges"]
    assert "held by 1 open deliveries, the oldest to destination live" in held
    warnings = [
        entry.user_message
        for entry in instance.all_logs(result.run_id)
        if entry.level == logging.WARNING
    ]
    assert f"retention: {held}" in warnings
    assert conn.execute("SELECT count(*) AS n FROM webhook_delivery_all").fetchone()["n"] == 3


def test_one_retention_run_purges_more_than_a_thousand_batches_by_default(
    instance, database_url, conn
):
    """A daily run must purge a day's deliveries: a run stopped at 1,000 batches (a million
    deliveries, the bound before) fell a little further behind every day at more. The previous
    layout's table is still purged in batches."""
    add_destination(conn, "live", "http://127.0.0.1:9/live")
    add_deliveries(
        conn, "live", 1500, state="succeeded", age_seconds=40 * DAY, previous_release=True
    )
    result = retention.execute_in_process(
        run_config={"ops": {"purge_terminal_deliveries": {"config": {"batch_size": 1}}}},
        resources=_resources(database_url),
        instance=instance,
    )
    figures = result.output_for_node("purge_terminal_deliveries")
    assert (figures["deliveries"], figures["truncated"]) == (1500, False)
    assert conn.execute("SELECT count(*) AS n FROM webhook_delivery_all").fetchone()["n"] == 0


def test_requeue_job_dry_run_moves_nothing_then_the_real_one_moves_the_cohort(
    instance, database_url, conn
):
    add_destination(conn, "a", "http://127.0.0.1:9/a")
    add_destination(conn, "b", "http://127.0.0.1:9/b")
    add_deliveries(conn, "a", 3, state="dead")
    add_deliveries(conn, "b", 2, state="dead")
    config = {"destination_ids": ["a"], "reason": "receiver fixed", "dry_run": True}

    dry = requeue_cohort.execute_in_process(
        run_config={"ops": {"requeue_deliveries": {"config": config}}},
        resources=_resources(database_url),
        instance=instance,
    )
    assert dry.output_for_node("requeue_deliveries") == {
        "matched": 3,
        "moved": 0,
        "by_state": {"dead": 3},
    }
    assert (
        conn.execute(
            "SELECT count(*) AS n FROM webhook_delivery_all WHERE state = 'dead'"
        ).fetchone()["n"]
        == 5
    )

    real = requeue_cohort.execute_in_process(
        run_config={"ops": {"requeue_deliveries": {"config": {**config, "dry_run": False}}}},
        resources=_resources(database_url),
        instance=instance,
    )
    assert real.output_for_node("requeue_deliveries")["moved"] == 3
    states = conn.execute(
        "SELECT destination_id, state, count(*) AS n FROM webhook_delivery_all GROUP BY 1, 2 ORDER BY 1"
    ).fetchall()
    assert [(r["destination_id"], r["state"], r["n"]) for r in states] == [
        ("a", "pending", 3),
        ("b", "dead", 2),
    ]
    assert instance.get_run_by_id(real.run_id).tags["media_hooks/cohort.destination_ids"] == "a"
