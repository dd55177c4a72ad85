"""Retention on aged rows: terminal deliveries go with their rows, tombstones stay."""

from __future__ import annotations

import pytest

from media_hooks.core.errors import UserError
from media_hooks.outbox.cohort import Cohort
from media_hooks.outbox.emit import Event, emit, emit_many
from media_hooks.outbox.maintenance import retention
from media_hooks.outbox.maintenance.requeue import requeue
from media_hooks.store.sqlfiles import query
from media_hooks_tests.factories import (
    add_deliveries,
    add_destination,
    add_dispatches,
    claim_all,
    delivery,
)
from media_hooks_tests.interleaving import in_background, open_session, wait_until_blocked

DAY = 86400


def _with_history(conn, ids: list[str]) -> None:
    """One outbox row and one attempt per delivery, as a delivery run leaves them."""
    add_dispatches(conn, ids)
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


def _terminal_and_old(conn, delivery_id: str, state: str = "succeeded") -> None:
    conn.execute(
        "UPDATE webhook_delivery SET state = %s, updated_at = now() - interval '40 days' "
        "WHERE delivery_id = %s",
        (state, delivery_id),
    )


def _emit_one(conn, event: Event) -> int:
    return int(emit(conn, event).inserted)


def _emit_bulk(conn, event: Event) -> int:
    return emit_many(conn, [event]).inserted


@pytest.mark.parametrize("legacy", [False, True], ids=["identity", "pre-0005 row"])
@pytest.mark.parametrize("emit_path", [_emit_one, _emit_bulk], ids=["emit", "emit_many"])
def test_an_emit_racing_the_purge_of_its_id_records_nothing(conn, database_url, emit_path, legacy):
    """Hole 2, invariant 8: the purge (T1) turns the delivery into a tombstone; an emit of the
    same id (T2) that starts before T1 commits must not record a second, live delivery once
    T1 commits. Both emit paths, each interleaved at the purge's uncommitted statement; also
    for a row recorded before identities existed (the purge writes its identity then)."""
    add_destination(conn, "live", "http://127.0.0.1:9/live")
    event = Event("live", "asset-1", "transcode.completed", {"n": 1}, delivery_id="race-1")
    assert emit(conn, event).inserted
    _terminal_and_old(conn, "race-1")
    if legacy:
        conn.execute("DELETE FROM delivery_identity WHERE delivery_id = 'race-1'")

    with (
        open_session(database_url) as purger,
        open_session(database_url, autocommit=True) as producer,
    ):
        row = _purge(conn, purger)
        assert row["deliveries"] == 1  # T1 purged it and holds its transaction open
        with in_background(lambda: emit_path(producer, event)) as emitted:
            wait_until_blocked(conn, producer.info.backend_pid, emitted)
            purger.commit()
        assert emitted.result() == 0

    assert _count(conn, "webhook_delivery") == 0
    assert retention.is_tombstoned(conn, "race-1")


@pytest.mark.parametrize("emit_path", [_emit_one, _emit_bulk], ids=["emit", "emit_many"])
def test_a_purge_racing_an_uncommitted_emit_of_a_legacy_id_keeps_one_identity(
    conn, database_url, emit_path
):
    """The other order, for a delivery recorded before its identity existed (a row written by
    code older than migration 0005): T2's emit is open when T1 purges; whichever commits, the id
    ends as exactly one thing, a tombstone, and no live row."""
    add_destination(conn, "live", "http://127.0.0.1:9/live")
    event = Event("live", "asset-1", "transcode.completed", {"n": 1}, delivery_id="race-2")
    assert emit(conn, event).inserted
    _terminal_and_old(conn, "race-2")
    conn.execute("DELETE FROM delivery_identity WHERE delivery_id = 'race-2'")

    with open_session(database_url) as producer, open_session(database_url) as purger:
        assert emit_path(producer, event) == 0  # the live row is there: nothing recorded
        with in_background(lambda: _purge(conn, purger)) as purged:
            wait_until_blocked(conn, purger.info.backend_pid, purged)
            producer.commit()
        assert purged.result()["deliveries"] == 1
        purger.commit()

    assert _count(conn, "webhook_delivery") == 0
    assert retention.is_tombstoned(conn, "race-2")
    assert emit(conn, event).inserted is False


def _requeue(conn) -> int:
    return requeue(conn, Cohort(("live",)), reason="publisher fixed", requested_by="ops").moved


def test_a_requeue_waiting_on_the_purge_of_its_delivery_moves_nothing(conn, database_url):
    """The purge (T1) deletes a dead delivery and its dispatches, found by their message ids
    (migration 0032: no foreign key holds them to it); a requeue of it (T2) waits on T1's row
    lock and, once T1 commits, finds nothing to move, so no claim can add a dispatch to it."""
    add_destination(conn, "live", "http://127.0.0.1:9/live")
    (dead,) = add_deliveries(conn, "live", 1, state="dead", age_seconds=40 * DAY)
    add_dispatches(conn, [dead])
    add_dispatches(conn, [dead])
    with (
        open_session(database_url) as purger,
        open_session(database_url, autocommit=True) as operator,
    ):
        row = _purge(conn, purger)
        assert (row["deliveries"], row["outbox_rows"]) == (1, 2)
        with in_background(lambda: _requeue(operator)) as requeued:
            wait_until_blocked(conn, operator.info.backend_pid, requeued)
            purger.commit()
        assert requeued.result() == 0
    assert _count(conn, "webhook_delivery") == 0
    assert _count(conn, "dispatch_outbox") == 0


def test_a_purge_passes_a_delivery_being_requeued_and_later_takes_every_dispatch(
    conn, database_url
):
    """The other order: the requeue (T2) holds the dead delivery, uncommitted; the purge (T1)
    passes it by (SKIP LOCKED) without waiting. Claimed again and dead again, the delivery has
    two dispatches, and the purge takes both with it: it counts them under its row lock."""
    add_destination(conn, "live", "http://127.0.0.1:9/live")
    (dead,) = add_deliveries(conn, "live", 1, state="dead", age_seconds=40 * DAY)
    add_dispatches(conn, [dead])
    with open_session(database_url) as operator:
        operator.execute("SELECT 1")  # its transaction open: the requeue is a savepoint in it
        assert _requeue(operator) == 1
        purged = _purge(conn)
        assert purged["deliveries"] == 0
        operator.commit()
    claim_all(conn, "run-again", Cohort(("live",)))
    assert delivery(conn, dead)["current_message_id"] == f"{dead}:2"
    _terminal_and_old(conn, dead, "dead")
    purged = _purge(conn)
    assert (purged["deliveries"], purged["outbox_rows"]) == (1, 2)
    assert _count(conn, "dispatch_outbox") == 0


def _purge(conn, session=None) -> dict:
    """One purge batch, in ``session`` when given (left open unless it is in autocommit)."""
    return (
        (session or conn)
        .execute(query("purge_terminal_batch"), {"cutoff": _cutoff(conn), "batch_size": 10})
        .fetchone()
    )


def _cutoff(conn):
    return conn.execute("SELECT now() - interval '30 days' AS cutoff").fetchone()["cutoff"]
