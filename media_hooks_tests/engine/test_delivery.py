"""The Python delivery worker against real PostgreSQL and a real receiver on 127.0.0.1: what
is particular to it (its pages, threads, collector, stages). What it shares with the Node.js
worker is tested on both runtimes at once: test_conformance.py."""

from __future__ import annotations

import base64
import gc
import threading
import time

import psycopg
import pytest

from media_hooks.devtools.receiver import Receiver, Reply, by_attempt
from media_hooks.engine import recording
from media_hooks.engine.counts import DeliveryCounts
from media_hooks.engine.delivery import deliver_destination
from media_hooks.engine.delivery_run import deliver_due
from media_hooks.engine.pages import DuePages, RowBudget
from media_hooks.engine.worker import DestinationWorker
from media_hooks.http.sender import Sender
from media_hooks.outbox import claims, leases, rate_limits
from media_hooks.outbox.cohort import Cohort
from media_hooks.outbox.destinations import (
    DestinationSpec,
    disable_destination,
    list_destinations,
    upsert_destination,
)
from media_hooks.outbox.maintenance.requeue import requeue
from media_hooks_tests.envelope import envelope_excess
from media_hooks_tests.factories import add_deliveries, add_destination, delivery, states
from media_hooks_tests.interleaving import in_background, wait_for

SECRET = "whsec_" + base64.b64encode(b"delivery-test-secret-0123456789").decode()


def _attempts(conn, delivery_id: str) -> list[dict]:
    return conn.execute(
        "SELECT * FROM delivery_attempt_all WHERE delivery_id = %s ORDER BY attempt_no",
        (delivery_id,),
    ).fetchall()


def _freeze_counts_while_sending(conn, pool, settings, monkeypatch) -> list[int]:
    """Deliver 5 messages, noting the collector's frozen objects at each request."""
    seen: list[int] = []
    submit = Sender.submit

    def noting(self, delivery_id, body):
        seen.append(gc.get_freeze_count())
        return submit(self, delivery_id, body)

    monkeypatch.setattr(Sender, "submit", noting)
    with Receiver() as receiver:
        add_destination(conn, "cdn", url=receiver.url, max_in_flight=2)
        add_deliveries(conn, "cdn", 5)
        assert deliver_due(pool, "run-gc", settings).totals.succeeded == 5
    return seen


def test_a_run_keeps_what_existed_at_its_start_out_of_full_collections_then_unfreezes_it(
    conn, pool, settings, monkeypatch
):
    gc.unfreeze()  # a process that froze nothing of its own
    seen = _freeze_counts_while_sending(conn, pool, settings, monkeypatch)
    assert len(seen) == 5 and min(seen) > 0
    assert gc.get_freeze_count() == 0  # nothing stays out of collection after the run


def test_a_process_that_froze_its_own_objects_keeps_them_frozen_after_a_run(
    conn, pool, settings, monkeypatch
):
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        seen = _freeze_counts_while_sending(conn, pool, settings, monkeypatch)
        # Frozen objects that die leave the count; a second freeze would add the run's own.
        assert len(seen) == 5 and max(seen) <= frozen
        assert 0 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()


def test_a_requeued_dead_letter_is_delivered_with_the_same_id(conn, pool, settings):
    with Receiver(script=by_attempt(Reply(status=400))) as receiver:
        add_destination(conn, "cdn", url=receiver.url)
        add_deliveries(conn, "cdn", 1)
        assert deliver_due(pool, "run-1", settings).totals.dead == 1
        # Dead is terminal: a new run claims nothing.
        assert deliver_due(pool, "run-2", settings).claim.claimed == 0
        requeue(conn, Cohort(), reason="receiver fixed", requested_by="test")
        assert deliver_due(pool, "run-3", settings).totals.succeeded == 1
        assert [r.webhook_id for r in receiver.requests] == ["d-cdn-1", "d-cdn-1"]
        assert [r.status for r in receiver.requests] == [400, 200]


def test_a_rate_bound_worker_asks_for_a_burst_at_a_time_and_stays_within_the_envelope(
    conn, pool, settings, monkeypatch
):
    """Each ask of the limiter costs a database round trip: a worker bound by the rate asks
    when a burst of starts is due, not once per start or per finished request; the starts
    still never exceed burst + rate·t at the receiver (beyond arrival jitter)."""
    rate, burst, count = 40.0, 4, 48
    asks: list[int] = []
    real = leases.lease_with_permits

    def counted(*args, **kwargs):
        step = real(*args, **kwargs)
        asks.append(len(step.leases))
        return step

    monkeypatch.setattr(leases, "lease_with_permits", counted)
    with Receiver(reply=Reply(delay_seconds=0.1)) as receiver:
        add_destination(
            conn, "cdn", url=receiver.url, max_in_flight=20, rate_per_second=rate, burst=burst
        )
        add_deliveries(conn, "cdn", count)
        assert deliver_due(pool, "run-1", settings).totals.succeeded == count
        starts = sorted(r.arrived_monotonic for r in receiver.requests)
    # One start an ask would be 48 asks; a burst an ask is 12, and a few spare for the ends.
    assert sum(asks) == count
    assert len(asks) <= count // burst + 4, asks
    assert envelope_excess(starts, rate=rate, burst=burst) <= 0


def _deliver_in_pages(conn, pool, settings, page_size: int) -> DeliveryCounts:
    """Deliver everything due to ``cdn`` for run-1 as a delivery run does, its worker claiming
    pages of ``page_size`` messages as it runs out."""
    budget = RowBudget(None)
    return deliver_destination(
        pool, "run-1", "cdn", settings, cohort=Cohort(), budget=budget, claim_page_size=page_size
    ).counts


def _open_attempts(conn) -> int:
    return conn.execute(
        "SELECT count(*) AS n FROM delivery_attempt_all WHERE finished_at IS NULL"
    ).fetchone()["n"]


class Injected(RuntimeError):
    pass


def _fail_on_call(monkeypatch, owner, name: str, call: int) -> None:
    """Make ``owner.name`` raise Injected on its ``call``-th call (once), as a fault would."""
    original = getattr(owner, name)
    calls = 0

    def failing(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == call:
            raise Injected(f"injected at {name}")
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, failing)


# stage -> (module or class, function, the call that fails, receiver's answer)
STAGES = {
    "claim": (claims, "claim_destination_page", 2, Reply()),
    "lease": (leases, "lease_with_permits", 2, Reply()),
    "record": (leases, "record_classified", 1, Reply()),
    # A 429's pause is made by the statement that records it (migration 0017).
    "signals": (
        leases,
        "record_classified",
        1,
        Reply(status=429, headers={"Retry-After": "120"}),
    ),
    "defer": (leases, "defer", 1, Reply(status=429, headers={"Retry-After": "120"})),
}


@pytest.mark.parametrize("stage", list(STAGES))
def test_an_exception_at_any_stage_hands_back_permits_and_leaves_no_lease_unrecorded(
    conn, pool, settings, monkeypatch, stage
):
    """Item 1's rule: however a batch fails, its permits go back and every lease it took
    is recorded (what finished with its real outcome); unsent rows stay discoverable."""
    owner, name, call, reply = STAGES[stage]
    with Receiver(reply=reply) as receiver:
        add_destination(
            conn, "cdn", url=receiver.url, max_in_flight=2, rate_per_second=1000, burst=100
        )
        ids = add_deliveries(conn, "cdn", 6)
        _fail_on_call(monkeypatch, owner, name, call)

        with pytest.raises(Injected):
            _deliver_in_pages(conn, pool, settings, 2)

        assert rate_limits.in_flight(conn, "cdn") == []
        assert _open_attempts(conn) == 0
        rows = conn.execute("SELECT delivery_id, state FROM webhook_delivery_all").fetchall()
        assert {r["delivery_id"] for r in rows} == set(ids)
        assert "leased" not in {r["state"] for r in rows}
        # What was sent is recorded with the receiver's answer, not left to a lease expiry.
        sent = {r.webhook_id for r in receiver.requests}
        recorded = conn.execute("SELECT delivery_id, outcome FROM delivery_attempt_all").fetchall()
        assert {r["delivery_id"] for r in recorded} == sent
        expected = "success" if reply.status == 200 else "rate_limited"
        assert {r["outcome"] for r in recorded} == {expected}


def test_a_sender_that_raises_is_an_ambiguous_attempt_not_a_failed_batch(
    conn, pool, settings, monkeypatch
):
    """The send stage: a bug in the sender may have sent the request; it is recorded as
    ambiguous (same key next time) and the batch carries on."""
    with Receiver() as receiver:
        add_destination(conn, "cdn", url=receiver.url, max_in_flight=2)
        add_deliveries(conn, "cdn", 4)
        _fail_on_call(monkeypatch, Sender, "_post", 1)

        report = _deliver_in_pages(conn, pool, settings, 2)

        assert (report.succeeded, report.ambiguous) == (3, 1)
        failed = conn.execute(
            "SELECT outcome, error FROM delivery_attempt_all WHERE outcome <> 'success'"
        ).fetchone()
        assert failed["outcome"] == "ambiguous"
        assert "Injected: injected at _post" in failed["error"]
        assert rate_limits.in_flight(conn, "cdn") == []
        assert _open_attempts(conn) == 0


def test_an_exception_while_a_start_granted_ahead_waits_hands_its_permit_back(
    conn, pool, settings, monkeypatch
):
    """A start granted ahead (migration 0014) waits in the worker until its moment: a failure
    meanwhile hands its permit back and records its lease as not sent, budget kept."""
    # One start a second, no stored credit, starts granted up to 0.5 s ahead: the second
    # delivery's start is granted well before its moment, however busy the host.
    monkeypatch.setattr(rate_limits, "AHEAD_SECONDS", 0.5)
    waits: list[float] = []
    wait_for_start = DestinationWorker._wait_for_start

    def failing(worker, start_at: float) -> bool:
        waits.append(start_at - time.monotonic())
        if len(waits) == 2:
            raise Injected("injected while waiting for a start")
        return wait_for_start(worker, start_at)

    monkeypatch.setattr(DestinationWorker, "_wait_for_start", failing)
    with Receiver() as receiver:
        add_destination(conn, "cdn", url=receiver.url, max_in_flight=2, rate_per_second=1, burst=1)
        add_deliveries(conn, "cdn", 2)

        with pytest.raises(Injected):
            _deliver_in_pages(conn, pool, settings, 2)

        assert waits[1] > 0  # the failure came while the second start was granted ahead
        assert rate_limits.in_flight(conn, "cdn") == []
        assert _open_attempts(conn) == 0
        (sent,) = [r.webhook_id for r in receiver.requests]
        rows = conn.execute(
            "SELECT d.delivery_id, d.state, d.budget_used, a.outcome, a.error "
            "FROM webhook_delivery_all d JOIN delivery_attempt_all a USING (delivery_id) "
            "ORDER BY a.started_at"
        ).fetchall()
        assert [(r["delivery_id"] == sent, r["state"], r["outcome"]) for r in rows] == [
            (True, "succeeded", "success"),
            (False, "pending", "retryable"),
        ]
        assert rows[1]["budget_used"] == 0
        assert "not sent: the batch stopped first (Injected" in rows[1]["error"]


def _holding(hold_id: str):
    """A receiver script that holds ``hold_id``'s first request until released; every other
    request is answered 200 at once."""
    arrived, release = threading.Event(), threading.Event()

    def script(info):
        if info.webhook_id == hold_id and info.seen_before == 0:
            arrived.set()
            release.wait(60)
        return Reply()

    return script, arrived, release


def test_an_answered_delivery_is_recorded_while_a_slow_neighbour_is_in_flight(conn, pool, settings):
    """Hole 5: an outcome waits at most the record delay, not for the slowest request."""
    script, arrived, release = _holding("d-cdn-1")
    with Receiver(script=script) as receiver:
        add_destination(conn, "cdn", url=receiver.url, max_in_flight=2, timeout_seconds=30)
        add_deliveries(conn, "cdn", 2)
        with in_background(lambda: deliver_due(pool, "run-1", settings)) as run:
            try:
                wait_for(
                    lambda: delivery(conn, "d-cdn-2")["state"] == "succeeded",
                    "the answered delivery's outcome to be recorded",
                    timeout=10,
                )
                assert arrived.is_set() and delivery(conn, "d-cdn-1")["state"] == "leased"
            finally:
                release.set()
        assert run.result().totals.succeeded == 2


def test_requeue_while_a_request_is_in_flight_causes_no_second_send(conn, pool, settings):
    """Hole 4 with a real receiver: an operator's requeue during the request, then another
    run, must not send the delivery again; the first worker's success is recorded."""
    script, arrived, release = _holding("d-cdn-1")
    with Receiver(script=script) as receiver:
        add_destination(conn, "cdn", url=receiver.url, timeout_seconds=30)
        add_deliveries(conn, "cdn", 1)
        with in_background(lambda: deliver_due(pool, "run-1", settings)) as first:
            try:
                assert arrived.wait(10)
                result = requeue(
                    conn, Cohort(), states=("leased", "dead"), reason="r", requested_by="op"
                )
                second = deliver_due(pool, "run-2", settings)
            finally:
                release.set()
        assert first.result().totals.succeeded == 1
    assert receiver.requests_by_id == {"d-cdn-1": 1}
    assert (second.claim.claimed, result.moved, result.in_flight) == (0, 0, 1)
    assert delivery(conn, "d-cdn-1")["state"] == "succeeded"
    assert [a["outcome"] for a in _attempts(conn, "d-cdn-1")] == ["success"]


def _change_at_request(number: int, change) -> tuple:
    """A script that calls ``change()`` while answering the ``number``-th request."""
    seen = 0
    lock = threading.Lock()

    def script(info):
        nonlocal seen
        with lock:
            seen += 1
            current = seen
        if current == number:
            change()
        return Reply()

    return script


NEW_SECRET = "whsec_" + base64.b64encode(b"rotated-secret-after-the-change").decode()


def test_a_changed_url_and_secret_take_effect_at_the_next_page(conn, pool, settings, database_url):
    """Hole 10: a running batch re-reads its destination at every page."""
    with (
        psycopg.connect(database_url, autocommit=True) as operator,
        Receiver(secrets=[NEW_SECRET]) as new,
    ):

        def change():
            spec = DestinationSpec("cdn", new.url, secrets=(NEW_SECRET,))
            upsert_destination(operator, spec, settings)

        with Receiver(secrets=[SECRET], script=_change_at_request(3, change)) as old:
            add_destination(conn, "cdn", url=old.url, secrets=[SECRET], max_in_flight=1)
            add_deliveries(conn, "cdn", 20)

            report = _deliver_in_pages(conn, pool, settings, 5)

        assert report.succeeded == 20
        assert 3 <= old.request_count <= 5  # the rest of the page it was changed in, at most
        assert new.request_count == 20 - old.request_count
        assert all(r.verified for r in new.requests)


def test_a_destination_disabled_mid_batch_stops_at_once(conn, pool, settings, database_url):
    with psycopg.connect(database_url, autocommit=True) as operator:
        script = _change_at_request(3, lambda: disable_destination(operator, "cdn", "maintenance"))
        with Receiver(script=script) as receiver:
            add_destination(conn, "cdn", url=receiver.url, max_in_flight=1)
            add_deliveries(conn, "cdn", 10)
            report = _deliver_in_pages(conn, pool, settings, 5)
    assert receiver.request_count == 3
    # The rest of the page it was disabled in is handed back; the next page is never claimed.
    assert (report.succeeded, report.deferred) == (3, 2)
    assert states(conn) == {"succeeded": 3, "pending": 7}


def test_deferred_deliveries_are_due_when_the_pause_ends_on_the_database_clock(
    conn, pool, settings
):
    """Hole 8: a deferral's due time is the pause's end as the database stored it, not an
    application host's clock plus a duration."""
    with Receiver(script=by_attempt(Reply(status=429, headers={"Retry-After": "120"}))) as receiver:
        add_destination(conn, "cdn", url=receiver.url, max_in_flight=1)
        add_deliveries(conn, "cdn", 3)
        report = deliver_due(pool, "run-1", settings)
    assert report.totals.deferred == 2
    (paused_until,) = (
        conn.execute("SELECT paused_until FROM webhook_destination").fetchone().values()
    )
    deferred = conn.execute(
        "SELECT next_attempt_at FROM webhook_delivery_all WHERE attempt_count = 0"
    ).fetchall()
    assert [r["next_attempt_at"] for r in deferred] == [paused_until, paused_until]


@pytest.mark.parametrize(
    "stored",
    [
        {"backoff_base_seconds": 1e300, "backoff_cap_seconds": 1e300},
        {"rate_per_second": 1e-300},
    ],
    ids=["backoff", "rate"],
)
def test_settings_the_engine_cannot_honour_disable_the_destination_before_any_send(
    conn, pool, settings, stored
):
    """Hole 9: a destination stored with values outside their documented ranges (before
    `destination add` checked them) is a configuration fault found before any send."""
    with Receiver(reply=Reply(status=500)) as receiver:
        add_destination(conn, "cdn", url=receiver.url, **stored)
        add_deliveries(conn, "cdn", 2)

        report = deliver_due(pool, "run-1", settings)

        assert receiver.request_count == 0
    # Found as the destination's worker starts: it claims nothing, its rows never leave pending.
    assert report.claim.claimed == 0
    (listed,) = list_destinations(conn)
    assert listed["state"] == "disabled"
    assert "outside the range the engine can honour" in listed["disabled_reason"]
    for row in conn.execute("SELECT * FROM webhook_delivery_all").fetchall():
        assert (row["state"], row["budget_used"]) == ("pending", 0)


def test_a_stopped_run_hands_back_what_it_holds_at_once(conn, pool, settings):
    """A canceled run (its stop event set) sends nothing more: what is in flight is recorded,
    every claimed delivery it had not sent is due again, every permit goes back, and it claims
    nothing further, however long its backlog and its destination's limit would have taken."""
    with Receiver() as receiver:
        add_destination(conn, "cdn", url=receiver.url, rate_per_second=2, burst=1)
        add_deliveries(conn, "cdn", 600)
        stop = threading.Event()
        with in_background(lambda: deliver_due(pool, "run-1", settings, stop=stop)) as run:
            wait_for(lambda: receiver.request_count >= 2, "two sends", timeout=30)
            stop.set()
            report = run.result(timeout=10)
    sent = receiver.request_count
    assert report.totals.succeeded == sent
    # One page (250) was claimed; the rest of the backlog was never claimed.
    assert report.claim.claimed == 250
    assert report.totals.deferred == 250 - sent
    assert states(conn) == {"succeeded": sent, "pending": 600 - sent}
    assert rate_limits.in_flight(conn, "cdn") == []
    waiting = conn.execute(
        "SELECT DISTINCT wait_reason FROM webhook_delivery_all WHERE state = 'pending' "
        "AND wait_reason IS NOT NULL"
    ).fetchall()
    assert [r["wait_reason"] for r in waiting] == ["due again: run run-1 was stopped"]


class _AskCountingBudget(RowBudget):
    """A run's row budget that signals the second time a worker asks it for rows."""

    def __init__(self, rows: int) -> None:
        super().__init__(rows)
        self.asks = 0
        self.second_ask = threading.Event()

    def take(self, wanted: int) -> int:
        self.asks += 1
        if self.asks == 2:
            self.second_ask.set()
        return super().take(wanted)


def test_a_worker_asking_while_a_claim_runs_gets_what_that_claim_hands_back(
    conn, pool, monkeypatch
):
    """A run capped at 4 rows: beta's claim reserves all 4 and comes back with its 2 due rows.
    Alpha asks for rows while that claim runs (paused there until alpha has asked): it gets
    the 2 beta hands back, instead of stopping with none and leaving the run 2 short."""
    for name, count in (("alpha", 4), ("beta", 2)):
        add_destination(conn, name, url="http://127.0.0.1:9/" + name)
        add_deliveries(conn, name, count)
    budget = _AskCountingBudget(4)
    beta_claiming = threading.Event()
    claim = claims.claim_destination_page

    def beta_paused_until_alpha_asks(claim_conn, run_id, destination_id, cohort, size):
        if destination_id == "beta":
            beta_claiming.set()
            assert budget.second_ask.wait(15), "alpha never asked for rows"
        return claim(claim_conn, run_id, destination_id, cohort, size)

    monkeypatch.setattr(claims, "claim_destination_page", beta_paused_until_alpha_asks)
    pages = {d: DuePages("run-1", d, Cohort(), 100, budget) for d in ("alpha", "beta")}
    with pool.connection() as beta_conn, pool.connection() as alpha_conn:
        with in_background(lambda: pages["beta"].next_page(beta_conn)) as beta:
            assert beta_claiming.wait(15)
            alpha = pages["alpha"].next_page(alpha_conn)
        assert len(beta.result()) == 2
    assert len(alpha) == 2
    assert budget.take(100) == 0
    leased = conn.execute(
        "SELECT destination_id, count(*) AS n FROM webhook_delivery_all "
        "WHERE state <> 'pending' GROUP BY destination_id ORDER BY destination_id"
    ).fetchall()
    assert [(r["destination_id"], r["n"]) for r in leased] == [("alpha", 2), ("beta", 2)]


def test_a_request_sent_late_pushes_the_next_one_back_instead_of_bunching_with_it(
    conn, pool, settings, monkeypatch
):
    """The destination's envelope holds on the worker's own sends (engine.pacing): the first
    request leaves 0.4 s after its start's moment, so the second, granted for 0.5 s after the
    first's moment, leaves a whole interval after the late one, not 0.1 s after it."""
    sent: list[float] = []
    submit = Sender.submit

    def first_late(self, delivery_id, body):
        if not sent:
            time.sleep(0.4)  # the send is late (what is measured, not a synchronisation)
        sent.append(time.monotonic())
        return submit(self, delivery_id, body)

    monkeypatch.setattr(Sender, "submit", first_late)
    with Receiver() as receiver:
        add_destination(conn, "cdn", url=receiver.url, max_in_flight=2, rate_per_second=2, burst=1)
        add_deliveries(conn, "cdn", 2)

        assert _deliver_in_pages(conn, pool, settings, 2).succeeded == 2

    assert len(sent) == 2 and sent[1] - sent[0] >= 0.5


def _recordings_while_waiting(monkeypatch) -> list[bool]:
    """For each recording statement of a run, whether a start was waiting for its moment."""
    monkeypatch.setattr(rate_limits, "AHEAD_SECONDS", 0.5)
    monkeypatch.setattr(recording, "RECORD_MAX_DELAY_SECONDS", 0.0)  # every outcome due at once
    waiting = threading.Event()
    recorded_while_waiting: list[bool] = []
    wait_for_start, record = DestinationWorker._wait_for_start, DestinationWorker._record

    def noting_wait(worker, start_at):
        waiting.set()
        try:
            return wait_for_start(worker, start_at)
        finally:
            waiting.clear()

    def noting_record(worker):
        recorded_while_waiting.append(waiting.is_set())
        record(worker)

    monkeypatch.setattr(DestinationWorker, "_wait_for_start", noting_wait)
    monkeypatch.setattr(DestinationWorker, "_record", noting_record)
    return recorded_while_waiting


def test_outcomes_due_just_before_a_start_are_recorded_after_its_send(
    conn, pool, settings, monkeypatch
):
    """A statement started just before a start's moment could end after it and make the send
    late: an outcome falling due within RECORD_MARGIN_SECONDS of the start waits for the send.
    One start a second, each answer after 0.95 s: each answer arrives just before the next
    start (or after it, when the send is recorded first anyway)."""
    recorded_while_waiting = _recordings_while_waiting(monkeypatch)
    with Receiver(reply=Reply(delay_seconds=0.95)) as receiver:
        add_destination(conn, "cdn", url=receiver.url, max_in_flight=2, rate_per_second=1, burst=1)
        add_deliveries(conn, "cdn", 3)

        assert _deliver_in_pages(conn, pool, settings, 3).succeeded == 3

    assert recorded_while_waiting and not any(recorded_while_waiting)


def test_outcomes_due_long_before_a_start_are_recorded_while_it_waits(
    conn, pool, settings, monkeypatch
):
    """The wait for a start does not hold outcomes back for long (a slow rate would keep them
    past their leases): one start every 2 s, granted 0.5 s ahead, so the worker waits from
    1.5 s to 2 s after each send for the next; each answer, after 1.6 s, falls due in that wait
    0.4 s before its end."""
    recorded_while_waiting = _recordings_while_waiting(monkeypatch)
    with Receiver(reply=Reply(delay_seconds=1.6)) as receiver:
        add_destination(
            conn, "cdn", url=receiver.url, max_in_flight=2, rate_per_second=0.5, burst=1
        )
        add_deliveries(conn, "cdn", 3)

        assert _deliver_in_pages(conn, pool, settings, 3).succeeded == 3

    assert any(recorded_while_waiting)


def test_a_410_just_before_a_start_is_recorded_at_once_and_stops_the_next_send(
    conn, pool, settings, monkeypatch
):
    """A destination's signal is not held for the send: a 410 answered just before the next
    start's moment disables the destination before that request goes out."""
    _recordings_while_waiting(monkeypatch)
    with Receiver(reply=Reply(status=410, delay_seconds=0.95)) as receiver:
        add_destination(conn, "cdn", url=receiver.url, max_in_flight=2, rate_per_second=1, burst=1)
        add_deliveries(conn, "cdn", 3)

        _deliver_in_pages(conn, pool, settings, 3)
        sent = receiver.request_count

    assert sent == 1
    assert not conn.execute("SELECT enabled FROM webhook_destination").fetchone()["enabled"]
