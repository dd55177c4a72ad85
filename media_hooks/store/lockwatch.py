"""What a session is waiting for: the lock it wants and the sessions in its way.

A migration statement that waits for a lock says so only by timing out. ``LockWatch`` watches
it from a second connection while it runs and keeps the latest sighting: the relation (or
transaction) it waits for, and for each session in the way its pid, application name, state,
how long it has been in that state and in its transaction. Never the query text: a blocked
migration is reported in logs and terminals, and another session's query may carry secrets.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import psycopg
from psycopg.rows import dict_row

# The sessions in the way of ``pid``'s ungranted lock, holders and queued waiters alike.
_BLOCKERS = """
SELECT w.locktype,
       w.mode,
       w.relation::regclass::text AS relation,
       b.pid,
       coalesce(nullif(b.application_name, ''), b.backend_type) AS application_name,
       b.state,
       extract(epoch FROM now() - b.state_change)::double precision AS state_seconds,
       extract(epoch FROM now() - b.xact_start)::double precision AS transaction_seconds
FROM pg_locks AS w
CROSS JOIN LATERAL unnest(pg_blocking_pids(w.pid)) AS blocker(pid)
JOIN pg_stat_activity AS b ON b.pid = blocker.pid
WHERE w.pid = %(pid)s AND NOT w.granted
ORDER BY b.xact_start NULLS LAST, b.pid
"""


@dataclass(frozen=True)
class Blocker:
    pid: int
    application_name: str | None
    state: str | None
    state_seconds: float | None
    transaction_seconds: float | None

    def describe(self) -> str:
        parts = [f"pid {self.pid}"]
        if self.application_name:
            parts.append(f"application_name {self.application_name!r}")
        if self.state:
            since = f" for {self.state_seconds:.0f} s" if self.state_seconds is not None else ""
            parts.append(f"{self.state}{since}")
        if self.transaction_seconds is not None:
            parts.append(f"transaction open {self.transaction_seconds:.0f} s")
        return f"{parts[0]} ({', '.join(parts[1:])})" if len(parts) > 1 else parts[0]


@dataclass(frozen=True)
class LockWait:
    """One sighting of a session waiting for a lock."""

    locktype: str
    mode: str
    relation: str | None
    blockers: tuple[Blocker, ...]

    def describe(self) -> str:
        if self.relation:
            wanted = f"{self.mode} on {self.relation}"
        elif self.locktype in ("virtualxid", "transactionid"):
            wanted = "older transactions to end"
        else:
            wanted = f"{self.mode} on a {self.locktype}"
        shown = "; ".join(b.describe() for b in self.blockers[:3])
        more = f"; and {len(self.blockers) - 3} more" if len(self.blockers) > 3 else ""
        return f"waited for {wanted}, held by {shown}{more}"


def sight(conn: psycopg.Connection, pid: int) -> LockWait | None:
    """What ``pid`` is waiting for right now, if it waits for a lock."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(_BLOCKERS, {"pid": pid}).fetchall()
    if not rows:
        return None
    first = rows[0]
    blockers = tuple(
        Blocker(
            pid=r["pid"],
            application_name=r["application_name"],
            state=r["state"],
            state_seconds=r["state_seconds"],
            transaction_seconds=r["transaction_seconds"],
        )
        for r in rows
    )
    return LockWait(first["locktype"], first["mode"], first["relation"], blockers)


class LockWatch:
    """Watches one backend from its own connection until closed; ``latest()`` is the last
    sighting of it waiting (cleared by ``forget()``). If the watching connection cannot be
    opened the watch stays silent: it explains a wait, it never causes one."""

    def __init__(self, conninfo: str, pid: int, interval_seconds: float) -> None:
        self._pid = pid
        self._interval = interval_seconds
        self._latest: LockWait | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._conninfo = conninfo
        self._thread = threading.Thread(target=self._run, name="lock-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            conn = psycopg.connect(
                self._conninfo,
                autocommit=True,
                connect_timeout=5,
                application_name="media-hooks lock watch",
            )
        except psycopg.Error:
            return
        with conn:
            while not self._stop.wait(self._interval):
                try:
                    seen = sight(conn, self._pid)
                except psycopg.Error:
                    return
                if seen is not None:
                    with self._lock:
                        self._latest = seen

    def latest(self) -> LockWait | None:
        with self._lock:
            return self._latest

    def forget(self) -> None:
        with self._lock:
            self._latest = None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def __enter__(self) -> LockWatch:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
