"""Interleavings by hand: two sessions, explicit transactions, one side paused at a statement.

A test opens a ``Session`` (its own connection, outside autocommit: ``BEGIN`` is explicit),
runs statements in it up to the point it wants to hold, then starts the other side's
statement in a thread (``in_background``) and waits, on the database's own view of the
backend (``pg_stat_activity``), until that statement is blocked on a lock. Only then does the
first session commit or roll back. No sleeps: every wait is a condition with a deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

import psycopg
import pytest
from psycopg.rows import dict_row

T = TypeVar("T")


def open_session(
    database_url: str, *, autocommit: bool = False, application_name: str | None = None
) -> psycopg.Connection:
    """A session of its own; ``application_name`` names it as a program would (another
    release of media_hooks, a report) in ``pg_stat_activity``."""
    named = {} if application_name is None else {"application_name": application_name}
    return psycopg.connect(database_url, autocommit=autocommit, row_factory=dict_row, **named)


@contextmanager
def in_background(action: Callable[[], T]) -> Iterator[Future[T]]:
    """Run ``action`` in a thread; the block waits for it (and re-raises) on the way out."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="interleaving") as executor:
        future = executor.submit(action)
        yield future
        future.result(timeout=60)


def wait_until_blocked(
    observer: psycopg.Connection, pid: int, future: Future | None = None, timeout: float = 15.0
) -> None:
    """Wait until backend ``pid`` is waiting for a lock (a row, a transaction, a tuple); or,
    given the ``future`` of its statement, until that has ended: for a side whose correct
    behaviour may be either to wait or to decide at once."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if future is not None and future.done():
            return
        row = observer.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()
        if row is not None and row["wait_event_type"] == "Lock":
            return
        time.sleep(0.005)
    pytest.fail(f"backend {pid} never blocked on a lock" + (" nor finished" if future else ""))


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.01)
    pytest.fail(f"timed out waiting for {what}")


def wait_until_gone(conn: psycopg.Connection, pid: int, timeout: float = 15.0) -> None:
    """Wait until backend ``pid`` has left ``pg_stat_activity``: a session its client has
    closed stays listed while its backend exits, and what counts sessions must not see it."""
    listed = "SELECT 1 FROM pg_stat_activity WHERE pid = %s"
    wait_for(
        lambda: conn.execute(listed, (pid,)).fetchone() is None, f"backend {pid} to exit", timeout
    )


@contextmanager
def snapshot_held(
    database_url: str, application_name: str = "nightly-report", *, write: bool = False
) -> Iterator[int]:
    """Another session left idle in an open transaction (its pid): a repeatable-read one that
    has read (it holds a snapshot), or with ``write`` a read-committed one that has written (it
    holds a transaction id). Either keeps vacuum from rows deleted or updated since."""
    with open_session(database_url, autocommit=True, application_name=application_name) as holder:
        if write:
            holder.execute("BEGIN")
            holder.execute("SELECT txid_current()")
        else:
            holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            holder.execute("SELECT count(*) FROM webhook_delivery_all")
        yield holder.info.backend_pid
        holder.execute("ROLLBACK")
