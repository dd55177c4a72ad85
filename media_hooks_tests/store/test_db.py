"""Connections by role (media_hooks.store.db): bounded timeouts, and a lock held elsewhere.

Hole 7: every connection the project opens has a statement_timeout, lock_timeout and
idle_in_transaction_session_timeout for its role, and a statement that times out is an
ordinary event: retried with backoff, logged, and nothing is lost.
"""

from __future__ import annotations

import dataclasses
import logging
import threading

import pytest
from psycopg import sql

from media_hooks.devtools.receiver import Receiver, Reply
from media_hooks.engine.delivery_run import deliver_due
from media_hooks.outbox import rate_limits
from media_hooks.outbox.cohort import Cohort
from media_hooks.outbox.maintenance import sweeps
from media_hooks.outbox.maintenance.requeue import requeue
from media_hooks.store import db, sqlfiles
from media_hooks_tests.factories import add_deliveries, add_destination, delivery, states
from media_hooks_tests.interleaving import in_background, open_session, wait_for

SETTINGS = ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")


def _shown(conn) -> dict[str, str]:
    return {name: conn.execute(f"SHOW {name}").fetchone()[name] for name in SETTINGS}


def _expected(bounds: db.Bounds) -> dict[str, str]:
    def ms(seconds: float) -> str:
        return "0" if seconds == 0 else f"{round(seconds * 1000)}ms"

    return {
        "statement_timeout": ms(bounds.statement_seconds),
        "lock_timeout": ms(bounds.lock_seconds),
        "idle_in_transaction_session_timeout": ms(bounds.idle_in_transaction_seconds),
    }


def _normalized(shown: dict[str, str]) -> dict[str, str]:
    """PostgreSQL shows 5000ms as 5s and 60000ms as 1min; compare in milliseconds."""
    units = {"ms": 1, "s": 1000, "min": 60000, "h": 3600000}
    out = {}
    for name, value in shown.items():
        for unit, factor in sorted(units.items(), key=lambda u: -len(u[0])):
            if value.endswith(unit) and value[: -len(unit)].isdigit():
                value = f"{int(value[: -len(unit)]) * factor}ms"
                break
        out[name] = value
    return out


@pytest.mark.parametrize("role", list(db.Role))
def test_every_role_connects_with_its_bounds(database_url, settings, role):
    bounds = db.bounds(role, settings)
    if role is not db.Role.MIGRATION:
        assert 0 < bounds.statement_seconds <= 3600
    assert 0 < bounds.lock_seconds <= 60 and 0 < bounds.idle_in_transaction_seconds <= 3600
    with db.connect(database_url, role=role, settings=settings) as conn:
        assert _normalized(_shown(conn)) == _expected(bounds)
        name = conn.execute("SHOW application_name").fetchone()["application_name"]
        assert name == f"media_hooks:{role.value}:g{sqlfiles.generation()}"


def test_a_pooled_connection_takes_the_role_of_whoever_borrows_it(database_url, settings):
    with db.open_pool(database_url, max_size=1, settings=settings) as pool:
        for role in (db.Role.WORKER, db.Role.SWEEPS, db.Role.WORKER):
            with db.borrow(pool, role, settings) as conn:
                assert conn.autocommit
                assert _normalized(_shown(conn)) == _expected(db.bounds(role, settings))


def _short(settings):
    return dataclasses.replace(settings, lock_timeout_seconds=0.2)


def test_a_worker_whose_outcome_meets_a_row_lock_retries_and_records_it(
    conn, pool, settings, database_url, caplog
):
    """An operator's open transaction holds the delivery's row while the worker records its
    outcome: the worker's statement gives up at the lock timeout, is retried with backoff and
    logged, and records the outcome once the operator's transaction ends. Nothing is lost."""
    arrived, locked = threading.Event(), threading.Event()

    def script(info):
        arrived.set()
        locked.wait(30)
        return Reply()

    caplog.set_level(logging.WARNING, logger="media_hooks")
    with Receiver(script=script) as receiver, open_session(database_url) as operator:
        add_destination(conn, "cdn", url=receiver.url, timeout_seconds=30)
        add_deliveries(conn, "cdn", 1)
        with in_background(lambda: deliver_due(pool, "run-1", _short(settings))) as run:
            try:
                assert arrived.wait(10)
                # The open delivery's row (a view over both layouts locks none of its rows).
                operator.execute(
                    "SELECT * FROM delivery_state WHERE delivery_id = 'd-cdn-1' FOR UPDATE"
                )
                locked.set()
                wait_for(
                    lambda: any("retrying" in r.getMessage() for r in caplog.records),
                    "the worker to log a retried statement",
                )
                assert delivery(conn, "d-cdn-1")["state"] == "leased"
            finally:
                locked.set()
                operator.rollback()
        assert run.result().totals.succeeded == 1
    retried = next(r.getMessage() for r in caplog.records if "retrying" in r.getMessage())
    assert "record outcomes" in retried and "lock" in retried
    assert delivery(conn, "d-cdn-1")["state"] == "succeeded"
    assert rate_limits.in_flight(conn, "cdn") == []


def test_a_worker_blocked_on_its_destination_gives_up_within_the_bound_and_loses_nothing(
    conn, pool, settings, database_url
):
    """An open transaction holds the destination's limiter row for as long as it likes. The
    worker gives up while it is still held (DatabaseBusy, no lease taken, nothing sent), and
    once the run's rows are released another run delivers every one."""
    with Receiver() as receiver, open_session(database_url) as operator:
        add_destination(conn, "cdn", url=receiver.url)
        ids = add_deliveries(conn, "cdn", 3)
        conn.execute("SELECT media_hooks_lock_limiter_v1('cdn')")  # the row exists
        operator.execute(
            "SELECT * FROM destination_limiter WHERE destination_id = 'cdn' FOR UPDATE"
        )
        try:
            with pytest.raises(db.DatabaseBusy) as caught:
                run_with_deadline(lambda: deliver_due(pool, "run-1", _short(settings)))
            assert "a lock held by another session" in str(caught.value)
            assert "\n" not in str(caught.value)
            assert states(conn) == {"enqueued": 3}
        finally:
            operator.rollback()
        assert receiver.request_count == 0

        assert sweeps.release_run(conn, "run-1") == 3
        report = deliver_due(pool, "run-2", _short(settings))
    assert report.totals.succeeded == 3
    assert receiver.accepted_ids == set(ids)


def run_with_deadline(action, timeout: float = 30.0):
    """Run ``action`` in a thread and fail the test if it has not ended by ``timeout``."""
    box: dict = {}

    def target():
        try:
            box["result"] = action()
        except BaseException as exc:  # re-raised in the test's thread
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        pytest.fail(f"still blocked after {timeout} s: no bound on the wait")
    if "error" in box:
        raise box["error"]
    return box.get("result")


# A dead letter is in history, or still in delivery_state where it holds its asset's queue;
# the requeue locks it in either (a view over both layouts locks none of their rows).
@pytest.mark.parametrize(
    ("ordering", "table"), [("none", "delivery_history"), ("asset", "delivery_state")]
)
def test_an_operator_requeue_meeting_a_lock_is_retried_then_refused_in_one_line(
    conn, settings, database_url, ordering, table
):
    add_destination(conn, "cdn", ordering=ordering)
    add_deliveries(conn, "cdn", 2, state="dead")
    with (
        open_session(database_url) as other,
        db.connect(database_url, role=db.Role.OPERATOR, settings=_short(settings)) as operator,
    ):
        operator.autocommit = True
        locked = other.execute(
            sql.SQL("SELECT 1 FROM {} WHERE delivery_id = 'dead-cdn-1' FOR UPDATE").format(
                sql.Identifier(table)
            )
        ).fetchall()
        assert len(locked) == 1, f"the dead letter is not in {table}: the lock would meet nothing"
        try:
            with pytest.raises(db.DatabaseBusy) as caught:
                run_with_deadline(
                    lambda: requeue(operator, Cohort(), reason="r", requested_by="op")
                )
        finally:
            other.rollback()
    assert "requeue" in str(caught.value) and "nothing was changed" in str(caught.value)
    assert states(conn) == {"dead": 2}
    assert conn.execute("SELECT count(*) AS n FROM delivery_requeue").fetchone()["n"] == 0
