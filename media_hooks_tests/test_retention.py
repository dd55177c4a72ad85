"""Retention on aged rows: terminal deliveries go with their rows, tombstones stay."""

from __future__ import annotations

import pytest

from media_hooks import retention
from media_hooks.emit import Event, emit, emit_many
from media_hooks.errors import UserError
from media_hooks_tests.factories import add_deliveries, add_destination

DAY = 86400


def _with_history(conn, ids: list[str]) -> None:
    """One outbox row and one attempt per delivery, as a delivery run leaves them."""
    conn.execute(
        "INSERT INTO dispatch_outbox (message_id, delivery_id, dispatch_no, destination_id, "
        "run_id, body, published_at) SELECT d || ':1', d, 1, 'live', 'run-old', 'x', now() "
        "FROM unnest(%s::text[]) AS d",
        (ids,),
    )
    conn.execute(
        "INSERT INTO delivery_attempt (delivery_id, attempt_no, destination_id, lease_token, "
        "finished_at, outcome) SELECT d, 1, 'live', gen_random_uuid(), now(), 'success' "
        "FROM unnest(%s::text[]) AS d",
        (ids,),
    )


def _count(conn, table: str) -> int:
    return conn.execute(f"SELECT count(*) AS n FROM {table}").fetchone()["n"]


def test_retention_purges_old_terminal_rows_and_keeps_tombstones(conn):
    add_destination(conn, "live", "http://127.0.0.1:9/live")
    old_done = add_deliveries(conn, "live", 5, state="succeeded", age_seconds=40 * DAY)
    old_dead = add_deliveries(conn, "live", 2, state="dead", age_seconds=40 * DAY)
    recent = add_deliveries(conn, "live", 3, state="succeeded", prefix="recent", age_seconds=DAY)
    old_pending = add_deliveries(conn, "live", 2, age_seconds=40 * DAY)
    _with_history(conn, old_done + old_dead + recent)

    figures = retention.run_retention(conn, retention.RetentionPolicy(batch_size=3))

    assert figures.deliveries == 7
    assert figures.outbox_rows == 7
    assert figures.attempts == 7
    assert figures.tombstones_written == 7
    assert figures.batches == 3  # 3 + 3 + 1, bounded
    assert not figures.truncated
    left = {r["delivery_id"] for r in conn.execute("SELECT delivery_id FROM webhook_delivery")}
    assert left == set(recent + old_pending)  # pending work is never purged (invariant 3)
    assert _count(conn, "dispatch_outbox") == 3
    assert _count(conn, "delivery_attempt") == 3
    tombs = conn.execute(
        "SELECT delivery_id, final_state FROM delivery_tombstone ORDER BY delivery_id"
    ).fetchall()
    assert {t["delivery_id"] for t in tombs} == set(old_done + old_dead)
    assert {t["final_state"] for t in tombs} == {"succeeded", "dead"}
    assert retention.is_tombstoned(conn, old_done[0])
    assert not retention.is_tombstoned(conn, recent[0])

    again = retention.run_retention(conn, retention.RetentionPolicy(batch_size=3))
    assert again.deliveries == 0 and again.tombstones_expired == 0


def test_max_batches_bounds_one_pass(conn):
    add_destination(conn, "live", "http://127.0.0.1:9/live")
    add_deliveries(conn, "live", 5, state="succeeded", age_seconds=40 * DAY)
    figures = retention.run_retention(conn, retention.RetentionPolicy(batch_size=2, max_batches=2))
    assert (figures.deliveries, figures.batches, figures.truncated) == (4, 2, True)
    assert _count(conn, "webhook_delivery") == 1


def test_tombstones_expire_after_the_duplicate_window(conn):
    conn.execute(
        "INSERT INTO delivery_tombstone (delivery_id, destination_id, final_state, created_at) "
        "VALUES ('ancient', 'live', 'succeeded', now() - interval '500 days'), "
        "('remembered', 'live', 'succeeded', now() - interval '100 days')"
    )
    figures = retention.run_retention(conn, retention.RetentionPolicy())
    assert figures.tombstones_expired == 1
    assert not retention.is_tombstoned(conn, "ancient")
    assert retention.is_tombstoned(conn, "remembered")


def test_a_duplicate_window_shorter_than_retention_is_refused():
    with pytest.raises(UserError, match="at least the retention window"):
        retention.RetentionPolicy(retain_seconds=10 * DAY, tombstone_seconds=DAY)


def test_a_purged_delivery_re_emitted_is_recognised_by_its_tombstone(conn):
    """Invariant 1 beyond retention: re-emitting an old event creates no second delivery."""
    add_destination(conn, "live", "http://127.0.0.1:9/live")
    (purged,) = add_deliveries(conn, "live", 1, state="succeeded", age_seconds=40 * DAY)
    retention.run_retention(conn, retention.RetentionPolicy())
    assert _count(conn, "webhook_delivery") == 0

    again = Event("live", "asset-1", "transcode.completed", {"n": 1}, delivery_id=purged)
    assert emit(conn, again).inserted is False
    fresh = Event("live", "asset-2", "transcode.completed", {"n": 2}, delivery_id="fresh-1")
    counts = emit_many(conn, [again, fresh])
    assert (counts.inserted, counts.already_present) == (1, 1)
    left = {r["delivery_id"] for r in conn.execute("SELECT delivery_id FROM webhook_delivery")}
    assert left == {"fresh-1"}
