"""The state machine decided in PostgreSQL (issue 33, part 1: migration 0017).

The runtime hands over each attempt's classified outcome (media_hooks.outbox.leases.Classified); the
database decides the next state, when it is due (backoff and its jitter, Retry-After, a bare
429's pause), the retry budget and maximum age, and what the answer does to the destination.
A Node.js worker runs the same statement, so these tests hold for it too.

The jitter is proven against real PostgreSQL twice: the rule (media_hooks_backoff_seconds_v1
for a given draw equals backoff.py's for the same draw, over every policy hypothesis finds)
and the distribution of what the record schedules (uniform over [0.8 d, min(1.2 d, cap)],
Kolmogorov-Smirnov at the 0.1 % level against the uniform law and against backoff.py's own
samples; the server's random() is seeded, so the run is reproducible).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from media_hooks.core import backoff
from media_hooks.outbox import leases
from media_hooks.outbox.cohort import Cohort
from media_hooks.outbox.leases import Classified, Lease, Message
from media_hooks.store import migrations
from media_hooks_tests.factories import (
    ROOMY,
    add_deliveries,
    add_destination,
    add_dispatches,
    answer,
    claim_all,
    delivery,
    lease_all,
)

# Kolmogorov-Smirnov's c(alpha) at alpha = 0.001.
KS_C = 1.95


def _dispatch(conn, count: int = 1, destination: str = "cdn", **limits) -> list[Message]:
    add_destination(conn, destination, **{**ROOMY, **limits})
    add_deliveries(conn, destination, count)
    claim_all(conn, "run-1", Cohort(destination_ids=(destination,)))
    rows = conn.execute(
        "SELECT message_id, delivery_id FROM dispatch_outbox WHERE destination_id = %s "
        "ORDER BY message_id",
        (destination,),
    ).fetchall()
    return [Message(r["message_id"], r["delivery_id"]) for r in rows]


def _leased(conn, count: int = 1, **limits) -> list[Lease]:
    return lease_all(conn, "run-1", _dispatch(conn, count, **limits))


def _due_in(conn, delivery_id: str) -> float:
    return conn.execute(
        "SELECT extract(epoch FROM next_attempt_at - now()) AS s FROM webhook_delivery_all "
        "WHERE delivery_id = %s",
        (delivery_id,),
    ).fetchone()["s"]


def _destination(conn) -> dict:
    return conn.execute(
        "SELECT enabled, disabled_reason, extract(epoch FROM paused_until - now()) AS paused_for, "
        "paused_reason FROM webhook_destination"
    ).fetchone()


# The contract's table, row by row -----------------------------------------------------------


@pytest.mark.parametrize(
    ("outcome", "status", "state"),
    [("success", 200, "succeeded"), ("rejected", 400, "dead"), ("rejected", 302, "dead")],
)
def test_terminal_answers_end_the_delivery(conn, outcome, status, state):
    (lease,) = _leased(conn)
    recorded = leases.record_classified(conn, [answer(lease, outcome, status)])
    assert recorded == leases.Recorded({lease.delivery_id: state}, None)
    row = delivery(conn, lease.delivery_id)
    assert (row["state"], row["lease_token"], row["wait_reason"]) == (state, None, None)
    attempt = conn.execute(
        "SELECT outcome, http_status, finished_at FROM delivery_attempt_all"
    ).fetchone()
    assert (attempt["outcome"], attempt["http_status"]) == (outcome, status)
    assert attempt["finished_at"] is not None
    assert _destination(conn)["enabled"] is True


@pytest.mark.parametrize(("outcome", "status"), [("retryable", 500), ("ambiguous", None)])
def test_a_failure_is_retried_after_the_jittered_backoff_of_its_attempts(conn, outcome, status):
    (lease,) = _leased(conn, backoff_base_seconds=100, backoff_cap_seconds=10_000)
    recorded = leases.record_classified(conn, [answer(lease, outcome, status)])
    assert recorded.states == {lease.delivery_id: "pending"}
    assert 80 - 1 <= _due_in(conn, lease.delivery_id) <= 120
    row = delivery(conn, lease.delivery_id)
    assert row["budget_used"] == 1
    assert row["wait_reason"].startswith("backoff ")
    assert row["wait_reason"].endswith(f" s after attempt 1 ({outcome})")
    attempt = conn.execute(
        "SELECT next_attempt_at, retry_reason FROM delivery_attempt_all"
    ).fetchone()
    assert attempt["next_attempt_at"] == row["next_attempt_at"]
    assert attempt["retry_reason"] == row["wait_reason"]


def test_the_backoff_doubles_with_each_failed_attempt_up_to_the_cap(conn):
    (message,) = _dispatch(conn, backoff_base_seconds=10, backoff_cap_seconds=30, max_attempts=9)
    bands = [(8, 12), (16, 24), (24, 30), (24, 30)]
    for low, high in bands:
        (lease,) = lease_all(conn, "run-1", [message])
        leases.record_classified(conn, [answer(lease, "retryable", 503)])
        assert low - 1 <= _due_in(conn, message.delivery_id) <= high
        conn.execute("UPDATE webhook_delivery_all SET next_attempt_at = now()")
        claim_all(conn, "run-1", Cohort())
        (message,) = [
            Message(r["current_message_id"], r["delivery_id"])
            for r in conn.execute("SELECT * FROM webhook_delivery_all").fetchall()
        ]


def test_429_with_retry_after_schedules_the_delivery_and_pauses_the_destination(conn):
    (lease,) = _leased(conn)
    leases.record_classified(conn, [answer(lease, "rate_limited", 429, retry_after=120)])
    row = delivery(conn, lease.delivery_id)
    assert (row["state"], row["budget_used"]) == ("pending", 0)
    assert row["wait_reason"] == "Retry-After 120 s (HTTP 429)"
    assert _due_in(conn, lease.delivery_id) == pytest.approx(120, abs=2)
    destination = _destination(conn)
    assert destination["paused_for"] == pytest.approx(120, abs=2)
    assert destination["paused_reason"] == "HTTP 429 with Retry-After 120 s"


def test_retry_after_is_capped_at_an_hour(conn):
    (lease,) = _leased(conn)
    leases.record_classified(conn, [answer(lease, "rate_limited", 503, retry_after=86_400 * 365)])
    assert _due_in(conn, lease.delivery_id) == pytest.approx(3600, abs=2)
    assert _destination(conn)["paused_for"] == pytest.approx(3600, abs=2)
    assert delivery(conn, lease.delivery_id)["wait_reason"] == "Retry-After 3600 s (HTTP 503)"


def test_a_bare_429_pauses_for_the_backoff_base(conn):
    (lease,) = _leased(conn, backoff_base_seconds=45)
    leases.record_classified(conn, [answer(lease, "rate_limited", 429)])
    assert _due_in(conn, lease.delivery_id) == pytest.approx(45, abs=2)
    destination = _destination(conn)
    assert destination["paused_for"] == pytest.approx(45, abs=2)
    assert destination["paused_reason"] == "HTTP 429 without Retry-After: 45 s"
    assert delivery(conn, lease.delivery_id)["wait_reason"] == (
        "rate limited (HTTP 429, no Retry-After): 45 s"
    )


def test_retry_after_zero_is_due_now_without_a_pause(conn):
    (lease,) = _leased(conn)
    leases.record_classified(conn, [answer(lease, "rate_limited", 429, retry_after=0)])
    assert _due_in(conn, lease.delivery_id) == pytest.approx(0, abs=2)
    assert _destination(conn)["paused_for"] is None


def test_a_batch_pauses_for_its_longest_wait(conn):
    taken = _leased(conn, 3, backoff_base_seconds=50)
    leases.record_classified(
        conn,
        [
            answer(taken[0], "rate_limited", 429, retry_after=20),
            answer(taken[1], "rate_limited", 429),
            answer(taken[2], "success", 200),
        ],
    )
    destination = _destination(conn)
    assert destination["paused_for"] == pytest.approx(50, abs=2)
    assert destination["paused_reason"] == "HTTP 429 without Retry-After: 50 s"


def test_410_kills_the_delivery_and_disables_the_destination(conn):
    first, second = _leased(conn, 2)
    recorded = leases.record_classified(conn, [answer(first, "rejected", 410)])
    assert recorded.states == {first.delivery_id: "dead"}
    assert recorded.stopped.startswith("receiver answered HTTP 410 (Gone) at ")
    assert recorded.stopped.endswith(" UTC")
    destination = _destination(conn)
    assert (destination["enabled"], destination["disabled_reason"]) == (False, recorded.stopped)
    # Already disabled: a later 410 says so again, and keeps the first reason.
    conn.execute("UPDATE webhook_destination SET disabled_reason = 'operator: maintenance'")
    again = leases.record_classified(conn, [answer(second, "rejected", 410)])
    assert again.stopped == "operator: maintenance"
    assert _destination(conn)["disabled_reason"] == "operator: maintenance"


def test_an_address_the_guard_refused_disables_the_destination_and_spares_the_delivery(conn):
    (lease,) = _leased(conn, max_attempts=1)
    error = "refused by the SSRF guard: connecting to x: 127.0.0.1 is in 127.0.0.0/8 (loopback)"
    recorded = leases.record_classified(
        conn, [answer(lease, "retryable", None, configuration_fault=True, error=error)]
    )
    assert recorded.states == {lease.delivery_id: "pending"}
    assert recorded.stopped == (
        f"configuration: {error} (at connect time; MEDIA_HOOKS_ALLOW_PRIVATE_URLS=1 in the "
        "workers' environment allows private addresses); enable it once the URL or the "
        "setting is fixed"
    )
    row = delivery(conn, lease.delivery_id)
    assert (row["state"], row["budget_used"]) == ("pending", 0)
    assert row["wait_reason"].startswith("waiting: destination cdn is disabled")
    assert _due_in(conn, lease.delivery_id) == pytest.approx(0, abs=2)
    assert _destination(conn)["enabled"] is False


def test_an_attempt_never_started_is_due_now_with_its_budget_given_back(conn):
    (lease,) = _leased(conn, max_attempts=1)
    recorded = leases.record_classified(
        conn, [answer(lease, "retryable", None, attempted=False, error="not sent: stopped")]
    )
    assert recorded == leases.Recorded({lease.delivery_id: "pending"}, None)
    row = delivery(conn, lease.delivery_id)
    assert (row["budget_used"], row["wait_reason"]) == (
        0,
        "due again: its worker stopped before sending it",
    )
    assert _due_in(conn, lease.delivery_id) == pytest.approx(0, abs=2)
    assert _destination(conn)["enabled"] is True


def test_the_retry_budget_ends_in_dead_but_rate_limits_do_not_spend_it(conn):
    (message,) = _dispatch(conn, max_attempts=2)
    answers = [("rate_limited", 429, "pending")] * 3 + [
        ("retryable", 500, "pending"),
        ("retryable", 500, "dead"),
    ]
    for outcome, status, state in answers:
        (lease,) = lease_all(conn, "run-1", [message])
        classified = answer(lease, outcome, status, retry_after=0 if status == 429 else None)
        assert leases.record_classified(conn, [classified]).states == {message.delivery_id: state}
        conn.execute(
            "UPDATE webhook_delivery_all SET next_attempt_at = now() WHERE state = 'pending'"
        )
    row = delivery(conn, message.delivery_id)
    assert (row["attempt_count"], row["wait_reason"]) == (
        5,
        "dead: retry budget spent (2 attempts)",
    )


def test_the_maximum_age_ends_even_a_rate_limited_delivery(conn):
    (lease,) = _leased(conn, max_age_seconds=60)
    conn.execute("UPDATE webhook_delivery_all SET budget_started_at = now() - interval '2 minutes'")
    recorded = leases.record_classified(conn, [answer(lease, "rate_limited", 429, retry_after=5)])
    assert recorded.states == {lease.delivery_id: "dead"}
    assert delivery(conn, lease.delivery_id)["wait_reason"].startswith(
        "dead: older than the maximum delivery age"
    )


def test_a_late_worker_records_nothing_but_its_answer_still_pauses(conn):
    """Invariant 4: a worker whose lease expired and was taken over moves nothing; the 429 it
    got is still the receiver's word about the destination."""
    (message,) = _dispatch(conn)
    (late,) = lease_all(conn, "run-1", [message])
    conn.execute("UPDATE webhook_delivery_all SET lease_until = now() - interval '1 second'")
    (current,) = lease_all(conn, "run-2", [message])
    recorded = leases.record_classified(conn, [answer(late, "rate_limited", 429, retry_after=30)])
    assert recorded.states == {}
    row = delivery(conn, message.delivery_id)
    assert (row["state"], row["lease_token"]) == ("leased", current.lease_token)
    assert _destination(conn)["paused_for"] == pytest.approx(30, abs=2)


@pytest.mark.parametrize(
    ("stored", "low", "high"),
    [(1e300, 0.8 * 2_592_000 - 1, 2_592_000), (1e-300, 0.0, 0.2)],
    ids=["huge", "tiny"],
)
def test_settings_stored_beyond_what_the_engine_honours_are_taken_within_it(
    conn, stored, low, high
):
    """A base and cap stored by hand (or changed under a running worker) outside what
    `destination add` accepts neither overflow a due time nor underflow the arithmetic."""
    (lease,) = _leased(conn, backoff_base_seconds=stored, backoff_cap_seconds=stored)
    leases.record_classified(conn, [answer(lease, "retryable", 500)])
    assert low <= _due_in(conn, lease.delivery_id) <= high


def test_an_unknown_outcome_class_is_refused_and_nothing_moves(conn):
    (lease,) = _leased(conn)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="unknown outcome class"):
        leases.record_classified(conn, [answer(lease, "maybe", 200)])
    assert delivery(conn, lease.delivery_id)["state"] == "leased"


# The jitter: the rule, then the distribution --------------------------------------------------


class _Draw(random.Random):
    """A generator whose every draw is ``draw``: backoff.py's wait for that draw."""

    def __init__(self, draw: float) -> None:
        super().__init__()
        self.draw = draw

    def random(self) -> float:
        return self.draw


# The policies the engine honours (destinations.RANGES), and the draws random() makes.
POLICIES = st.tuples(
    st.floats(0.1, 86400, allow_nan=False), st.floats(0.1, 30 * 86400, allow_nan=False)
).map(lambda bc: (min(bc), max(bc)))
DRAWS = st.integers(0, 2**52 - 1).map(lambda k: k / 2**52)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    policy=POLICIES,
    attempt=st.integers(1, 10**6),
    draw=DRAWS,
)
def test_the_sql_backoff_is_backoff_py_for_the_same_draw(conn, policy, attempt, draw):
    """The rule, for any draw: the database's wait is backoff.py's (one connection serves
    every example: the function only reads its arguments)."""
    base, cap = policy
    sql_wait = conn.execute(
        "SELECT media_hooks_backoff_seconds_v1(%s, %s, %s, %s) AS wait", (attempt, base, cap, draw)
    ).fetchone()["wait"]
    python_wait = backoff.backoff_seconds(attempt, base, cap, _Draw(draw))
    assert sql_wait == pytest.approx(python_wait, rel=1e-12, abs=1e-9)
    nominal = backoff.nominal_seconds(attempt, base, cap)
    assert 0.8 * nominal * (1 - 1e-12) <= sql_wait <= min(1.2 * nominal, cap) * (1 + 1e-12)


def _ks_uniform(samples: list[float], low: float, high: float) -> float:
    """The Kolmogorov-Smirnov distance of ``samples`` from the uniform law on [low, high]."""
    ordered = sorted(samples)
    n = len(ordered)
    return max(
        max((i + 1) / n - (x - low) / (high - low), (x - low) / (high - low) - i / n)
        for i, x in enumerate(ordered)
    )


def _ks_two_samples(a: list[float], b: list[float]) -> float:
    points = sorted(set(a) | set(b))
    sa, sb = sorted(a), sorted(b)
    distance, i, j = 0.0, 0, 0
    for x in points:
        while i < len(sa) and sa[i] <= x:
            i += 1
        while j < len(sb) and sb[j] <= x:
            j += 1
        distance = max(distance, abs(i / len(sa) - j / len(sb)))
    return distance


@pytest.mark.parametrize(
    ("attempt", "base", "cap"),
    [(1, 10.0, 1000.0), (3, 10.0, 1000.0), (4, 10.0, 90.0)],
    ids=["first", "third", "capped-band"],
)
def test_the_record_schedules_retries_uniformly_over_the_jitter_band(conn, attempt, base, cap):
    """What the record itself schedules, over 400 deliveries failing their ``attempt``-th
    attempt: inside [0.8 d, min(1.2 d, cap)], and uniform there (the capped band is narrower
    than 0.4 d), like backoff.py's draws."""
    count = 400
    taken = _leased(conn, count, backoff_base_seconds=base, backoff_cap_seconds=cap)
    conn.execute("UPDATE webhook_delivery_all SET budget_used = %s", (attempt,))
    conn.execute("SELECT setseed(0.33)")
    leases.record_classified(conn, [answer(lease, "retryable", 500) for lease in taken])
    rows = conn.execute("SELECT next_attempt_at, updated_at FROM webhook_delivery_all").fetchall()
    # One statement: every row's now() is its updated_at, so the waits are exact differences.
    (stamp,) = {r["updated_at"] for r in rows}
    waits = [(r["next_attempt_at"] - stamp).total_seconds() for r in rows]
    assert len(waits) == count
    nominal = backoff.nominal_seconds(attempt, base, cap)
    low, high = 0.8 * nominal, min(1.2 * nominal, cap)
    assert low - 1e-5 <= min(waits) and max(waits) <= high + 1e-5
    critical = KS_C / math.sqrt(count)
    assert _ks_uniform(waits, low, high) < critical
    rng = random.Random(11)
    reference = [backoff.backoff_seconds(attempt, base, cap, rng) for _ in range(count)]
    assert _ks_two_samples(waits, reference) < KS_C * math.sqrt(2 / count)


def test_a_skewed_schedule_would_be_caught(conn):
    """The distribution test has teeth: waits drawn from the band's lower half are refused."""
    rng = random.Random(5)
    skewed = [rng.uniform(8, 10) for _ in range(400)]
    assert _ks_uniform(skewed, 8, 12) >= KS_C / math.sqrt(400)


# The previous release beside this one -------------------------------------------------------

# The previous release's recording statement (record_classified_outcomes before migration
# 0034), as its workers run it while an upgrade rolls out.
PREVIOUS_RECORDING = (
    "SELECT delivery_id, state, stopped FROM media_hooks_record_outcomes_v1(%(outcomes)s::jsonb)"
)
PREVIOUS_RELEASE = {
    # case: (answer, the reason both releases give the delivery's wait)
    "success": (("success", 200, None), None),
    "rejected": (("rejected", 400, None), None),
    "retry-after": (("rate_limited", 429, 120.0), "Retry-After 120 s (HTTP 429)"),
    "bare-429": (("rate_limited", 429, None), "rate limited (HTTP 429, no Retry-After): 5 s"),
}


@pytest.fixture
def overlap(empty_database_url: str) -> Iterator[psycopg.Connection]:
    """The schema both releases run on while an upgrade rolls out: up to the expand (0034),
    before the contract migration (0035) puts both layouts under the contract's names."""
    with psycopg.connect(empty_database_url, autocommit=True, row_factory=dict_row) as conn:
        migrations.migrate(conn, up_to=34)
        yield conn


def _record_as_previous_release(conn, classified: Classified) -> None:
    """The previous release's worker recording one outcome: the document it sends."""
    document = {
        "delivery_id": classified.lease.delivery_id,
        "lease_token": str(classified.lease.lease_token),
        "outcome": classified.outcome,
        "http_status": classified.http_status,
        "retry_after": classified.retry_after_seconds,
        "error": classified.error,
        "excerpt": classified.response_excerpt,
        "finished_ago": 0.0,
        "attempted": classified.attempted,
        "configuration_fault": classified.configuration_fault,
    }
    conn.execute(PREVIOUS_RECORDING, {"outcomes": Jsonb([document])})


@pytest.mark.parametrize("case", sorted(PREVIOUS_RELEASE))
def test_this_release_records_as_the_previous_release_did(overlap, case):
    """Workers of both releases run side by side during an upgrade: from the same leased
    state, the previous release's recording (media_hooks_record_outcomes_v1) of its own
    layout's delivery and this release's (media_hooks_record_outcomes_v2) of this layout's
    decide the same delivery and attempt, as every reader sees them (webhook_delivery_all,
    delivery_attempt_all)."""
    conn = overlap
    (outcome, status, retry_after), reason = PREVIOUS_RELEASE[case]
    add_destination(conn, "cdn", **ROOMY)
    (previous_id,) = add_deliveries(conn, "cdn", 1, state="enqueued", previous_release=True)
    add_dispatches(conn, [previous_id], run_id="run-1", previous_release=True)
    add_deliveries(conn, "cdn", 1)
    claim_all(conn, "run-1", Cohort())
    messages = [
        Message(r["message_id"], r["delivery_id"])
        for r in conn.execute("SELECT message_id, delivery_id FROM dispatch_outbox").fetchall()
    ]
    taken = {lease.delivery_id: lease for lease in lease_all(conn, "run-1", messages)}
    previous = taken.pop(previous_id)
    (current,) = taken.values()

    def after(record, lease: Lease) -> dict:
        with conn.transaction(force_rollback=True):
            record(conn, answer(lease, outcome, status, retry_after=retry_after))
            row = delivery(conn, lease.delivery_id)
            attempt = conn.execute(
                "SELECT * FROM delivery_attempt_all WHERE delivery_id = %s", (lease.delivery_id,)
            ).fetchone()
            due = _due_in(conn, lease.delivery_id) if row["state"] == "pending" else None
            kept = ("state", "budget_used", "last_outcome", "last_error", "wait_reason")
            return {
                "delivery": {k: row[k] for k in (*kept, "lease_token")},
                "attempt": {
                    k: attempt[k]
                    for k in ("attempt_no", "outcome", "http_status", "error", "retry_reason")
                },
                "ended": attempt["finished_at"] is not None,
                "due": due,
            }

    before = after(_record_as_previous_release, previous)
    now = after(lambda c, classified: leases.record_classified(c, [classified]), current)
    assert before["delivery"]["wait_reason"] == reason and before["ended"]
    assert {k: v for k, v in now.items() if k != "due"} == {
        k: v for k, v in before.items() if k != "due"
    }
    if before["due"] is not None:
        assert now["due"] == pytest.approx(before["due"], abs=1)
