"""The operator jobs: retention on aged rows (tombstones kept), and requeue of a cohort."""

from __future__ import annotations

from media_hooks.orchestration.jobs import requeue_cohort, retention
from media_hooks.orchestration.resources import PostgresResource
from media_hooks_tests.factories import add_deliveries, add_destination

DAY = 86400


def _resources(database_url: str) -> dict:
    return {"postgres": PostgresResource(database_url=database_url)}


def test_retention_job_purges_aged_terminal_rows_and_keeps_tombstones(instance, database_url, conn):
    add_destination(conn, "live", "http://127.0.0.1:9/live")
    old = add_deliveries(conn, "live", 4, state="succeeded", age_seconds=40 * DAY)
    recent = add_deliveries(conn, "live", 2, state="dead", prefix="recent", age_seconds=DAY)
    result = retention.execute_in_process(
        run_config={"ops": {"purge_terminal_deliveries": {"config": {"batch_size": 3}}}},
        resources=_resources(database_url),
        instance=instance,
    )
    assert result.success
    figures = result.output_for_node("purge_terminal_deliveries")
    assert (figures["deliveries"], figures["tombstones_written"], figures["batches"]) == (4, 4, 2)
    left = [r["delivery_id"] for r in conn.execute("SELECT delivery_id FROM webhook_delivery")]
    assert sorted(left) == sorted(recent)
    tombs = [r["delivery_id"] for r in conn.execute("SELECT delivery_id FROM delivery_tombstone")]
    assert sorted(tombs) == sorted(old)


def test_one_retention_run_purges_more_than_a_thousand_batches_by_default(
    instance, database_url, conn
):
    """A daily run must purge a day's deliveries: a run stopped at 1,000 batches (a million
    deliveries, the bound before) fell a little further behind every day at more."""
    add_destination(conn, "live", "http://127.0.0.1:9/live")
    add_deliveries(conn, "live", 1500, state="succeeded", age_seconds=40 * DAY)
    result = retention.execute_in_process(
        run_config={"ops": {"purge_terminal_deliveries": {"config": {"batch_size": 1}}}},
        resources=_resources(database_url),
        instance=instance,
    )
    figures = result.output_for_node("purge_terminal_deliveries")
    assert (figures["deliveries"], figures["truncated"]) == (1500, False)
    assert conn.execute("SELECT count(*) AS n FROM webhook_delivery").fetchone()["n"] == 0


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
        conn.execute("SELECT count(*) AS n FROM webhook_delivery WHERE state = 'dead'").fetchone()[
            "n"
        ]
        == 5
    )

    real = requeue_cohort.execute_in_process(
        run_config={"ops": {"requeue_deliveries": {"config": {**config, "dry_run": False}}}},
        resources=_resources(database_url),
        instance=instance,
    )
    assert real.output_for_node("requeue_deliveries")["moved"] == 3
    states = conn.execute(
        "SELECT destination_id, state, count(*) AS n FROM webhook_delivery GROUP BY 1, 2 ORDER BY 1"
    ).fetchall()
    assert [(r["destination_id"], r["state"], r["n"]) for r in states] == [
        ("a", "pending", 3),
        ("b", "dead", 2),
    ]
    assert instance.get_run_by_id(real.run_id).tags["media_hooks/cohort.destination_ids"] == "a"
