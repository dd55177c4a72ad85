"""Retention on aged deliveries: this layout's go a range of partitions at a time, the previous
layout's row by row; the identity of each stays for the duplicate window.

A fresh test database has the ranges its migration made: one for everything created before the
day before it was migrated (``…_before``, where a delivery created 40 days ago lands), then one a
day from there to a week ahead. ``_past_before`` is a retention window that only the first of
them is past.
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from media_hooks.core.errors import UserError
from media_hooks.outbox.cohort import Cohort
from media_hooks.outbox.emit import Event, emit, emit_many
from media_hooks.outbox.maintenance import partitions, retention, sweeps
from media_hooks.outbox.maintenance.requeue import requeue
from media_hooks.store import db, migrations, sqlfiles
from media_hooks.store.sqlfiles import query
from media_hooks_tests.factories import (
    add_deliveries,
    add_destination,
    add_dispatches,
    claim_all,
    delivery,
)
from media_hooks_tests.interleaving import (
    in_background,
    open_session,
    snapshot_held,
    wait_until_blocked,
)

DAY = 86400
BEFORE = "delivery_history_before"


def _ended(conn, state: str, count: int, *, age_seconds: float, prefix: str | None = None):
    """``count`` deliveries of this layout ended ``age_seconds`` ago in ``state``, created then,
    on a destination without per-asset queues (a dead one is history there, not a queue's head)."""
    ids = add_deliveries(conn, "live", count, state=state, prefix=prefix, age_seconds=age_seconds)
    conn.execute(
        "UPDATE webhook_delivery_all SET queued = false WHERE delivery_id = ANY (%s)", (ids,)
    )
    return ids


def _with_history(conn, ids: list[str]) -> None:
    """One dispatch and one ended attempt per delivery of this layout, as a run leaves them."""
    add_dispatches(conn, ids)
    conn.execute(
        "INSERT INTO delivery_attempt_v2 (delivery_id, attempt_no, destination_id, lease_token, "
        "delivery_created_at, started_at, finished_at, outcome) "
        "SELECT delivery_id, 1, destination_id, gen_random_uuid(), created_at, updated_at, "
        "updated_at, 'success' FROM webhook_delivery_all WHERE delivery_id = ANY (%s)",
        (ids,),
    )


def _with_previous_history(conn, ids: list[str]) -> None:
    """The same in the previous layout's tables, as its runs left them."""
    _previous_dispatches(conn, ids)
    conn.execute(
        "INSERT INTO delivery_attempt_v1 (delivery_id, attempt_no, destination_id, lease_token, "
        "finished_at, outcome) SELECT d, 1, 'live', gen_random_uuid(), now(), 'success' "
        "FROM unnest(%s::text[]) AS d",
        (ids,),
    )


def _previous_dispatches(conn, ids: list[str]) -> None:
    """The next dispatch of each delivery of the previous layout, as its claim wrote it."""
    conn.execute(
        """
        WITH counted AS (
            UPDATE webhook_delivery_v1
            SET dispatch_count = dispatch_count + 1,
                current_message_id = delivery_id || ':' || (dispatch_count + 1)
            WHERE delivery_id = ANY (%(ids)s)
            RETURNING delivery_id, destination_id, dispatch_count, current_message_id
        )
        INSERT INTO dispatch_outbox_v2
            (message_id, delivery_id, dispatch_no, destination_id, run_id, published_at)
        SELECT current_message_id, delivery_id, dispatch_count, destination_id, 'run-old', now()
        FROM counted
        """,
        {"ids": ids},
    )


def _count(conn, table: str) -> int:
    return conn.execute(f"SELECT count(*) AS n FROM {table}").fetchone()["n"]


def _live(conn) -> set[str]:
    return {r["delivery_id"] for r in conn.execute("SELECT delivery_id FROM webhook_delivery_all")}


def _before_cutoff(conn):
    """A minute after the end of the range before the first: a day before the next one ends."""
    return conn.execute(
        "SELECT upper_at + interval '1 minute' AS cutoff FROM media_hooks_partition "
        "WHERE child = %s",
        (BEFORE,),
    ).fetchone()["cutoff"]


def _past_before(conn, **policy) -> retention.RetentionPolicy:
    """A retention window past the range before the first, and no other."""
    seconds = conn.execute(
        "SELECT extract(epoch FROM now() - %s)::float8 AS s", (_before_cutoff(conn),)
    ).fetchone()["s"]
    return retention.RetentionPolicy(retain_seconds=seconds, **policy)


def _a_day_old(conn) -> float:
    """How long ago an hour into the range after the first was: created then, a delivery's
    range has ended, within the window of ``_past_before``."""
    return conn.execute(
        "SELECT extract(epoch FROM now() - upper_at - interval '1 hour')::float8 AS s "
        "FROM media_hooks_partition WHERE child = %s",
        (BEFORE,),
    ).fetchone()["s"]


def _attachments(conn) -> dict[str, str]:
    """Each table's partition of the range before the first, and where it is."""
    rows = conn.execute(
        "SELECT p.child FROM media_hooks_partition AS p JOIN media_hooks_partition AS r "
        "ON r.lower_at = p.lower_at AND r.child = %s",
        (BEFORE,),
    ).fetchall()
    return {
        r["child"]: conn.execute(query("partitions_attachment"), {"child": r["child"]}).fetchone()[
            "attachment"
        ]
        for r in rows
    }


def _gone(conn) -> bool:
    """Whether the range before the first is dropped: no partition, no ledger row."""
    tables = conn.execute(
        "SELECT count(*) AS n FROM pg_class WHERE relname LIKE '%\\_before'"
    ).fetchone()["n"]
    ledger = conn.execute(
        "SELECT count(*) AS n FROM media_hooks_partition WHERE child LIKE '%\\_before'"
    ).fetchone()["n"]
    return (tables, ledger) == (0, 0)


@pytest.fixture
def live(conn):
    add_destination(conn, "live", "http://127.0.0.1:9/live")


# This layout: ranges dropped whole -------------------------------------------------------------


def test_retention_drops_a_range_whole_once_nothing_of_it_is_open_or_recent(conn, live):
    old_done = _ended(conn, "succeeded", 5, age_seconds=40 * DAY)
    old_dead = _ended(conn, "dead", 2, age_seconds=40 * DAY)
    recent = _ended(conn, "succeeded", 3, prefix="recent", age_seconds=_a_day_old(conn))
    pending = add_deliveries(conn, "live", 2)
    _with_history(conn, old_done + old_dead + recent)
    identity = "SELECT * FROM delivery_identity WHERE delivery_id = ANY (%s) ORDER BY delivery_id"
    identities = conn.execute(identity, (old_done + old_dead,)).fetchall()
    policy = _past_before(conn, batch_size=3)

    figures = retention.run_retention(conn, policy)

    assert (figures.deliveries, figures.partitions_dropped, figures.partitions_held) == (7, 1, 0)
    assert not figures.truncated
    assert _gone(conn)
    assert _live(conn) == set(recent + pending)  # open work is never dropped (invariant 3)
    assert _count(conn, "dispatch_outbox") == 3
    assert _count(conn, "delivery_attempt_all") == 3
    # Nothing is written per delivery: each identity row, as emit wrote it, is the tombstone.
    assert figures.tombstones_written == 0
    assert conn.execute(identity, (old_done + old_dead,)).fetchall() == identities
    assert retention.is_tombstoned(conn, old_done[0]) and retention.is_tombstoned(conn, old_dead[0])
    assert not retention.is_tombstoned(conn, recent[0])

    again = retention.run_retention(conn, policy)
    assert (again.deliveries, again.partitions_dropped, again.tombstones_expired) == (0, 0, 0)


def test_an_open_delivery_holds_its_range_and_the_run_says_so(conn, live):
    """Invariant 3 over disk: a delivery still open 40 days after it was created (its
    destination disabled for weeks) keeps its range's partitions, the run says which range and
    by what, and the range goes whole once nothing of it is open or recent."""
    done = _ended(conn, "succeeded", 3, age_seconds=40 * DAY)
    (waiting,) = add_deliveries(conn, "live", 1, prefix="waiting", age_seconds=40 * DAY)
    _with_history(conn, done)

    figures = retention.run_retention(conn, _past_before(conn))

    assert (figures.deliveries, figures.partitions_dropped, figures.partitions_held) == (0, 0, 1)
    (held,) = figures.held_ranges
    assert "held by 1 open deliveries, the oldest to destination live" in held
    assert set(_attachments(conn).values()) == {"attached"} and not _gone(conn)
    bodies = conn.execute(
        "SELECT body FROM webhook_delivery_all WHERE delivery_id = ANY (%s)", (done + [waiting],)
    ).fetchall()
    assert len(bodies) == 4 and all(b["body"] is not None for b in bodies)
    assert _count(conn, "dispatch_outbox") == 3

    # It ends now (an operator requeued it, and it succeeded): ended within the window, it
    # keeps its range for the window, as every delivery's history stays readable for it.
    conn.execute(
        "UPDATE webhook_delivery_all SET state = 'succeeded', queued = false, updated_at = now() "
        "WHERE delivery_id = %s",
        (waiting,),
    )
    figures = retention.run_retention(conn, _past_before(conn))
    assert (figures.partitions_dropped, figures.partitions_held) == (0, 1)
    assert "held by a delivery that ended within the retention window" in figures.held_ranges[0]

    _terminal_and_old(conn, waiting)
    figures = retention.run_retention(conn, _past_before(conn))
    assert (figures.deliveries, figures.partitions_dropped, figures.partitions_held) == (4, 1, 0)
    assert _gone(conn) and _count(conn, "dispatch_outbox") == 0


@pytest.mark.parametrize("state", ["pending", "dead"])
def test_a_previous_layout_delivery_that_may_still_move_in_holds_its_range(conn, live, state):
    """A delivery of the previous layout created in a range moves into it under its creation
    time: the sweeps move a pending one, and a dead one (that died within the window, or the
    purge would take it) once a requeue makes it pending. So it holds the range as an open one
    does; dropped, its body would have no partition to go to."""
    _ended(conn, "succeeded", 2, age_seconds=40 * DAY)
    (previous,) = add_deliveries(
        conn, "live", 1, state=state, age_seconds=40 * DAY, previous_release=True
    )
    conn.execute(
        "UPDATE webhook_delivery_v1 SET updated_at = now() - interval '1 hour' "
        "WHERE delivery_id = %s",
        (previous,),
    )

    figures = retention.run_retention(conn, _past_before(conn))

    assert (figures.partitions_dropped, figures.partitions_held) == (0, 1)
    assert "held by 1 open deliveries" in figures.held_ranges[0]
    if state == "dead":
        assert _requeue(conn) == 1
    assert sweeps.convert_previous_pending(conn) == 1
    moved = conn.execute(
        "SELECT s.state, b.body FROM delivery_state AS s JOIN delivery_body AS b "
        "USING (delivery_id, created_at) WHERE s.delivery_id = %s",
        (previous,),
    ).fetchone()
    assert moved["state"] == "pending" and moved["body"] is not None


def test_each_run_makes_the_partitions_ahead(conn):
    """Emits need their creation time's partition: a run makes them a week ahead again, as if
    the last were made long ago, each range starting where the last ended, all four tables
    alike, each partition attached to its table."""
    for row in conn.execute(
        "SELECT child FROM media_hooks_partition WHERE lower_at > now()"
    ).fetchall():
        conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(row["child"])))
    conn.execute("DELETE FROM media_hooks_partition WHERE lower_at > now()")
    assert partitions.ahead_seconds(conn) < DAY

    retention.run_retention(conn, retention.RetentionPolicy())

    assert partitions.ahead_seconds(conn) >= partitions.AHEAD_SECONDS - 60
    gaps = conn.execute(
        """
        SELECT count(*) AS n FROM (
            SELECT lower_at, lag(upper_at) OVER (PARTITION BY parent ORDER BY lower_at) AS last
            FROM media_hooks_partition
        ) AS r
        WHERE r.last IS DISTINCT FROM r.lower_at AND r.last IS NOT NULL
        """
    ).fetchone()["n"]
    assert gaps == 0
    uneven = conn.execute(
        "SELECT count(*) AS n FROM (SELECT lower_at FROM media_hooks_partition "
        "GROUP BY lower_at, upper_at HAVING count(*) <> 4) AS r"
    ).fetchone()["n"]
    assert uneven == 0
    unattached = conn.execute(
        "SELECT count(*) AS n FROM media_hooks_partition AS p LEFT JOIN pg_inherits AS i "
        "ON i.inhrelid = to_regclass(p.child) AND i.inhparent = to_regclass(p.parent) "
        "WHERE i.inhrelid IS NULL"
    ).fetchone()["n"]
    assert unattached == 0


def test_a_detach_cut_short_by_a_long_transaction_is_finished_by_the_next_run(
    conn, database_url, live
):
    """A detach waits for the transactions that read the table; one that outlasts its lock
    timeout leaves the partition half detached, which only FINALIZE completes. The run gives
    up, naming what it waited for, and the next run carries on from there."""
    _ended(conn, "succeeded", 2, age_seconds=40 * DAY)
    policy = _past_before(conn)
    conn.execute("SET lock_timeout = '100ms'")
    with snapshot_held(database_url), pytest.raises(db.DatabaseBusy, match=f"detach {BEFORE}"):
        retention.run_retention(conn, policy)
    assert _attachments(conn)[BEFORE] == "pending"

    figures = retention.run_retention(conn, policy)
    assert (figures.deliveries, figures.partitions_dropped) == (2, 1)
    assert _gone(conn)


def test_identities_expire_after_the_duplicate_window_once_their_delivery_is_gone(conn, live):
    """An id is forgotten once the duplicate window has passed its creation and no table holds
    its delivery; one whose delivery is kept (its range held by an open one) stays, without
    holding up the ids after it."""
    kept = _ended(conn, "dead", 1, prefix="kept", age_seconds=600 * DAY)
    holding = add_deliveries(conn, "live", 1, prefix="holding", age_seconds=600 * DAY)
    # Ids whose ranges were dropped: their identity rows, as emit wrote them.
    conn.execute(
        "INSERT INTO delivery_identity (delivery_id, destination_id, created_at) "
        "VALUES ('ancient', 'live', now() - interval '500 days'), "
        "('remembered', 'live', now() - interval '100 days')"
    )

    figures = retention.run_retention(conn, retention.RetentionPolicy(batch_size=1))

    assert figures.tombstones_expired == 1
    assert not retention.is_tombstoned(conn, "ancient")
    assert retention.is_tombstoned(conn, "remembered")
    left = conn.execute("SELECT delivery_id FROM delivery_identity ORDER BY delivery_id").fetchall()
    assert [r["delivery_id"] for r in left] == sorted([*holding, *kept, "remembered"])


# The previous layout: purged row by row -------------------------------------------------------


def test_retention_purges_the_previous_layouts_terminal_rows_and_keeps_tombstones(conn, live):
    old = {"age_seconds": 40 * DAY, "previous_release": True}
    old_done = add_deliveries(conn, "live", 5, state="succeeded", **old)
    old_dead = add_deliveries(conn, "live", 2, state="dead", **old)
    recent = add_deliveries(
        conn, "live", 3, state="succeeded", prefix="recent", age_seconds=DAY, previous_release=True
    )
    old_pending = add_deliveries(conn, "live", 2, **old)
    _with_previous_history(conn, old_done + old_dead + recent)

    figures = retention.run_retention(conn, retention.RetentionPolicy(batch_size=3))

    assert figures.deliveries == 7
    assert figures.outbox_rows == 7
    assert figures.attempts == 7
    assert figures.tombstones_written == 7
    assert figures.batches == 3  # 3 + 3 + 1, bounded
    assert not figures.truncated
    assert _live(conn) == set(recent + old_pending)  # pending work is never purged (invariant 3)
    assert _count(conn, "dispatch_outbox") == 3
    assert _count(conn, "delivery_attempt_all") == 3
    tombs = conn.execute(
        "SELECT delivery_id, final_state FROM delivery_tombstone ORDER BY delivery_id"
    ).fetchall()
    assert {t["delivery_id"] for t in tombs} == set(old_done + old_dead)
    assert {t["final_state"] for t in tombs} == {"succeeded", "dead"}
    assert retention.is_tombstoned(conn, old_done[0])
    assert not retention.is_tombstoned(conn, recent[0])

    again = retention.run_retention(conn, retention.RetentionPolicy(batch_size=3))
    assert again.deliveries == 0 and again.tombstones_expired == 0


def test_max_batches_bounds_one_pass(conn, live):
    add_deliveries(conn, "live", 5, state="succeeded", age_seconds=40 * DAY, previous_release=True)
    figures = retention.run_retention(conn, retention.RetentionPolicy(batch_size=2, max_batches=2))
    assert (figures.deliveries, figures.batches, figures.truncated) == (4, 2, True)
    assert _count(conn, "webhook_delivery_v1") == 1


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


# Either layout ---------------------------------------------------------------------------------

LAYOUTS = ["range dropped", "previous layout purged"]


def _old_terminal(conn, layout: str, state: str = "succeeded") -> str:
    """One delivery ended 40 days ago, created then, in ``layout``."""
    if layout == "range dropped":
        (made,) = _ended(conn, state, 1, age_seconds=40 * DAY)
    else:
        (made,) = add_deliveries(
            conn, "live", 1, state=state, age_seconds=40 * DAY, previous_release=True
        )
    return made


def _policy(conn, layout: str) -> retention.RetentionPolicy:
    return _past_before(conn) if layout == "range dropped" else retention.RetentionPolicy()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_purged_delivery_re_emitted_is_recognised_by_its_tombstone(conn, live, layout):
    """Invariant 1 beyond retention: re-emitting an old event creates no second delivery."""
    purged = _old_terminal(conn, layout)
    assert retention.run_retention(conn, _policy(conn, layout)).deliveries == 1
    assert _live(conn) == set()

    again = Event("live", "asset-1", "transcode.completed", {"n": 1}, delivery_id=purged)
    assert emit(conn, again).inserted is False
    fresh = Event("live", "asset-2", "transcode.completed", {"n": 2}, delivery_id="fresh-1")
    counts = emit_many(conn, [again, fresh])
    assert (counts.inserted, counts.already_present) == (1, 1)
    assert _live(conn) == {"fresh-1"}


# Interleavings: two sessions, explicit transactions, one side paused at its statement ----------


def _terminal_and_old(conn, delivery_id: str, state: str = "succeeded") -> None:
    """The delivery ended 40 days ago (its history row says so), wherever it is."""
    conn.execute(
        "UPDATE webhook_delivery_all SET state = %s, queued = false, "
        "updated_at = now() - interval '40 days' WHERE delivery_id = %s",
        (state, delivery_id),
    )


def _emit_one(conn, event: Event) -> int:
    return int(emit(conn, event).inserted)


def _emit_bulk(conn, event: Event) -> int:
    return emit_many(conn, [event]).inserted


def _event(delivery_id: str) -> Event:
    return Event("live", "asset-1", "transcode.completed", {"n": 1}, delivery_id=delivery_id)


def _drop_paused(conn, session) -> int:
    """The drop of the range before the first, up to its transaction's last statement, in
    ``session`` (left open): its partitions detached first, as a run detaches them."""
    (found,) = partitions.expired(conn, _before_cutoff(conn))
    assert partitions.detach_range(conn, found) is None
    return partitions.drop_range(session, found)


@pytest.mark.parametrize(
    "layout", [*LAYOUTS, "previous layout, a row without identity (before 0005)"]
)
@pytest.mark.parametrize("emit_path", [_emit_one, _emit_bulk], ids=["emit", "emit_many"])
def test_an_emit_racing_the_purge_of_its_id_records_nothing(
    conn, database_url, live, emit_path, layout
):
    """Hole 2, invariant 8: the purge (T1) forgets the delivery and keeps its id; an emit of the
    same id (T2) that starts before T1 commits must not record a second, live delivery, then or
    once T1 commits. T1 is this layout's drop of the delivery's range, or the previous layout's
    purge of its row, which still writes the identity of a row that has none (code older than
    0005 left such rows; 0034 writes theirs: test_a_row_recorded_without_identity_...)."""
    delivery_id = _old_terminal(conn, layout)
    if "without identity" in layout:
        conn.execute("DELETE FROM delivery_identity WHERE delivery_id = %s", (delivery_id,))
    event = _event(delivery_id)

    with (
        open_session(database_url) as purger,
        open_session(database_url, autocommit=True) as producer,
    ):
        if layout == "range dropped":
            assert _drop_paused(conn, purger) == 1  # T1 dropped it, its transaction open
        else:
            assert _purge(conn, purger)["deliveries"] == 1  # T1 purged it, its transaction open
        with in_background(lambda: emit_path(producer, event)) as emitted:
            wait_until_blocked(conn, producer.info.backend_pid, emitted)
            purger.commit()
        assert emitted.result() == 0

    assert _live(conn) == set()
    assert retention.is_tombstoned(conn, delivery_id)
    assert emit_path(conn, event) == 0


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("emit_path", [_emit_one, _emit_bulk], ids=["emit", "emit_many"])
def test_a_purge_racing_an_uncommitted_emit_of_its_id_keeps_one_identity(
    conn, database_url, live, emit_path, layout
):
    """The other order: T2's emit of the id is open when T1 purges. This layout's drop waits
    for it (the emit holds the body's table, whose partition the drop detaches); the previous
    layout's purge need not. Whichever commits first, the id ends as exactly one thing, a
    tombstone, and no live row."""
    delivery_id = _old_terminal(conn, layout)
    event = _event(delivery_id)

    with (
        open_session(database_url) as producer,
        open_session(database_url, autocommit=layout == "range dropped") as purger,
    ):
        assert emit_path(producer, event) == 0  # the identity is there: nothing recorded
        if layout == "range dropped":
            policy = _past_before(conn)
            with in_background(lambda: retention.run_retention(purger, policy)) as purged:
                wait_until_blocked(conn, purger.info.backend_pid)
                producer.commit()
            assert (purged.result().deliveries, purged.result().partitions_dropped) == (1, 1)
        else:
            with in_background(lambda: _purge(conn, purger)) as purged:
                wait_until_blocked(conn, purger.info.backend_pid, purged)
                producer.commit()
            assert purged.result()["deliveries"] == 1
            purger.commit()

    assert _live(conn) == set()
    assert retention.is_tombstoned(conn, delivery_id)
    assert emit_path(conn, event) == 0


@pytest.mark.parametrize("emit_path", [_emit_one, _emit_bulk], ids=["emit", "emit_many"])
def test_a_row_recorded_without_identity_is_refused_once_migrated(empty_database_url, emit_path):
    """A row of the previous layout that code older than migration 0005 recorded has no
    identity row, and this release's emits refuse a repeated id by that row alone: migration
    0034 writes it, so the id is refused, and its purge later keeps it as a tombstone."""
    latest = sqlfiles.load_migrations()[-1].version
    before = next(m.version for m in sqlfiles.load_migrations() if m.name.startswith("0034_"))
    with psycopg.connect(empty_database_url, autocommit=True, row_factory=dict_row) as conn:
        migrations.migrate(conn, up_to=before - 1)
        add_destination(conn, "live", "http://127.0.0.1:9/live")
        (legacy,) = add_deliveries(conn, "live", 1, state="succeeded", age_seconds=40 * DAY)
        conn.execute("DELETE FROM delivery_identity WHERE delivery_id = %s", (legacy,))
        migrations.migrate(conn, up_to=latest)

        assert emit_path(conn, _event(legacy)) == 0
        assert _live(conn) == {legacy}
        assert _purge(conn)["deliveries"] == 1
        assert retention.is_tombstoned(conn, legacy)
        assert emit_path(conn, _event(legacy)) == 0


def _requeue(conn) -> int:
    return requeue(conn, Cohort(("live",)), reason="publisher fixed", requested_by="ops").moved


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_requeue_waiting_on_the_purge_of_its_delivery_moves_nothing(
    conn, database_url, live, layout
):
    """The purge (T1) takes a dead delivery with its dispatches; a requeue of it (T2) while T1
    is under way finds nothing to move once T1 is past it, so no claim can add a dispatch to it.
    This layout: T1's detach of the range's history waits for a report's transaction; the
    requeue, meanwhile, no longer reads that partition. The previous layout: the requeue waits
    on T1's row lock and, once T1 commits, finds the row gone (its dispatches were found by
    their message ids: migration 0032, no foreign key holds them to it)."""
    dead = _old_terminal(conn, layout, "dead")
    if layout == "range dropped":
        add_dispatches(conn, [dead])
        add_dispatches(conn, [dead])
        policy = _past_before(conn)
        with (
            open_session(database_url) as reader,
            open_session(database_url, autocommit=True) as purger,
            open_session(database_url, autocommit=True) as operator,
        ):
            reader.execute("SELECT count(*) FROM delivery_history")  # a report, still open
            with in_background(lambda: retention.run_retention(purger, policy)) as purged:
                wait_until_blocked(conn, purger.info.backend_pid)
                assert _requeue(operator) == 0
                reader.rollback()
            figures = purged.result()
        assert (figures.deliveries, figures.partitions_dropped) == (1, 1)
    else:
        _previous_dispatches(conn, [dead])
        _previous_dispatches(conn, [dead])
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
    assert _live(conn) == set()
    assert _count(conn, "dispatch_outbox") == 0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_purge_passes_a_delivery_being_requeued_and_later_takes_every_dispatch(
    conn, database_url, live, layout
):
    """The other order: the requeue (T2) holds the dead delivery, uncommitted. This layout: the
    drop (T1) waits for it at the detach of the range's history, then finds it open and puts
    the range back, body and dispatches with it. The previous layout: the purge passes it by
    (SKIP LOCKED) without waiting, and the sweeps then move it into this layout. Claimed again
    and dead again, the delivery has two dispatches, and its range takes both with it."""
    dead = _old_terminal(conn, layout, "dead")
    with open_session(database_url) as operator:
        if layout == "range dropped":
            add_dispatches(conn, [dead])
            operator.execute("SELECT 1")  # its transaction open: the requeue is a savepoint in it
            assert _requeue(operator) == 1
            policy = _past_before(conn)
            with (
                open_session(database_url) as reader,
                open_session(database_url, autocommit=True) as purger,
            ):
                reader.execute("SELECT count(*) FROM delivery_history")  # a report, still open
                with in_background(lambda: retention.run_retention(purger, policy)) as purged:
                    wait_until_blocked(conn, purger.info.backend_pid)
                    operator.commit()
                    # Requeued while the drop still waits at the history: nothing of the range
                    # is detached yet, so the delivery has its body.
                    assert delivery(conn, dead)["body"] is not None
                    assert not purged.done()
                    reader.rollback()
            figures = purged.result()
            assert (figures.partitions_dropped, figures.partitions_put_back) == (0, 1)
            assert "held by 1 open deliveries" in figures.held_ranges[0]
            assert set(_attachments(conn).values()) == {"attached"}
        else:
            _with_previous_history(conn, [dead])
            operator.execute("SELECT 1")
            assert _requeue(operator) == 1
            assert _purge(conn)["deliveries"] == 0
            operator.commit()
            assert sweeps.convert_previous_pending(conn) == 1
    assert delivery(conn, dead)["body"] is not None
    claim_all(conn, "run-again", Cohort(("live",)))
    assert delivery(conn, dead)["current_message_id"] == f"{dead}:2"
    _terminal_and_old(conn, dead, "dead")
    figures = retention.run_retention(conn, _past_before(conn))
    assert (figures.deliveries, figures.partitions_dropped) == (1, 1)
    assert _count(conn, "dispatch_outbox") == 0


def _purge(conn, session=None) -> dict:
    """One purge batch of the previous layout, in ``session`` when given (left open unless it
    is in autocommit)."""
    return (
        (session or conn)
        .execute(query("purge_terminal_batch"), {"cutoff": _cutoff(conn), "batch_size": 10})
        .fetchone()
    )


def _cutoff(conn):
    return conn.execute("SELECT now() - interval '30 days' AS cutoff").fetchone()["cutoff"]
