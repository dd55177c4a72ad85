"""Global per-destination rate limits, kept in PostgreSQL (docs/architecture.md).

Two ceilings hold across every process and run at once:

- start rate: request starts to a destination in any window of length t never exceed
  ``burst + rate_per_second * t`` (a leaky bucket of starts, on the database clock);
- in flight: requests in flight never exceed ``max_in_flight`` (numbered slots; a slot is held
  until released or until ``hold_seconds`` pass, so a process that dies frees its slots).

A permit is one slot plus one start, granted together: a start is never spent without a slot.
One ``acquire`` grants up to ``want`` permits in one round trip, so a sender can take a batch.
A paused (429, 503 with Retry-After) or disabled destination grants nothing to anyone.

A start may be granted a little ahead of its moment (``ahead_seconds``, at most one interval of
the rate: one start at most is ever promised ahead), and then says when its request may start
(``Grant.start_at``, on the database's clock; ``DatabaseClock`` maps it onto this process's).
The bucket's timeline is then exact: a sender that asks a little early and starts at that
moment loses none of the rate to its own wake-up and round trip, which a burst of 1 (no stored
credit) would otherwise lose for good, and the receiver still sees at most ``burst + rate * t``
(migration 0014).

Both ceilings of a destination live on its one limiter row (migration 0002): every grant,
release and pause serializes on it for one short statement. So ``acquire`` and ``release``
refuse a connection inside a transaction: the row would stay locked for every other process
until that transaction ended.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import psycopg
from psycopg import errors, pq
from psycopg.rows import dict_row, tuple_row
from psycopg_pool import ConnectionPool

from media_hooks.core.errors import UserError
from media_hooks.store.sqlfiles import query

# When only slots are short, how soon asking again is worth it: releases are not announced.
SLOT_POLL_SECONDS = 0.02
# A disabled destination waits for an operator; there is no point asking often.
DISABLED_POLL_SECONDS = 1.0
# Never spin: the shortest pause between two asks while waiting.
_MIN_SLEEP_SECONDS = 0.001
# How far ahead of its moment a delivery worker may be granted a start (capped by the limiter
# at one interval of the rate): more than a worker's wake-up and round trip on a busy host, so
# its next ask arrives before the start is due.
AHEAD_SECONDS = 0.05


@dataclass(frozen=True)
class Grant:
    """Permits granted by one ``acquire``: one slot number per permit (possibly none).

    ``retry_in`` (seconds) and ``reason`` say, when fewer than wanted were granted, when asking
    again is worth it and why: ``"disabled"``, ``"paused until <UTC time> (<why>)"``,
    ``"rate"`` or ``"in flight"``. ``granted_at`` is the database clock of the decision.
    ``start_at`` says, per slot, the moment its request may start (never earlier), on the
    database's clock, which read ``answered_at`` as the answer left.
    """

    slots: list[int] = field(default_factory=list)
    start_at: list[datetime] = field(default_factory=list)
    retry_in: float = 0.0
    reason: str | None = None
    granted_at: datetime | None = None
    answered_at: datetime | None = None

    @property
    def granted(self) -> int:
        return len(self.slots)

    @property
    def start_in(self) -> list[float]:
        """Per slot, seconds from the answer until its request may start (0: at once)."""
        return [max((at - self.answered_at).total_seconds(), 0.0) for at in self.start_at]


class DatabaseClock:
    """The database's clock on this process's ``time.monotonic()``: when to send a start that
    the limiter granted for a moment on its clock.

    Every answer bounds the two clocks' offset: the database read its clock before the answer
    arrived, so (arrival here - the database's reading) is at least the offset. The least of
    the recent ones (``WINDOW_SECONDS``, so a stepped clock is followed) is the closest: a
    start is never sent before its moment, and an answer that was slow to arrive (a busy
    host, the commit) does not make the start late, as counting from the answer's arrival
    would, which put it on top of the next start, sent on time.
    """

    WINDOW_SECONDS = 10.0
    # Round trips that read the database's clock before the first grant: one slow answer (a
    # run's start keeps its host busy) would make the first starts late.
    CALIBRATION_ROUNDS = 5

    def __init__(self) -> None:
        # (arrival, offset) with offsets rising from left to right: the least is the first.
        self._offsets: deque[tuple[float, float]] = deque()

    def observe(self, database_time: datetime, arrived: float) -> None:
        """An answer that left the database at ``database_time`` arrived at ``arrived``."""
        offset = arrived - database_time.timestamp()
        while self._offsets and self._offsets[-1][1] >= offset:
            self._offsets.pop()
        self._offsets.append((arrived, offset))
        while self._offsets[0][0] < arrived - self.WINDOW_SECONDS:
            self._offsets.popleft()

    def calibrate(self, conn: psycopg.Connection) -> None:
        """Read the database's clock a few times (outside any transaction: ``clock_timestamp``
        in an idle session)."""
        with conn.cursor(row_factory=tuple_row) as cur:
            for _ in range(self.CALIBRATION_ROUNDS):
                (database_time,) = cur.execute(query("database_clock")).fetchone()
                self.observe(database_time, time.monotonic())

    def monotonic_at(self, database_time: datetime) -> float:
        """``database_time`` on this process's monotonic clock (needs one ``observe`` first)."""
        return database_time.timestamp() + self._offsets[0][1]


def _check_request(destination_id: str, want: int, holder: str, hold_seconds: float) -> None:
    if not destination_id:
        raise ValueError("destination_id must not be empty")
    if want < 1:
        raise ValueError(f"want must be at least 1, got {want}")
    if not holder:
        raise ValueError("holder must not be empty")
    if not hold_seconds > 0:
        raise ValueError(f"hold_seconds must be greater than 0, got {hold_seconds}")


def _require_no_open_transaction(conn: psycopg.Connection) -> None:
    if conn.info.transaction_status != pq.TransactionStatus.IDLE:
        raise ValueError(
            "rate limit permits need a connection outside any transaction: the destination's "
            "limiter row would stay locked for every other process until it ended"
        )


def _execute(conn: psycopg.Connection, name: str, params: dict) -> tuple[tuple | None, int]:
    """Run one named statement; returns its first row (if any) and the rows it touched.

    In autocommit mode the statement is its own transaction (one round trip: no BEGIN and
    COMMIT of their own). A connection that is not in autocommit mode is committed here if it
    was idle, and otherwise the statement joins the caller's transaction.
    """
    own = not conn.autocommit and conn.info.transaction_status == pq.TransactionStatus.IDLE
    try:
        with conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(query(name), params, prepare=True)
            row = cur.fetchone() if cur.description else None
            touched = cur.rowcount
    except BaseException as exc:
        if own:
            conn.rollback()
        if isinstance(exc, errors.NoDataFound):
            raise UserError(f"unknown destination {params['destination_id']!r}") from None
        raise
    if own:
        conn.commit()
    return row, touched


def acquire(
    conn: psycopg.Connection,
    destination_id: str,
    want: int,
    holder: str,
    hold_seconds: float,
    release_slots: Sequence[int] = (),
    ahead_seconds: float = 0.0,
) -> Grant:
    """Grant up to ``want`` permits to ``holder`` at once: min(want, free slots, rate tokens).

    Each granted slot is held until ``release`` or for ``hold_seconds`` (set it to the lease
    length), whichever comes first. ``holder`` names one worker (run id, process, thread): a
    release frees only the slots that holder still holds. One round trip, committed on return;
    ``conn`` must be outside any transaction (autocommit, or idle). ``release_slots`` are freed
    first, in the same round trip (as ``release`` would). With ``ahead_seconds`` a start due
    within that long (at most one interval of the rate) is granted now: the caller must not
    start its request before ``start_at`` (``start_in`` seconds after the answer).
    """
    _check_request(destination_id, want, holder, hold_seconds)
    if not ahead_seconds >= 0:
        raise ValueError(f"ahead_seconds must be 0 or more, got {ahead_seconds}")
    _require_no_open_transaction(conn)
    (slots, starts, granted_at, retry_in, reason), _ = _execute(
        conn,
        "acquire_permits",
        {
            "destination_id": destination_id,
            "want": want,
            "holder": holder,
            "hold_seconds": hold_seconds,
            "slot_poll_seconds": SLOT_POLL_SECONDS,
            "disabled_poll_seconds": DISABLED_POLL_SECONDS,
            "ahead_seconds": ahead_seconds,
            "release_slots": list(release_slots),
        },
    )
    return Grant(
        slots=list(slots),
        start_at=[granted_at + timedelta(seconds=s) for s in starts],
        retry_in=float(retry_in),
        reason=reason,
        granted_at=granted_at,
        answered_at=granted_at,
    )


def release(conn: psycopg.Connection, destination_id: str, slots: list[int], holder: str) -> int:
    """Free ``slots`` of ``destination_id`` that ``holder`` still holds; returns how many.

    A slot whose hold expired and went to another holder is left alone (the count says so).
    """
    if not slots:
        return 0
    _require_no_open_transaction(conn)
    (released,), _ = _execute(
        conn,
        "release_permits",
        {"destination_id": destination_id, "slots": list(slots), "holder": holder},
    )
    return released


def release_holder(conn: psycopg.Connection, holder: str) -> int:
    """Free every slot ``holder`` holds, on every destination; for a worker known to be dead."""
    _require_no_open_transaction(conn)
    with conn.cursor(row_factory=tuple_row) as cur:
        (released,) = cur.execute(query("release_holder"), {"holder": holder}).fetchone()
    return released


def pause_destination(
    conn: psycopg.Connection, destination_id: str, until_seconds_from_now: float, reason: str
) -> datetime:
    """Pause the whole destination for every process: no permit before the returned time.

    ``paused_until`` becomes the later of the current pause and now + ``until_seconds_from_now``
    (a longer pause already in place keeps its reason). On a connection inside a transaction the
    pause takes effect when that transaction commits, and holds the limiter row until then.
    """
    if not until_seconds_from_now > 0:
        raise ValueError(f"a pause must last more than 0 seconds, got {until_seconds_from_now}")
    if not reason:
        raise ValueError("a pause needs a reason")
    (_, paused_until), _ = _execute(
        conn,
        "pause_destination",
        {"destination_id": destination_id, "seconds": until_seconds_from_now, "reason": reason},
    )
    return paused_until


def in_flight(
    conn: psycopg.Connection, destination_id: str, holder: str | None = None
) -> list[dict]:
    """The slots of ``destination_id`` held now: ``slot_no``, ``held_until``, and ``mine``
    (whether ``holder`` holds it; None when no holder is given)."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            query("destination_in_flight"), {"destination_id": destination_id, "holder": holder}
        ).fetchall()


def _acquire_from(
    source: psycopg.Connection | ConnectionPool,
    destination_id: str,
    want: int,
    holder: str,
    hold_seconds: float,
) -> Grant:
    # From a pool, borrow a connection per ask: none is pinned while the caller sleeps.
    if isinstance(source, ConnectionPool):
        with source.connection() as conn:
            return acquire(conn, destination_id, want, holder, hold_seconds)
    return acquire(source, destination_id, want, holder, hold_seconds)


def wait_for_permits(
    conn_or_pool: psycopg.Connection | ConnectionPool,
    destination_id: str,
    want: int,
    holder: str,
    hold_seconds: float,
    deadline: float,
    sleep: Callable[[float], None] = time.sleep,
) -> Grant:
    """Ask until at least one permit is granted or ``deadline`` (``time.monotonic()``) passes.

    No transaction is held while waiting. When the next chance (next token, end of a pause)
    lies beyond the deadline, or the destination is disabled, this returns the empty grant at
    once rather than sleep for a permit it could not use in time.
    """
    while True:
        grant = _acquire_from(conn_or_pool, destination_id, want, holder, hold_seconds)
        if grant.slots or grant.reason == "disabled":
            return grant
        remaining = deadline - time.monotonic()
        if grant.retry_in > remaining:
            return grant
        sleep(max(grant.retry_in, _MIN_SLEEP_SECONDS))
