"""The row protocol: leases, fenced outcomes, sweeps and requeue (the invariants of
docs/architecture.md)."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from media_hooks.core.config import Settings
from media_hooks.core.errors import UserError
from media_hooks.outbox import leases, rate_limits
from media_hooks.outbox.cohort import Cohort
from media_hooks.outbox.leases import Message
from media_hooks.outbox.maintenance import sweeps
from media_hooks.outbox.maintenance.requeue import requeue
from media_hooks.store.sqlfiles import query
from media_hooks_tests.factories import (
    ROOMY,
    add_deliveries,
    add_destination,
    answer,
    claim_all,
    delivery,
    lease_all,
    states,
)
from media_hooks_tests.interleaving import (
    in_background,
    open_session,
    wait_until_blocked,
)


def _messages(conn, run_id: str) -> list[Message]:
    rows = conn.execute(
        "SELECT message_id, delivery_id FROM dispatch_outbox WHERE run_id = %s ORDER BY message_id",
        (run_id,),
    ).fetchall()
    return [Message(r["message_id"], r["delivery_id"]) for r in rows]


def _dispatch(conn, count: int = 1, run_id: str = "run-1", **limits) -> list[Message]:
    add_destination(conn, "cdn", **{**ROOMY, **limits})
    add_deliveries(conn, "cdn", count)
    claim_all(conn, run_id, Cohort())
    return _messages(conn, run_id)


def _expire(conn, delivery_id: str) -> None:
    conn.execute(
        "UPDATE webhook_delivery_all SET lease_until = now() - interval '1 second' WHERE delivery_id = %s",
        (delivery_id,),
    )


def test_lease_opens_an_attempt_and_success_is_terminal(conn):
    (message,) = _dispatch(conn)
    (lease,) = lease_all(conn, "run-1", [message])
    row = delivery(conn, message.delivery_id)
    assert (row["state"], row["attempt_count"], row["lease_token"]) == (
        "leased",
        1,
        lease.lease_token,
    )
    attempt = conn.execute("SELECT * FROM delivery_attempt_all").fetchone()
    assert (attempt["attempt_no"], attempt["run_id"], attempt["finished_at"]) == (1, "run-1", None)

    assert leases.record_classified(conn, [answer(lease, "success", 200)]).states == {
        message.delivery_id: "succeeded"
    }
    row = delivery(conn, message.delivery_id)
    assert (row["state"], row["lease_token"], row["last_outcome"]) == ("succeeded", None, "success")
    attempt = conn.execute("SELECT * FROM delivery_attempt_all").fetchone()
    assert (attempt["outcome"], attempt["http_status"]) == ("success", 200)
    assert attempt["finished_at"] is not None
    # Invariant 4: a terminal row is never leased again, even through its old message.
    assert lease_all(conn, "run-1", [message]) == []


def test_a_message_is_leased_once_even_when_handed_over_twice(conn):
    (message,) = _dispatch(conn)
    first = lease_all(conn, "run-1", [message])
    second = lease_all(conn, "run-1", [message])
    assert len(first) == 1 and second == []


def test_fencing_a_late_worker_cannot_overwrite_a_newer_lease(conn):
    """Invariant 4: A's lease expires, B claims and succeeds, A's late failure changes nothing."""
    (message,) = _dispatch(conn)
    (lease_a,) = lease_all(conn, "run-1", [message])
    _expire(conn, message.delivery_id)
    (lease_b,) = lease_all(conn, "run-2", [message])
    assert lease_b.lease_token != lease_a.lease_token and lease_b.attempt_no == 2

    assert leases.record_classified(conn, [answer(lease_b, "success", 200)]).states == {
        message.delivery_id: "succeeded"
    }
    assert leases.record_classified(conn, [answer(lease_a, "retryable", 500)]).states == {}
    row = delivery(conn, message.delivery_id)
    assert (row["state"], row["last_outcome"]) == ("succeeded", "success")


def test_a_stale_message_is_skipped_after_a_new_dispatch(conn):
    (old,) = _dispatch(conn)
    sweeps.release_run(conn, "run-1")
    claim_all(conn, "run-2", Cohort())
    (new,) = _messages(conn, "run-2")
    assert lease_all(conn, "run-1", [old]) == []
    assert len(lease_all(conn, "run-2", [new])) == 1


@pytest.mark.parametrize(
    ("outcome", "status", "state"),
    [
        ("success", 200, "succeeded"),
        ("rejected", 400, "dead"),
        ("retryable", 500, "pending"),
        ("ambiguous", None, "pending"),
        ("rate_limited", 429, "pending"),
    ],
)
def test_outcome_moves_the_delivery_as_the_contract_says(conn, outcome, status, state):
    (message,) = _dispatch(conn)
    (lease,) = lease_all(conn, "run-1", [message])
    recorded = leases.record_classified(conn, [answer(lease, outcome, status)])
    assert recorded.states == {message.delivery_id: state}
    row = delivery(conn, message.delivery_id)
    if state == "pending":  # after a wait the database chose (test_state_machine_in_sql: which)
        assert row["next_attempt_at"] > row["updated_at"]


# The retry budget and the maximum age: test_state_machine_in_sql.


def test_expired_leases_are_swept_back_to_pending_with_the_attempt_marked_ambiguous(conn):
    messages = _dispatch(conn, count=3)
    taken = lease_all(conn, "run-1", messages)
    _expire(conn, taken[0].delivery_id)

    assert sweeps.sweep_expired_leases(conn) == 1
    row = delivery(conn, taken[0].delivery_id)
    assert (row["state"], row["lease_token"], row["wait_reason"]) == (
        "pending",
        None,
        "lease expiry: due again now",
    )
    attempt = conn.execute(
        "SELECT outcome, finished_at, retry_reason FROM delivery_attempt_all WHERE delivery_id = %s",
        (taken[0].delivery_id,),
    ).fetchone()
    assert (attempt["outcome"], attempt["retry_reason"]) == ("ambiguous", "lease expiry")
    assert states(conn) == {"pending": 1, "leased": 2}
    # The lost worker's late report is fenced out.
    assert leases.record_classified(conn, [answer(taken[0], "success", 200)]).states == {}


def test_stale_enqueues_are_swept_after_the_timeout(conn):
    _dispatch(conn, count=4)
    conn.execute(
        "UPDATE webhook_delivery_all SET updated_at = now() - interval '2 hours' WHERE delivery_id LIKE '%%-1' OR delivery_id LIKE '%%-2'"
    )
    assert sweeps.sweep_stale_enqueues(conn, timeout_seconds=3600) == 2
    assert states(conn) == {"pending": 2, "enqueued": 2}


def test_release_run_moves_exactly_that_runs_rows(conn):
    add_destination(conn, "cdn")
    add_deliveries(conn, "cdn", 3, prefix="a")
    claim_all(conn, "run-a", Cohort())
    add_deliveries(conn, "cdn", 2, prefix="b")
    claim_all(conn, "run-b", Cohort())
    lease_all(conn, "run-a", _messages(conn, "run-a")[:1])

    assert sweeps.release_run(conn, "run-a") == 3
    rows = conn.execute("SELECT delivery_id, state FROM webhook_delivery_all ORDER BY 1").fetchall()
    assert {r["delivery_id"]: r["state"] for r in rows} == {
        "a-cdn-1": "pending",
        "a-cdn-2": "pending",
        "a-cdn-3": "pending",
        "b-cdn-1": "enqueued",
        "b-cdn-2": "enqueued",
    }
    open_attempts = conn.execute(
        "SELECT count(*) AS n FROM delivery_attempt_all WHERE finished_at IS NULL"
    ).fetchone()
    assert open_attempts["n"] == 0


def test_defer_returns_unsent_deliveries_without_spending_budget(conn):
    messages = _dispatch(conn, count=2)
    assert leases.defer(conn, messages, 3600, "destination rate: next start in an hour") == 2
    row = delivery(conn, messages[0].delivery_id)
    assert (row["state"], row["budget_used"]) == ("pending", 0)
    due_in = conn.execute(
        "SELECT extract(epoch FROM next_attempt_at - now()) AS s FROM webhook_delivery_all LIMIT 1"
    ).fetchone()["s"]
    assert 3590 < due_in <= 3600


def test_circuit_breaker_disables_a_destination_whose_every_attempt_failed(conn):
    add_destination(conn, "flaky")
    add_destination(conn, "healthy")
    add_deliveries(conn, "flaky", 1)
    add_deliveries(conn, "healthy", 1)
    # Thirty ended attempts each over 30 hours, all failed but healthy's last (this layout's
    # attempts are written once, ended).
    for destination in ("flaky", "healthy"):
        conn.execute(
            """
            INSERT INTO delivery_attempt_v2 (delivery_id, attempt_no, destination_id, lease_token,
                                             delivery_created_at, started_at, finished_at, outcome,
                                             error)
            SELECT d.delivery_id, g, d.destination_id, gen_random_uuid(), d.created_at,
                   now() - make_interval(hours => 30) + make_interval(mins => g * 58), now(),
                   CASE WHEN d.destination_id = 'healthy' AND g = 30 THEN 'success'
                        ELSE 'retryable' END,
                   'HTTP 500'
            FROM delivery_state AS d, generate_series(1, 30) AS g
            WHERE d.delivery_id = %(d)s
            """,
            {"d": f"d-{destination}-1"},
        )
    settings = Settings.from_env()
    tripped = sweeps.trip_circuit_breakers(conn, settings)
    assert [row["destination_id"] for row in tripped] == ["flaky"]
    flaky = conn.execute(
        "SELECT enabled, disabled_reason FROM webhook_destination WHERE destination_id = 'flaky'"
    ).fetchone()
    assert flaky["enabled"] is False and flaky["disabled_reason"].startswith(
        "circuit breaker: all "
    )
    assert states(conn) == {"pending": 2}  # nothing is killed while the destination is off


def test_requeue_dead_letters_with_a_fresh_budget_and_an_audit_row(conn):
    (message,) = _dispatch(conn, max_attempts=1)
    (lease,) = lease_all(conn, "run-1", [message])
    recorded = leases.record_classified(conn, [answer(lease, "retryable", 500)])
    assert recorded.states == {message.delivery_id: "dead"}

    preview = requeue(conn, Cohort(), reason="receiver fixed", requested_by="oncall", dry_run=True)
    assert (preview.matched, preview.moved, preview.by_state) == (1, 0, {"dead": 1})
    assert delivery(conn, message.delivery_id)["state"] == "dead"

    done = requeue(conn, Cohort(), reason="receiver fixed", requested_by="oncall")
    assert (done.moved, done.by_state, done.sample) == (1, {"dead": 1}, [message.delivery_id])
    row = delivery(conn, message.delivery_id)
    assert (row["state"], row["budget_used"], row["wait_reason"]) == (
        "pending",
        0,
        "requeued by oncall: receiver fixed",
    )
    audit = conn.execute("SELECT requested_by, reason, moved FROM delivery_requeue").fetchone()
    assert audit == {"requested_by": "oncall", "reason": "receiver fixed", "moved": 1}
    # Same identity: the next dispatch carries the same delivery_id.
    claim_all(conn, "run-2", Cohort())
    assert [m.delivery_id for m in _messages(conn, "run-2")] == [message.delivery_id]


def test_requeue_refuses_succeeded_and_an_empty_reason(conn):
    with pytest.raises(UserError, match="succeeded delivery is final"):
        requeue(conn, Cohort(), states=("succeeded",), reason="x", requested_by="me")
    with pytest.raises(UserError, match="needs a --reason"):
        requeue(conn, Cohort(), reason="  ", requested_by="me")


def test_release_run_frees_the_send_permits_its_workers_held(conn):
    add_destination(conn, "cdn", max_in_flight=2)
    add_destination(conn, "rights", max_in_flight=1)
    rate_limits.acquire(conn, "cdn", 2, "run-dead", hold_seconds=600)
    rate_limits.acquire(conn, "rights", 1, "run-dead", hold_seconds=600)
    assert rate_limits.acquire(conn, "rights", 1, "run-alive", hold_seconds=600).granted == 0
    assert rate_limits.acquire(conn, "cdn", 1, "run-alive", hold_seconds=600).granted == 0

    sweeps.release_run(conn, "run-dead")

    assert rate_limits.in_flight(conn, "cdn") == []
    assert rate_limits.acquire(conn, "rights", 1, "run-alive", hold_seconds=600).granted == 1


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("body", b"{}"),
        ("payload", '{"other": 1}'),
        ("asset_id", "asset-x"),
        ("created_at", "2020-01-01"),
    ],
)
def test_a_deliverys_identity_cannot_be_updated(conn, column, value):
    """Invariant 2 is the database's: a payload revision is a new delivery_id."""
    (message,) = _dispatch(conn)
    with pytest.raises(psycopg.errors.CheckViolation, match="is immutable"):
        conn.execute(
            sql.SQL(
                "UPDATE webhook_delivery_all SET state = 'pending', {} = %s WHERE delivery_id = %s"
            ).format(sql.Identifier(column)),
            (value, message.delivery_id),
        )


def test_a_lease_token_exists_only_while_leased(conn):
    """The token alone fences an outcome, so no row outside 'leased' may keep one."""
    (message,) = _dispatch(conn)
    lease_all(conn, "run-1", [message])
    with pytest.raises(psycopg.errors.CheckViolation, match="lease_only_while_leased"):
        conn.execute(
            "UPDATE webhook_delivery_all SET state = 'pending' WHERE delivery_id = %s",
            (message.delivery_id,),
        )
    assert delivery(conn, message.delivery_id)["state"] == "leased"


# Hole 3: an expired lease ends one way, whoever ends it -----------------------------------


def _attempts(conn, delivery_id: str) -> list[dict]:
    return conn.execute(
        "SELECT attempt_no, lease_token, outcome, finished_at, error, retry_reason "
        "FROM delivery_attempt_all WHERE delivery_id = %s ORDER BY attempt_no",
        (delivery_id,),
    ).fetchall()


def _take_over(conn, message: Message, run_id: str = "run-2") -> list:
    """A step retry offering the same message again: the worker's lease-with-permits path."""
    return leases.lease_with_permits(
        conn, run_id, "cdn", [message], holder=run_id, lease_seconds=90, release_slots=[]
    ).leases


def test_a_lease_takeover_closes_the_abandoned_attempt_as_ambiguous(conn):
    (message,) = _dispatch(conn)
    (first,) = lease_all(conn, "run-1", [message])
    _expire(conn, message.delivery_id)

    (second,) = _take_over(conn, message)

    assert second.attempt_no == 2
    abandoned, current = _attempts(conn, message.delivery_id)
    assert abandoned["outcome"] == "ambiguous" and abandoned["finished_at"] is not None
    assert "lease expired" in abandoned["error"]
    assert abandoned["retry_reason"] == "lease expiry (taken over by run run-2)"
    assert (current["outcome"], current["lease_token"]) == (None, second.lease_token)
    row = delivery(conn, message.delivery_id)
    assert (row["state"], row["last_outcome"]) == ("leased", "ambiguous")


@pytest.mark.parametrize("rule", ["budget", "age"])
def test_a_takeover_applies_the_budget_and_age_rules_like_the_sweep(conn, rule):
    limits = {"max_attempts": 1} if rule == "budget" else {"max_age_seconds": 60}
    (message,) = _dispatch(conn, **limits)
    lease_all(conn, "run-1", [message])
    _expire(conn, message.delivery_id)
    if rule == "age":
        conn.execute(
            "UPDATE webhook_delivery_all SET budget_started_at = now() - interval '2 minutes'"
        )

    assert _take_over(conn, message) == []

    row = delivery(conn, message.delivery_id)
    assert row["state"] == "dead" and row["lease_token"] is None
    assert row["wait_reason"].startswith(
        "dead: retry budget spent" if rule == "budget" else "dead: older than the maximum"
    )
    (abandoned,) = _attempts(conn, message.delivery_id)
    assert abandoned["outcome"] == "ambiguous"
    # No permit is kept for a delivery that was not leased: run-1's lease holds the only one.
    assert [s["mine"] for s in rate_limits.in_flight(conn, "cdn", "run-2")] == [False]


def test_the_sweep_applies_the_age_rule_too(conn):
    (message,) = _dispatch(conn, max_age_seconds=60)
    lease_all(conn, "run-1", [message])
    _expire(conn, message.delivery_id)
    conn.execute("UPDATE webhook_delivery_all SET budget_started_at = now() - interval '2 minutes'")
    assert sweeps.sweep_expired_leases(conn) == 1
    assert delivery(conn, message.delivery_id)["state"] == "dead"


def test_a_takeover_and_the_sweep_interleaved_close_the_attempt_once(conn, database_url):
    """T1 takes the expired lease over and holds its transaction; the sweep (T2) runs meanwhile.
    The sweep must not touch the row T1 holds, and T1's commit leaves attempt 1 closed as
    ambiguous exactly once and attempt 2 open under T1's token."""
    (message,) = _dispatch(conn)
    lease_all(conn, "run-1", [message])
    _expire(conn, message.delivery_id)

    with open_session(database_url) as taker:
        (second,) = lease_all(taker, "run-2", [message])
        with open_session(database_url, autocommit=True) as sweeper:
            assert sweeps.sweep_expired_leases(sweeper) == 0  # SKIP LOCKED: T1's row
        taker.commit()

    abandoned, current = _attempts(conn, message.delivery_id)
    assert abandoned["outcome"] == "ambiguous"
    assert current["outcome"] is None and current["lease_token"] == second.lease_token
    assert delivery(conn, message.delivery_id)["lease_token"] == second.lease_token


def test_a_sweep_and_a_takeover_interleaved_end_the_lease_once(conn, database_url):
    """The other order: the sweep (T1) ended the expired lease and holds its transaction; a
    takeover (T2) meanwhile leaves the row to T1 (it neither waits nor ends it again). Once T1
    commits, the delivery is due and the next offer leases it: attempt 1 closed once."""
    (message,) = _dispatch(conn)
    lease_all(conn, "run-1", [message])
    _expire(conn, message.delivery_id)

    with (
        open_session(database_url) as sweeper,
        open_session(database_url, autocommit=True) as taker,
    ):
        assert sweeps.sweep_expired_leases(sweeper) == 1
        with in_background(lambda: lease_all(taker, "run-2", [message])) as taken:
            wait_until_blocked(conn, taker.info.backend_pid, taken)
            sweeper.commit()
        assert taken.result() == []
        (second,) = lease_all(taker, "run-2", [message])

    abandoned, current = _attempts(conn, message.delivery_id)
    assert (abandoned["outcome"], abandoned["retry_reason"]) == ("ambiguous", "lease expiry")
    assert current["lease_token"] == second.lease_token and current["outcome"] is None


def test_a_sweep_and_a_late_record_interleaved_end_the_lease_once(conn, database_url):
    """The sweep (T1) ended the expired lease and holds its transaction; the late worker's
    record (T2), begun meanwhile, waits for the row and then, the lease no longer its, moves
    nothing and closes no attempt: attempt 1 stays as the sweep closed it. (The record reads its
    rows without a lock since migration 0031: its update matches the token on the newest
    version.)"""
    (message,) = _dispatch(conn)
    (late,) = lease_all(conn, "run-1", [message])
    _expire(conn, message.delivery_id)

    with (
        open_session(database_url) as sweeper,
        open_session(database_url, autocommit=True) as worker,
    ):
        assert sweeps.sweep_expired_leases(sweeper) == 1

        def record() -> leases.Recorded:
            return leases.record_classified(worker, [answer(late, "success", 200)])

        with in_background(record) as recorded:
            wait_until_blocked(conn, worker.info.backend_pid, recorded)
            sweeper.commit()
        assert recorded.result().states == {}

    (attempt,) = _attempts(conn, message.delivery_id)
    assert (attempt["outcome"], attempt["retry_reason"]) == ("ambiguous", "lease expiry")
    row = delivery(conn, message.delivery_id)
    assert (row["state"], row["lease_token"]) == ("pending", None)


# Hole 4: requeue never makes an in-flight delivery sendable --------------------------------


def test_requeue_leaves_a_delivery_in_flight_alone_and_says_so(conn):
    (message,) = _dispatch(conn)
    (lease,) = lease_all(conn, "run-1", [message])

    preview = requeue(
        conn, Cohort(), states=("leased", "dead"), reason="r", requested_by="me", dry_run=True
    )
    done = requeue(conn, Cohort(), states=("leased", "dead"), reason="r", requested_by="me")

    row = delivery(conn, message.delivery_id)
    assert (row["state"], row["lease_token"]) == ("leased", lease.lease_token)
    for result in (preview, done):
        assert (result.matched, result.in_flight, result.by_state) == (0, 1, {})
    assert leases.record_classified(conn, [answer(lease, "success", 200)]).states == {
        message.delivery_id: "succeeded"
    }


def test_requeue_of_an_expired_lease_closes_its_attempt_and_dry_run_agrees(conn):
    messages = _dispatch(conn, count=2)
    taken = lease_all(conn, "run-1", messages)
    _expire(conn, taken[0].delivery_id)

    preview = requeue(
        conn, Cohort(), states=("leased",), reason="stuck", requested_by="me", dry_run=True
    )
    done = requeue(conn, Cohort(), states=("leased",), reason="stuck", requested_by="me")

    assert delivery(conn, taken[1].delivery_id)["state"] == "leased"
    row = delivery(conn, taken[0].delivery_id)
    assert (row["state"], row["budget_used"]) == ("pending", 0)
    (attempt,) = _attempts(conn, taken[0].delivery_id)
    assert attempt["outcome"] == "ambiguous" and attempt["finished_at"] is not None
    for result in (preview, done):
        assert (result.matched, result.in_flight, result.by_state) == (1, 1, {"leased": 1})
    assert done.sample == [taken[0].delivery_id]


def test_requeue_waiting_on_a_row_being_leased_leaves_the_new_lease_alone(conn, database_url):
    """A worker (T1) leases an enqueued delivery and holds its transaction; a requeue of
    enqueued and leased rows (T2) waits for the row, then must see the lease and skip it."""
    (message,) = _dispatch(conn)
    with open_session(database_url) as worker, open_session(database_url) as operator:
        (lease,) = lease_all(worker, "run-1", [message])
        with in_background(
            lambda: requeue(
                operator, Cohort(), states=("enqueued", "leased"), reason="r", requested_by="op"
            )
        ) as requeued:
            wait_until_blocked(conn, operator.info.backend_pid)
            worker.commit()
        result = requeued.result()
        operator.commit()

    row = delivery(conn, message.delivery_id)
    assert (row["state"], row["lease_token"]) == ("leased", lease.lease_token)
    assert (result.moved, result.in_flight) == (0, 1)


# Hole 6: a stale message spends no start token --------------------------------------------


def _stale_and_current(conn) -> tuple[Message, Message]:
    """One delivery dispatched twice: run-1's message is stale, run-2's is current."""
    (old,) = _dispatch(conn, rate_per_second=0.01, burst=1, max_in_flight=4)
    sweeps.release_run(conn, "run-1")
    claim_all(conn, "run-2", Cohort())
    (new,) = _messages(conn, "run-2")
    return old, new


def test_a_stale_message_spends_no_start_token(conn):
    old, new = _stale_and_current(conn)
    stale = leases.lease_with_permits(
        conn, "run-1", "cdn", [old], holder="run-1", lease_seconds=90, release_slots=[]
    )
    assert (stale.leases, stale.examined) == ([], 1)
    taken = leases.lease_with_permits(
        conn, "run-2", "cdn", [new], holder="run-2", lease_seconds=90, release_slots=[]
    ).leases
    assert [lease.message_id for lease in taken] == [new.message_id]
    # The stale offer kept no slot either: only run-2's lease holds one.
    assert stale.grant.slots == []
    assert [s["mine"] for s in rate_limits.in_flight(conn, "cdn", "run-2")] == [True]


def test_a_message_made_stale_while_its_lease_waits_gives_its_token_back(conn, database_url):
    """T1 re-dispatches the delivery and holds its transaction; the worker (T2) takes a permit
    and waits on the row; when T1 commits, T2's message is stale: no lease, and the token and
    slot T2 took are refunded in the same statement, so the live message goes out at once."""
    (old,) = _dispatch(conn, rate_per_second=0.01, burst=1, max_in_flight=4)
    with (
        open_session(database_url) as dispatcher,
        open_session(database_url, autocommit=True) as worker,
    ):
        dispatcher.execute(
            query("release_run"),
            {
                "run_id": "run-1",
                "destination_ids": None,
                "cause": "released: run run-1 failed",
                "error": "run failed before an outcome was recorded",
            },
        )
        claim_all(dispatcher, "run-2", Cohort())
        with in_background(
            lambda: leases.lease_with_permits(
                worker, "run-1", "cdn", [old], holder="run-1", lease_seconds=90, release_slots=[]
            )
        ) as stale:
            wait_until_blocked(conn, worker.info.backend_pid)
            dispatcher.commit()
        assert stale.result().leases == []
    (new,) = _messages(conn, "run-2")
    taken = leases.lease_with_permits(
        conn, "run-2", "cdn", [new], holder="run-2", lease_seconds=90, release_slots=[]
    ).leases
    assert [lease.delivery_id for lease in taken] == [new.delivery_id]
    assert [s["slot_no"] for s in rate_limits.in_flight(conn, "cdn")] == [1]


def test_a_lease_that_waited_on_a_lock_counts_its_starts_from_when_it_leased(conn, database_url):
    """Found by the soak's operator lock: the worker (A) takes two starts (the whole burst) and
    its lease waits on a row an operator's session holds for a while; the starts go out only
    when A commits. The next grant (B), right after, must not find the bucket drained by the
    wait: that would put a second burst on top of A's (migration 0009)."""
    messages = _dispatch(conn, count=4, rate_per_second=2, burst=2, max_in_flight=10)
    first, second = messages[:2], messages[2:]
    with (
        open_session(database_url) as operator,
        open_session(database_url, autocommit=True) as worker_a,
    ):
        # The open delivery's row (a view over both layouts locks none of its rows).
        operator.execute(
            "SELECT 1 FROM delivery_state WHERE delivery_id = %s FOR UPDATE",
            (first[1].delivery_id,),
        )
        with in_background(
            lambda: leases.lease_with_permits(
                worker_a, "run-1", "cdn", first, holder="a", lease_seconds=90, release_slots=[]
            )
        ) as step_a:
            wait_until_blocked(conn, worker_a.info.backend_pid)
            # The operator holds the row for longer than the rate needs to drain the burst.
            operator.execute("SELECT pg_sleep(1.2)")
            released_at = operator.execute("SELECT clock_timestamp() AS t").fetchone()["t"]
            operator.commit()
        assert len(step_a.result().leases) == 2
    step_b = leases.lease_with_permits(
        conn, "run-1", "cdn", second, holder="b", lease_seconds=90, release_slots=[]
    )
    # A's two starts went out after released_at; B may add only what the rate allowed since.
    since = (step_b.grant.granted_at - released_at).total_seconds()
    assert len(step_b.leases) <= int(2 * since), (len(step_b.leases), since)
    assert step_b.grant.reason == "rate"
