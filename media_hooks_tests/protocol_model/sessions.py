"""The actors: sessions of their own, each on a thread of its own, so that one can wait on a
lock another holds while the test goes on driving the others.

A worker session is outside autocommit: its statements pile up in one open transaction until a
rule commits it, rolls it back, or the worker dies (its connection closed between statements,
or its backend ended in the middle of one). What the worker learnt inside an open transaction
(messages claimed, leases taken, outcomes recorded, permits granted) counts only when it commits.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg import pq

from media_hooks.core.errors import UserError
from media_hooks.outbox.leases import Lease, Message
from media_hooks_tests.protocol_model.trace import Trace, connect

# How long a statement may take before the test decides it is waiting on a lock (or fails).
SETTLE_SECONDS = 20.0
# A deadlock between two sessions the test paused is broken by the server this soon.
DEADLOCK_TIMEOUT = "100ms"

# Errors a session may meet from the others, not from a fault in the protocol: the server
# broke a deadlock, or the test ended the backend (a worker dying mid-statement).
PASSING = (
    psycopg.errors.DeadlockDetected,
    psycopg.errors.LockNotAvailable,
    psycopg.errors.SerializationFailure,
    psycopg.errors.AdminShutdown,
    psycopg.OperationalError,
)

_RUNS = itertools.count(1)


@dataclass
class Held:
    """What a worker holds, each with whether its transaction committed."""

    messages: dict[str, list[tuple[Message, bool]]] = field(default_factory=dict)
    # (lease, destination, its permit's slot, committed)
    leases: list[tuple[Lease, str, int, bool]] = field(default_factory=list)
    # Slots of recorded leases, handed back with the worker's next ask, per destination.
    release: dict[str, list[int]] = field(default_factory=dict)
    # Permits granted to this worker's run: (destination, start_at), uncommitted ones apart.
    grants: list[tuple[str, datetime]] = field(default_factory=list)
    # Deliveries this transaction recorded as succeeded.
    successes: list[str] = field(default_factory=list)


class Actor:
    """One worker (or producer, or operator): a connection and the thread that uses it."""

    def __init__(self, name: str, url: str, trace: Trace, *, autocommit: bool = False) -> None:
        self.name = name
        self.url = url
        self.trace = trace
        self.autocommit = autocommit
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self.conn = self._connect()
        self.run_id = self._new_run()
        self.held = Held()
        self.pending: tuple[Future, Callable[[Any], None]] | None = None

    def _connect(self) -> psycopg.Connection:
        conn = connect(self.url, self.trace, self.name, autocommit=self.autocommit)
        conn.execute("SELECT set_config('deadlock_timeout', %s, false)", (DEADLOCK_TIMEOUT,))
        if not self.autocommit:
            conn.commit()
        return conn

    def _new_run(self) -> str:
        return f"run-{self.name}-{next(_RUNS)}"

    @property
    def pid(self) -> int:
        return self.conn.info.backend_pid

    @property
    def in_transaction(self) -> bool:
        return self.conn.info.transaction_status != pq.TransactionStatus.IDLE

    @property
    def busy(self) -> bool:
        return self.pending is not None

    def start(
        self, observer: psycopg.Connection, action: Callable[[], Any], done: Callable[[Any], None]
    ) -> None:
        """Run ``action`` on the actor's thread; ``done`` gets its result once it has one.
        Returns when it has finished, or when it waits on a lock (then ``settle`` finishes)."""
        future = self.executor.submit(self._guarded, action)
        self.pending = (future, done)
        self.settle(observer)

    def _guarded(self, action: Callable[[], Any]) -> Any:
        try:
            return action()
        except UserError as exc:
            # Refused input (an id already used for another event): the statement's savepoint
            # is gone, the transaction goes on.
            self.trace.event(self.name, f"refused: {exc}")
            return exc
        except PASSING as exc:
            self.trace.event(self.name, f"refused: {type(exc).__name__}: {str(exc).strip()[:120]}")
            self._undo()
            return exc

    def settle(self, observer: psycopg.Connection, timeout: float = SETTLE_SECONDS) -> None:
        """Wait until the pending action has finished or waits on a lock."""
        if self.pending is None:
            return
        future, done = self.pending
        deadline = time.monotonic() + timeout
        while not future.done():
            row = observer.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (self.pid,)
            ).fetchone()
            if row is not None and row["wait_event_type"] == "Lock" and not future.done():
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}'s statement neither ended nor waited on a lock")
            time.sleep(0.002)
        self.pending = None
        done(future.result())

    def commit(self) -> Held | None:
        """Commit the open transaction; returns what it gave (grants and successes), or None
        when the server refused it (rolled back)."""

        def run() -> bool:
            self.trace.event(self.name, "COMMIT")
            self.conn.commit()
            return True

        if self.executor.submit(self._guarded, run).result() is not True:
            return None
        given = Held(grants=self.held.grants, successes=self.held.successes)
        self._keep()
        return given

    def rollback(self) -> None:
        self.executor.submit(self._rollback_now).result()

    def _rollback_now(self) -> None:
        self.trace.event(self.name, "ROLLBACK")
        self._undo()

    def _undo(self) -> None:
        """The open transaction is gone: forget what it gave."""
        if not self.conn.closed and not self.conn.broken:
            self.conn.rollback()
        held = self.held
        held.messages = {d: [(m, c) for m, c in ms if c] for d, ms in held.messages.items()}
        held.leases = [entry for entry in held.leases if entry[3]]
        held.grants = []
        held.successes = []

    def _keep(self) -> None:
        held = self.held
        held.messages = {d: [(m, True) for m, _ in ms] for d, ms in held.messages.items()}
        held.leases = [(lease, d, slot, True) for lease, d, slot, _ in held.leases]
        held.grants = []
        held.successes = []

    def die(self, observer: psycopg.Connection) -> None:
        """The worker's process ends: its backend is ended (mid-statement when it was in
        one), the connection closed, and a new worker with a run of its own takes its place."""
        self.trace.event(self.name, "dies" + (" mid-statement" if self.busy else ""))
        observer.execute("SELECT pg_terminate_backend(%s)", (self.pid,))
        if self.pending is not None:
            self.pending[0].exception(timeout=SETTLE_SECONDS)
            self.pending = None
        self.executor.submit(self.conn.close).result()
        self.conn = self.executor.submit(self._connect).result()
        self.run_id = self._new_run()
        self.held = Held()

    def close(self, observer: psycopg.Connection) -> None:
        observer.execute("SELECT pg_terminate_backend(%s)", (self.pid,))
        if self.pending is not None:
            self.pending[0].exception(timeout=SETTLE_SECONDS)
            self.pending = None
        self.executor.submit(self.conn.close).result()
        self.executor.shutdown()
