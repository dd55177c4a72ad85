"""Global per-destination rate limits (issue 3, item 7), on real PostgreSQL and real processes.

The ceilings proved here: request starts in any window of length t never exceed
``burst + rate * t``; requests in flight never exceed ``max_in_flight``; a pause stops every
process until ``paused_until``; a disabled destination grants nothing; a dead holder's slots
come back after their hold expires.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from media_hooks.core.errors import UserError
from media_hooks.outbox import rate_limits
from media_hooks.outbox.rate_limits import acquire, pause_destination, release, wait_for_permits
from media_hooks_tests.conftest import REPO
from media_hooks_tests.factories import add_destination
from media_hooks_tests.interleaving import (
    in_background,
    open_session,
    wait_for,
    wait_until_blocked,
)

DEST = "publisher-a"


@pytest.fixture
def limited(conn: psycopg.Connection) -> psycopg.Connection:
    """The issue's destination: 20 starts/s, burst 5, 3 in flight."""
    add_destination(conn, DEST, rate_per_second=20, burst=5, max_in_flight=3)
    return conn


SET_LIMITS = """
UPDATE webhook_destination
   SET rate_per_second = coalesce(%(rate_per_second)s, rate_per_second),
       burst = coalesce(%(burst)s, burst),
       max_in_flight = coalesce(%(max_in_flight)s, max_in_flight),
       enabled = coalesce(%(enabled)s, enabled)
 WHERE destination_id = %(destination_id)s
"""


def _set_limits(
    conn: psycopg.Connection,
    rate_per_second: float | None = None,
    burst: int | None = None,
    max_in_flight: int | None = None,
    enabled: bool | None = None,
) -> None:
    """Change the destination's limits as an operator would (`destination add` on an existing id)."""
    conn.execute(
        SET_LIMITS,
        {
            "destination_id": DEST,
            "rate_per_second": rate_per_second,
            "burst": burst,
            "max_in_flight": max_in_flight,
            "enabled": enabled,
        },
    )


# --- worker processes ----------------------------------------------------------------------


class Worker:
    """A real process (media_hooks_tests/rate_limit_worker.py) and the JSON lines it printed."""

    def __init__(self, url: str, mode: str, name: str, *extra: str) -> None:
        self.name = name
        self.records: list[dict] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "media_hooks_tests.rate_limit_worker", mode, "--url", url]
            + ["--destination", DEST, "--name", name, *extra],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.records.append(json.loads(line))

    def stop(self, timeout: float = 10) -> None:
        """Close stdin (the worker's stop signal) and wait for it to finish cleanly."""
        self.proc.stdin.close()
        self.proc.wait(timeout=timeout)
        self._reader.join(timeout=timeout)
        assert self.proc.returncode == 0, self.proc.stderr.read()

    def kill(self) -> None:
        self.proc.kill()  # SIGKILL: no cleanup, no release
        self.proc.wait(timeout=10)


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        if worker.proc.poll() is None:
            worker.kill()


def _max_overlap(records: list[dict]) -> int:
    """Most slots held at one instant, from the intervals each slot was surely held."""
    events = sorted(
        [(r["held_from"], 1) for r in records] + [(r["held_to"], -1) for r in records],
        key=lambda e: (e[0], e[1]),  # a release at the same instant counts first
    )
    current = peak = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


def _worst_window_excess(starts: list[float], rate: float, burst: int) -> float:
    """max over every window [t_i, t_j] of (starts in it) - (burst + rate * (t_j - t_i))."""
    starts = sorted(starts)
    return max(
        (j - i + 1) - (burst + rate * (starts[j] - starts[i]))
        for i in range(len(starts))
        for j in range(i, len(starts))
    )


# --- the ceilings, across two real processes ------------------------------------------------


def test_two_processes_never_exceed_start_rate_or_in_flight_ceiling(limited, database_url, workers):
    # Three threads per process, each holding its slot 100 ms: six would-be senders for three
    # slots, so the in-flight ceiling binds at the start and the start rate binds after.
    for name in ("p1", "p2"):
        workers.append(Worker(database_url, "send", name, "--seconds", "2", "--hold-ms", "100"))
    for worker in workers:
        worker.proc.wait(timeout=15)
        worker.stop()

    records = [r for worker in workers for r in worker.records]
    starts = [r["granted_at"] for r in records]
    assert {r["process"] for r in records} == {"p1", "p2"}
    assert _worst_window_excess(starts, rate=20, burst=5) <= 1e-6
    # The limiter let through about what it allows, not a trickle that passes trivially.
    span = max(starts) - min(starts)
    assert len(starts) >= 0.8 * (5 + 20 * span)
    assert _max_overlap(records) == 3


def test_pause_stops_both_processes_until_paused_until(limited, database_url, workers):
    for name in ("p1", "p2"):
        workers.append(Worker(database_url, "send", name, "--hold-ms", "5"))
    wait_for(lambda: all(w.records for w in workers), "both workers to get a permit", 10)

    paused_until = pause_destination(limited, DEST, 2.0, "429 Too Many Requests").timestamp()
    paused_from = paused_until - 2.0
    wait_for(
        lambda: all(any(r["granted_at"] >= paused_until for r in w.records) for w in workers),
        "both workers to get a permit after the pause",
        5,
    )
    for worker in workers:
        worker.stop()

    starts = [r["granted_at"] for w in workers for r in w.records]
    during = [t for t in starts if paused_from <= t < paused_until]
    assert during == []
    assert any(t < paused_from for t in starts)


def test_slots_of_a_killed_holder_come_back_after_their_hold(limited, database_url, workers):
    _set_limits(limited, rate_per_second=1000, burst=10)
    dead = Worker(database_url, "hold", "doomed", "--want", "2", "--hold-seconds", "1.0")
    workers.append(dead)
    wait_for(lambda: dead.records, "the holder to take its slots", 10)
    dead.kill()
    held = dead.records[0]

    first = acquire(limited, DEST, 3, "survivor", 30)
    assert len(first.slots) == 1
    assert first.reason == "in flight"

    later = wait_for_permits(limited, DEST, 2, "survivor", 30, deadline=time.monotonic() + 4)
    assert sorted(later.slots) == sorted(held["slots"])
    assert later.granted_at.timestamp() >= held["held_until"]


# --- one process, the rules one by one -------------------------------------------------------


def test_a_batch_is_capped_by_slots_then_by_rate_tokens(limited):
    # One start a second refills: nothing refills between these calls, however slow the host.
    _set_limits(limited, rate_per_second=1)
    first = acquire(limited, DEST, 10, "h", 30)
    assert first.slots == [1, 2, 3]
    assert first.reason == "in flight"
    assert 0 < first.retry_in <= rate_limits.SLOT_POLL_SECONDS

    assert release(limited, DEST, first.slots, "h") == 3
    second = acquire(limited, DEST, 10, "h", 30)
    # Five starts of burst, three spent: two left; the next in about a second.
    assert len(second.slots) == 2
    assert second.reason == "rate"
    assert 0.5 < second.retry_in <= 1.0


def test_a_token_is_never_spent_without_a_slot(limited):
    _set_limits(limited, max_in_flight=1, rate_per_second=0.1)
    held = acquire(limited, DEST, 1, "h", 30)
    assert held.slots == [1]
    for _ in range(10):
        refused = acquire(limited, DEST, 1, "h", 30)
        assert refused.slots == [] and refused.reason == "in flight"
    release(limited, DEST, held.slots, "h")
    _set_limits(limited, max_in_flight=5)
    # One token was spent by the one grant; the ten refusals spent none.
    assert len(acquire(limited, DEST, 5, "h", 30).slots) == 4


def test_lowering_max_in_flight_grants_fewer_until_holds_drain(limited):
    held = acquire(limited, DEST, 3, "h", 30)
    assert held.slots == [1, 2, 3]
    _set_limits(limited, max_in_flight=2, rate_per_second=1000)

    release(limited, DEST, [1], "h")
    assert acquire(limited, DEST, 1, "other", 30).slots == []  # two still in flight
    release(limited, DEST, [3], "h")
    assert acquire(limited, DEST, 2, "other", 30).slots == [1]  # slot 3 is above the ceiling

    _set_limits(limited, max_in_flight=5)
    assert acquire(limited, DEST, 5, "other", 30).slots == [3, 4, 5]


def test_release_frees_only_the_holders_own_slots(limited):
    grant = acquire(limited, DEST, 2, "a", 30)
    assert release(limited, DEST, grant.slots, "b") == 0
    assert [row["mine"] for row in rate_limits.in_flight(limited, DEST, "a")] == [True, True]
    assert [row["mine"] for row in rate_limits.in_flight(limited, DEST, "b")] == [False, False]
    assert release(limited, DEST, grant.slots, "a") == 2
    assert rate_limits.in_flight(limited, DEST) == []
    assert release(limited, DEST, [], "a") == 0


def test_a_grant_takes_the_holders_finished_slots_back_first(limited):
    """A worker's step: its finished requests' slots come back in the same call, and count."""
    _set_limits(limited, max_in_flight=2)
    held = acquire(limited, DEST, 2, "a", 30).slots
    other = acquire(limited, DEST, 1, "b", 30, release_slots=held)  # not b's to give back
    assert other.slots == [] and other.reason == "in flight"
    again = acquire(limited, DEST, 2, "a", 30, release_slots=held)
    assert again.slots == [1, 2]
    assert [row["mine"] for row in rate_limits.in_flight(limited, DEST, "a")] == [True, True]


@pytest.mark.parametrize("why", ["paused", "disabled"])
def test_slots_given_back_while_refused_are_freed_all_the_same(limited, why):
    held = acquire(limited, DEST, 2, "a", 30).slots
    if why == "paused":
        pause_destination(limited, DEST, 30, "429")
    else:
        _set_limits(limited, enabled=False)
    grant = acquire(limited, DEST, 1, "a", 30, release_slots=held)
    assert grant.slots == [] and grant.reason.startswith(why)
    assert rate_limits.in_flight(limited, DEST) == []


def test_a_disabled_destination_grants_nothing(limited):
    _set_limits(limited, enabled=False)
    grant = acquire(limited, DEST, 3, "h", 30)
    assert grant.slots == [] and grant.reason == "disabled"
    slept: list[float] = []
    waited = wait_for_permits(limited, DEST, 1, "h", 30, time.monotonic() + 5, slept.append)
    assert waited.slots == [] and slept == []
    assert rate_limits.in_flight(limited, DEST) == []


def test_a_pause_refuses_with_its_reason_and_keeps_the_longer_pause(limited):
    until = pause_destination(limited, DEST, 30, "503 with Retry-After: 30")
    grant = acquire(limited, DEST, 1, "h", 30)
    assert grant.slots == []
    assert grant.reason.startswith("paused until ") and "(503 with Retry-After: 30)" in grant.reason
    assert 29 < grant.retry_in <= 30

    assert pause_destination(limited, DEST, 2, "429") == until
    longer = pause_destination(limited, DEST, 60, "429 Retry-After: 60")
    assert longer - until > timedelta(seconds=29)
    assert "(429 Retry-After: 60)" in acquire(limited, DEST, 1, "h", 30).reason


# --- starts granted ahead (migration 0014) ----------------------------------------------------

GRANT_V2 = """
SELECT * FROM media_hooks_acquire_permits_v2(%(destination_id)s, 1, %(holder)s, 30, 0.02, 1.0,
                                             %(ahead)s)
"""


def _seconds_between(earlier: dict, later: dict) -> float:
    return (later["granted_at"] - earlier["granted_at"]).total_seconds()


def test_a_start_granted_ahead_is_for_the_exact_moment_the_bucket_allows(limited, database_url):
    """One start every 2 s, no stored credit (burst 1), starts granted up to 1.5 s ahead. A is
    granted the one start of the drained bucket, at once (counted half the horizon, 0.75 s,
    later), and keeps the limiter row locked; B asks meanwhile and waits on the row; A commits
    1.3 s after its grant. B is then granted the next start ahead, for exactly one interval
    after A's as counted: not earlier (the ceiling), not later (nothing of the rate is lost to
    B's late ask). The next ask sees B's start and keeps its distance from it."""
    _set_limits(limited, rate_per_second=0.5, burst=1)
    with open_session(database_url) as a, open_session(database_url, autocommit=True) as b:
        first = a.execute(
            GRANT_V2, {"destination_id": DEST, "holder": "a", "ahead": 1.5}
        ).fetchone()
        assert (len(first["slots"]), first["starts"]) == (1, [0.0])
        with in_background(
            lambda: b.execute(
                GRANT_V2, {"destination_id": DEST, "holder": "b", "ahead": 1.5}
            ).fetchone()
        ) as asked:
            wait_until_blocked(limited, b.info.backend_pid)
            a.execute("SELECT pg_sleep(1.3)")
            a.commit()
        second = asked.result()

    since = _seconds_between(first, second)
    assert 1.3 <= since < 2.75  # B asked within the horizon of the next start, before it
    assert len(second["slots"]) == 1
    assert second["starts"][0] == pytest.approx(0.75 + 2.0 - since, abs=1e-6)

    after = limited.execute(
        GRANT_V2, {"destination_id": DEST, "holder": "c", "ahead": 1.5}
    ).fetchone()
    assert (after["slots"], after["reason"]) == ([], "rate")
    # The start after B's is due 4.75 s after A's grant; worth asking for once 1.5 s away.
    assert after["retry_in"] == pytest.approx(3.25 - _seconds_between(first, after), abs=1e-6)


def test_at_most_one_start_is_granted_ahead(limited):
    # One start a second, a burst of 3; the horizon is capped at one interval (1 s).
    _set_limits(limited, rate_per_second=1, burst=3, max_in_flight=10)
    first = acquire(limited, DEST, 6, "h", 30, ahead_seconds=10)
    # The burst at once, counted from half the horizon on: the 4th start is due 1.5 s after
    # the grant, and worth asking for from 0.5 s on.
    assert (first.slots, first.start_in) == ([1, 2, 3], [0.0, 0.0, 0.0])
    assert (first.reason, first.retry_in) == ("rate", pytest.approx(0.5, abs=1e-9))

    deadline = time.monotonic() + 10
    second = acquire(limited, DEST, 5, "h", 30, ahead_seconds=10)
    while not second.slots and time.monotonic() < deadline:
        time.sleep(0.01)
        second = acquire(limited, DEST, 5, "h", 30, ahead_seconds=10)
    since = (second.granted_at - first.granted_at).total_seconds()
    assert 0.5 <= since < 1.5
    # One start only, for its exact moment; the 5th is due a second later, out of the horizon.
    assert second.slots == [4]
    assert second.start_in == [pytest.approx(1.5 - since, abs=1e-6)]
    assert (second.reason, second.retry_in) == ("rate", pytest.approx(1.5 - since, abs=1e-6))


def test_the_database_clock_is_mapped_by_the_fastest_recent_answer():
    """A start granted for a moment on the database's clock is sent at that moment here: by the
    answer that arrived soonest after the database read its clock (the others were slowed on
    the way), and only among the recent ones, so a stepped clock is followed."""
    clock = rate_limits.DatabaseClock()
    read = datetime(2026, 1, 1, tzinfo=UTC)
    clock.observe(read, arrived=100.030)  # 30 ms on the way
    clock.observe(read + timedelta(seconds=1), arrived=101.002)  # 2 ms: the closest
    clock.observe(read + timedelta(seconds=2), arrived=102.040)
    moment = read + timedelta(seconds=2.5)
    assert clock.monotonic_at(moment) == pytest.approx(100.002 + 2.5, abs=1e-6)
    # Beyond the window the 2 ms answer is forgotten; the least since then counts.
    later = read + timedelta(seconds=12)
    clock.observe(later, arrived=112.010)
    assert clock.monotonic_at(later) == pytest.approx(112.010, abs=1e-6)


def test_a_calibrated_clock_maps_the_databases_moments_never_early(conn):
    clock = rate_limits.DatabaseClock()
    clock.calibrate(conn)
    before = time.monotonic()
    (read,) = conn.execute("SELECT clock_timestamp() AS now").fetchone().values()
    after = time.monotonic()
    # The database read its clock between before and after; mapped, it is never earlier.
    assert before <= clock.monotonic_at(read) <= after + 0.05


def test_without_ahead_every_start_is_at_once(limited):
    grant = acquire(limited, DEST, 3, "h", 30)
    assert grant.start_in == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="ahead_seconds"):
        acquire(limited, DEST, 1, "h", 30, ahead_seconds=-0.1)


def test_wait_for_permits_waits_for_the_next_token(limited):
    _set_limits(limited, burst=1, rate_per_second=10)
    first = acquire(limited, DEST, 1, "h", 30)
    second = wait_for_permits(limited, DEST, 1, "h", 30, deadline=time.monotonic() + 2)
    assert len(second.slots) == 1
    assert (second.granted_at - first.granted_at).total_seconds() >= 0.1 - 1e-6


def test_wait_for_permits_gives_up_at_once_when_the_pause_outlasts_the_deadline(limited):
    pause_destination(limited, DEST, 10, "429")
    slept: list[float] = []
    started = time.monotonic()
    grant = wait_for_permits(limited, DEST, 1, "h", 30, started + 1, slept.append)
    assert grant.slots == [] and grant.reason.startswith("paused until")
    assert slept == [] and time.monotonic() - started < 0.5


def test_waiting_holds_no_transaction_and_no_lock(limited, database_url):
    held = acquire(limited, DEST, 3, "h", 30)
    observed: list[str] = []

    def sleep(seconds: float) -> None:
        # While the waiter sleeps, another session can lock the limiter row at once.
        with psycopg.connect(database_url, autocommit=True) as other:
            other.execute("SET lock_timeout = '100ms'")
            with other.transaction():
                other.execute(
                    "SELECT 1 FROM destination_limiter WHERE destination_id = %s FOR UPDATE",
                    (DEST,),
                )
        observed.append("unlocked")
        if len(observed) == 2:
            release(limited, DEST, held.slots[:1], "h")
        time.sleep(seconds)

    with ConnectionPool(database_url, min_size=1, max_size=1) as pool:
        grant = wait_for_permits(pool, DEST, 1, "w", 30, time.monotonic() + 3, sleep)
        assert pool.get_stats()["pool_available"] == 1
    assert grant.slots == [1]
    assert observed == ["unlocked", "unlocked"]


def test_acquire_refuses_a_connection_inside_a_transaction(limited):
    with limited.transaction(), pytest.raises(ValueError, match="outside any transaction"):
        acquire(limited, DEST, 1, "h", 30)


def test_unknown_destination_and_bad_arguments(limited):
    with pytest.raises(UserError, match="unknown destination 'nope'"):
        acquire(limited, "nope", 1, "h", 30)
    with pytest.raises(UserError, match="unknown destination"):
        pause_destination(limited, "nope", 1, "429")
    with pytest.raises(ValueError):
        acquire(limited, DEST, 0, "h", 30)
    with pytest.raises(ValueError):
        acquire(limited, DEST, 1, "", 30)
    with pytest.raises(ValueError):
        acquire(limited, DEST, 1, "h", 0)
    with pytest.raises(ValueError):
        pause_destination(limited, DEST, 0, "429")


def test_a_connection_outside_autocommit_is_committed_after_each_call(limited, database_url):
    with psycopg.connect(database_url) as plain:
        grant = acquire(plain, DEST, 2, "h", 30)
        assert plain.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        # Visible to another session at once, and the limiter row is not left locked.
        assert [row["mine"] for row in rate_limits.in_flight(limited, DEST, "h")] == [True, True]
        assert len(acquire(limited, DEST, 1, "other", 30).slots) == 1
        assert release(plain, DEST, grant.slots, "h") == 2
        assert plain.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert [row["mine"] for row in rate_limits.in_flight(limited, DEST, "other")] == [True]


def test_release_refuses_a_connection_inside_a_transaction(limited):
    grant = acquire(limited, DEST, 1, "h", 30)
    with limited.transaction():
        with pytest.raises(ValueError, match="outside any transaction"):
            release(limited, DEST, grant.slots, "h")
    assert release(limited, DEST, grant.slots, "h") == 1
