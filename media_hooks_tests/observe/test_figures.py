"""The operator's figures (media_hooks.observe.figures) against a prepared database, and their plans."""

from __future__ import annotations

import contextlib
import json

import pytest

from media_hooks.observe import figures
from media_hooks.outbox.cohort import Cohort
from media_hooks.outbox.maintenance import sweeps
from media_hooks.store import db, sessions, sqlfiles
from media_hooks.store.sqlfiles import query
from media_hooks_tests.conftest import REPO
from media_hooks_tests.factories import (
    add_attempts,
    add_deliveries,
    add_destination,
    claim_all,
    claim_messages,
)
from media_hooks_tests.interleaving import open_session, snapshot_held, wait_for
from media_hooks_tests.plans import analyzed, rows_read, seq_scans


def _prepare(conn) -> None:
    add_destination(conn, "live", "http://127.0.0.1:9/live")
    add_destination(conn, "paused", "http://127.0.0.1:9/paused")
    add_destination(conn, "off", "http://127.0.0.1:9/off")
    conn.execute(
        "UPDATE webhook_destination SET paused_until = now() + interval '1 hour', "
        "paused_reason = 'Retry-After 3600' WHERE destination_id = 'paused'"
    )
    conn.execute(
        "UPDATE webhook_destination SET enabled = false, disabled_reason = '410 Gone', "
        "disabled_at = now() WHERE destination_id = 'off'"
    )
    add_deliveries(conn, "live", 3, due_seconds_ago=120)
    add_deliveries(conn, "live", 1, prefix="future", due_seconds_ago=-600)
    add_deliveries(conn, "paused", 2, due_seconds_ago=600)
    add_deliveries(conn, "off", 1, due_seconds_ago=900)
    expired = add_deliveries(conn, "live", 2, state="leased")
    conn.execute(
        "UPDATE webhook_delivery_all SET lease_until = now() - interval '5 seconds' "
        "WHERE delivery_id = ANY(%s)",
        (expired,),
    )
    add_deliveries(conn, "live", 1, state="leased", prefix="held")
    enqueued = add_deliveries(conn, "live", 1, state="enqueued")
    conn.execute(
        "INSERT INTO dispatch_outbox_v3 (message_id, delivery_id, dispatch_no, destination_id, "
        "run_id, delivery_created_at, created_at) SELECT %s || ':1', %s, 1, 'live', 'run-1', "
        "created_at, now() - interval '30 seconds' FROM delivery_state WHERE delivery_id = %s",
        (enqueued[0], enqueued[0], enqueued[0]),
    )
    conn.execute(
        "UPDATE webhook_delivery_all SET current_message_id = delivery_id || ':1', "
        "updated_at = now() - interval '30 seconds' WHERE delivery_id = %s",
        (enqueued[0],),
    )
    add_deliveries(conn, "live", 2, state="dead")
    done = add_deliveries(conn, "live", 5, state="succeeded")
    # A dispatch of a run that died, never published: its delivery succeeded through a later one.
    conn.execute(
        "INSERT INTO dispatch_outbox_v3 (message_id, delivery_id, dispatch_no, destination_id, "
        "run_id, delivery_created_at, created_at) SELECT %s || ':1', %s, 1, 'live', 'run-0', "
        "created_at, now() - interval '1 hour' FROM delivery_history WHERE delivery_id = %s",
        (done[1], done[1], done[1]),
    )
    # Its attempts, by the minutes since each: three within the hour, one more within the day.
    minutes_ago = [
        (10, "success"), (20, "success"), (30, "retryable"), (180, "rate_limited"),
        (2 * 24 * 60, "success"),
    ]  # fmt: skip
    add_attempts(conn, done[0], [(m * 60, m * 60, outcome) for m, outcome in minutes_ago])


def test_figures_match_the_prepared_rows(conn):
    _prepare(conn)
    f = figures.measure(conn)

    assert f.counts == {
        "live": {"pending": 4, "leased": 3, "enqueued": 1, "dead": 2, "succeeded": 5},
        "paused": {"pending": 2},
        "off": {"pending": 1},
    }
    assert f.totals == {
        "pending": 7, "enqueued": 1, "leased": 3, "succeeded": 5, "dead": 2,
        "superseded": 0, "discarded": 0,
    }  # fmt: skip
    # The paused and disabled destinations' older rows are due but not sendable.
    assert f.oldest_due_age_seconds == pytest.approx(120, abs=5)
    assert f.oldest_due_any_age_seconds == pytest.approx(900, abs=5)
    assert f.relay_lag_seconds == pytest.approx(30, abs=5)
    assert f.expired_leases == 2
    assert f.dead_letters == 2
    assert f.newest_dead_at is not None
    assert [p.destination_id for p in f.paused] == ["paused"]
    assert f.paused[0].paused_reason == "Retry-After 3600"
    assert [d.destination_id for d in f.disabled] == ["off"]
    assert f.disabled[0].disabled_reason == "410 Gone"
    assert f.attempts_last_hour == {"success": 2, "retryable": 1}
    assert f.attempts_last_day == {"success": 2, "retryable": 1, "rate_limited": 1}
    assert f.due_work
    assert "oldest due 12" in f.headline()
    json.dumps(f.as_dict())  # JSON-ready


def test_relay_lag_counts_only_messages_still_waited_for(conn):
    """Issue 10: a killed run's messages were never published; its deliveries went back to
    pending and out through later dispatches. Their old messages are not lag. (This release's
    claim publishes what it writes; a release before it claimed, then published: the killed
    run here is one of those, its relay never having run.)"""
    add_destination(conn, "live", "http://127.0.0.1:9/live")
    ids = add_deliveries(conn, "live", 3)
    claim_all(conn, "killed", Cohort())
    conn.execute(
        "UPDATE dispatch_outbox_v3 SET created_at = now() - interval '40 minutes',"
        " published_at = NULL WHERE run_id = 'killed'"
    )
    assert figures.measure(conn).relay_lag_seconds == pytest.approx(2400, abs=5)
    assert sweeps.release_run(conn, "killed") == 3
    assert figures.measure(conn).relay_lag_seconds is None  # due again: the oldest due figure
    claim_messages(conn, "next")
    conn.execute(
        "UPDATE webhook_delivery_all SET state = 'succeeded' WHERE delivery_id = ANY(%s)", (ids,)
    )
    assert figures.measure(conn).relay_lag_seconds is None

    add_deliveries(conn, "live", 1, prefix="fresh")
    claim_all(conn, "live-run", Cohort())
    assert figures.measure(conn).relay_lag_seconds is None  # published by its claim


def test_an_explicit_instant_moves_every_age(conn):
    _prepare(conn)
    now = conn.execute("SELECT now() + interval '1 hour' AS t").fetchone()["t"]
    f = figures.measure(conn, now=now)
    # An hour on: the future row is due, the pause is over.
    assert f.oldest_due_any_age_seconds == pytest.approx(3600 + 900, abs=5)
    assert f.oldest_due_age_seconds == pytest.approx(3600 + 600, abs=5)
    assert f.paused == ()
    assert f.attempts_last_hour == {}


def test_empty_database_has_no_ages(conn):
    f = figures.measure(conn)
    assert not f.due_work
    assert f.relay_lag_seconds is None
    assert f.totals == dict.fromkeys(figures.COUNTED, 0)
    assert "oldest due none" in f.headline()


@pytest.mark.parametrize("write", [False, True], ids=["a snapshot", "a transaction id"])
def test_the_oldest_snapshot_names_the_session_that_holds_vacuum_back(conn, database_url, write):
    assert figures.measure(conn).oldest_snapshot is None
    with snapshot_held(database_url, write=write) as pid:
        two_hours_on = conn.execute("SELECT now() + interval '2 hours' AS t").fetchone()["t"]
        f = figures.measure(conn, now=two_hours_on)
        holder = f.oldest_snapshot
        assert (holder.pid, holder.application_name, holder.state) == (
            pid,
            "nightly-report",
            "idle in transaction",
        )
        assert f.oldest_snapshot_age_seconds == pytest.approx(7200, abs=60)
        assert holder.describe().startswith("a transaction open for 2h 0m (pid ")
        assert json.loads(json.dumps(f.as_dict()))["oldest_snapshot"]["pid"] == pid
    # Ended: nothing holds vacuum back (the measuring session's own snapshot does not count).
    assert figures.measure(conn).oldest_snapshot is None


def test_the_connected_releases_are_told_apart_by_their_sessions_names(
    conn, database_url, empty_database_url, settings
):
    """A rolling upgrade's reading: this release's sessions, an earlier release's (which named
    no generation) and a later one's, by role; a session of another program, one of another
    database and the measuring one are not counted."""
    ours = sqlfiles.generation()
    assert figures.measure(conn).sessions == ()
    with contextlib.ExitStack() as stack:
        for role in (db.Role.WORKER, db.Role.WORKER, db.Role.SWEEPS):
            stack.enter_context(db.connect(database_url, role=role, settings=settings))
        for url, name in [
            (database_url, "media_hooks:worker"),
            (database_url, f"media_hooks:reconciler:g{ours + 1}"),
            (database_url, "nightly-report"),
            (database_url, "media_hooks:worker:nonsense"),
            (empty_database_url, f"media_hooks:worker:g{ours}"),
        ]:
            stack.enter_context(open_session(url, autocommit=True, application_name=name))
        measured = figures.measure(conn)
        assert measured.sessions == (
            figures.ReleaseSessions(ours, "this", {"sweeps": 1, "worker": 2}),
            figures.ReleaseSessions(None, "earlier", {"worker": 1}),
            figures.ReleaseSessions(ours + 1, "later", {"reconciler": 1}),
        )
        assert [r.describe() for r in measured.sessions] == [
            f"this release (g{ours}): sweeps 1, worker 2",
            "an earlier release (generation unnamed): worker 1",
            f"a later release (g{ours + 1}): reconciler 1",
        ]
        assert json.loads(json.dumps(measured.as_dict()))["sessions"][1] == {
            "generation": None,
            "release": "earlier",
            "roles": {"worker": 1},
        }
    # Disconnected: gone from the reading (the server ends a backend just after its client).
    wait_for(lambda: figures.connected_sessions(conn) == (), "the sessions to end")


def test_a_session_name_carries_the_newest_migration_and_reads_back():
    newest = max(int(path.name[:4]) for path in (REPO / "sql" / "migrations").glob("[0-9]*.sql"))
    assert sqlfiles.generation() == newest
    for role in db.Role:
        name = sessions.session_name(role.value)
        assert name == f"media_hooks:{role.value}:g{newest}" and len(name) <= 63
        assert sessions.parse_session_name(name) == sessions.SessionName(role.value, newest)
    assert sessions.parse_session_name("media_hooks:worker") == sessions.SessionName("worker", None)
    for foreign in ("nightly-report", "media_hooks:", "media_hooks::g3", "media_hooks:worker:3"):
        assert sessions.parse_session_name(foreign) is None


@pytest.mark.parametrize(
    "name",
    [
        "figures_scalars",
        "figures_attempts_by_outcome",
        "figures_open_counts_by_state",
        "figures_succeeded_counts",
    ],
)
def test_each_figure_is_an_index_scan(conn, name):
    """Both layouts hold deliveries, as while the previous release runs beside this one
    (migration 0034): each figure reads the history and the open deliveries' state rows by
    index. The timers, one narrow row per open delivery, hold no history: counting the backlog
    by them may read them whole, as the previous layout's figures read each open state's
    partial index whole. The backlog is large enough for the plans to be the ones a real one
    gets (a table of a few pages is read whole by any plan)."""
    add_destination(conn, "live", "http://127.0.0.1:9/live")
    for previous in (False, True):
        prefix = "previous-" if previous else ""
        ids = add_deliveries(
            conn, "live", 4000, state="succeeded", prefix=f"{prefix}succeeded",
            previous_release=previous,
        )  # fmt: skip
        for state, n in [("pending", 3000), ("dead", 50), ("leased", 20)]:
            add_deliveries(
                conn, "live", n, state=state, prefix=f"{prefix}{state}", previous_release=previous
            )
        _add_history(conn, ids, previous=previous)
    conn.execute("VACUUM ANALYZE")
    (plan,) = conn.execute(
        ("EXPLAIN (FORMAT JSON) " + query(name)).encode(), {"now": None}
    ).fetchone()["QUERY PLAN"]
    tables = {
        "delivery_state", "delivery_history", "delivery_body", "dispatch_outbox_v3",
        "delivery_attempt_v2", "webhook_delivery_v1", "dispatch_outbox_v1", "dispatch_outbox_v2",
        "delivery_attempt_v1",
    }  # fmt: skip
    assert seq_scans(conn, plan["Plan"], tables) == [], json.dumps(plan, indent=1)
    assert "Index" in json.dumps(plan), json.dumps(plan, indent=1)


def _add_history(conn, ids: list[str], *, previous: bool) -> None:
    """A successful attempt a minute apart for each of ``ids`` (succeeded deliveries), its
    dispatch, and a dispatch of a killed run, never published, that went out later: in the
    previous layout's tables or in this one's (under the delivery's creation time)."""
    if previous:
        conn.execute(
            "INSERT INTO delivery_attempt_v1 (delivery_id, attempt_no, destination_id, "
            "lease_token, started_at, finished_at, outcome) SELECT d, 1, 'live', "
            "gen_random_uuid(), now() - (i * interval '1 minute'), "
            "now() - (i * interval '1 minute'), 'success' "
            "FROM unnest(%s::text[]) WITH ORDINALITY AS u(d, i)",
            (ids,),
        )
        conn.execute(
            "INSERT INTO dispatch_outbox_v2 (message_id, delivery_id, dispatch_no, "
            "destination_id, run_id, published_at) "
            "SELECT d || ':' || n, d, n, 'live', CASE n WHEN 1 THEN 'killed' ELSE 'r' END, "
            "CASE n WHEN 2 THEN now() END FROM unnest(%s::text[]) AS d, generate_series(1, 2) AS n",
            (ids,),
        )
        return
    conn.execute(
        "INSERT INTO delivery_attempt_v2 (delivery_id, attempt_no, destination_id, lease_token, "
        "delivery_created_at, started_at, finished_at, outcome) SELECT d, 1, 'live', "
        "gen_random_uuid(), h.created_at, now() - (i * interval '1 minute'), "
        "now() - (i * interval '1 minute'), 'success' "
        "FROM unnest(%s::text[]) WITH ORDINALITY AS u(d, i) "
        "JOIN delivery_history AS h ON h.delivery_id = u.d",
        (ids,),
    )
    conn.execute(
        "INSERT INTO dispatch_outbox_v3 (message_id, delivery_id, dispatch_no, destination_id, "
        "run_id, delivery_created_at, published_at) "
        "SELECT h.delivery_id || ':' || n, h.delivery_id, n, 'live', "
        "CASE n WHEN 1 THEN 'killed' ELSE 'r' END, h.created_at, CASE n WHEN 2 THEN now() END "
        "FROM delivery_history AS h, generate_series(1, 2) AS n WHERE h.delivery_id = ANY (%s)",
        (ids,),
    )


def test_without_the_history_a_measurement_reads_the_open_and_dead_deliveries_only(conn):
    """What every delivery run and sensor tick measure: the same counts but succeeded ones,
    no attempts by outcome, and a read bounded by the backlog and the dead letters, not by
    the weeks of succeeded history beside them (20,000 rows here)."""
    _prepare(conn)
    add_deliveries(conn, "live", 20_000, state="succeeded", prefix="history")
    conn.execute("VACUUM ANALYZE delivery_history, delivery_state, delivery_timer")

    now = conn.execute("SELECT now() AS now").fetchone()["now"]
    whole, lean = figures.measure(conn, now=now), figures.measure(conn, now=now, history=False)
    assert lean.counts == {
        destination: {state: n for state, n in by_state.items() if state != "succeeded"}
        for destination, by_state in whole.counts.items()
    }
    assert whole.totals["succeeded"] == 20_005 and lean.totals["succeeded"] == 0
    assert (lean.attempts_last_hour, lean.attempts_last_day, lean.history) == ({}, {}, False)
    assert lean.headline() == whole.headline()
    with pytest.raises(ValueError, match="by destination"):
        figures.measure(conn, history=False, by="event-type")

    plan = analyzed(conn, figures.OPEN_COUNTS)
    layouts = ("delivery_history", "delivery_state", "delivery_timer", "webhook_delivery_v1")
    assert sum(rows_read(plan, table) for table in layouts) < 100, plan
