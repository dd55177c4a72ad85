"""Sustained load (issue 34): emit and deliver continuously, retention behind, autovacuum on.

    python -m bench.sustained --size ci --out DIR           # 10,000 deliveries: CI's smoke
    python -m bench.sustained --size baseline --out DIR     # 300,000: an informative hour's share
    python -m bench.sustained --size issue --out DIR        # 5,000,000: the issue's report
    python -m bench.sustained --deliveries 200000 --out DIR # any size's settings, another count
    python -m bench.sustained --size deep --history 3000000 --out DIR  # beside a deep history
    python -m bench.sustained --report --out DIR            # redraw the plots and the summary
    python -m bench --only sustained                        # as a section of the report

Three processes work at once (``bench.sustained_roles``) on one scratch database: a producer
emitting in bulk (COPY, in its own transactions) whenever fewer than a backlog's worth are due;
the engine (``deliver_due``, run after run) delivering to an instant receiver, some of whose
publishers answer 500 to a share of their requests (so retries and dead letters exist); and
retention dropping the history tables' partitions, each as wide as its short window, once every
delivery in one has ended a window ago, with a duplicate window a few times longer. Autovacuum
runs at the server's defaults: where the server has it off (the system PostgreSQL of these
machines), it is turned on for the run (``ALTER SYSTEM``) and back off after it.

The run is cut into 20 windows of 5% of its deliveries (a delivery counts when it reaches a
terminal state, succeeded or dead; the producer keeps emitting until the last window closes, so
no window drains a backlog without load). Each window records deliveries per second, the p50
and p99 latency of the engine's claim, lease and record statements (timed in the engine
process), the WAL written per delivery (``pg_current_wal_lsn``), each table's HOT-update
ratio, sizes, dead tuples and autovacuum runs (``pg_stat_user_tables``; a partitioned table's
partitions summed, and the rows of those retention dropped counted). Writes
``sustained.json``, ``SUMMARY.md`` (the issue's targets, met or not and by how much) and one
PNG per metric to ``--out``.

``--history N`` first writes N delivered deliveries, spread over the 80% of the retention
window before the run (``bench.sustained_history``): the history a platform keeps for weeks,
which the hot path works beside. The ``deep`` size keeps a day (nothing is purged during the
run), so its runs with and without ``--history`` differ in the history's depth alone.

WAL is the server's: on a shared server (``MEDIA_HOOKS_DATABASE_URL``) other databases' writes
count too; the embedded server (the default) has only this one.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from bench import processes, stats, sustained_history
from bench.fast_receiver import fast_receiver
from bench.scratch import RESULTS, Destination, Scratch, add_destinations, machine, postgres
from bench.scratch import server_url as default_server_url
from bench.wal import WalRead, WalReader, breakdown
from media_hooks.observe import checks
from media_hooks.outbox.maintenance import partitions

WINDOWS = 20
# The tables whose statistics and sizes each window records (a partitioned one's partitions
# summed); the first seven hold the deliveries, open and ended, that retention keeps flat.
TABLES = (
    "delivery_state",
    "delivery_timer",
    "delivery_body",
    "delivery_history",
    "dispatch_outbox_v3",
    "delivery_attempt_v2",
    "delivery_identity",
    "destination_limiter",
    "webhook_destination",
)
HISTORY = TABLES[:7]
STOP_SECONDS = 60
DAY = 86_400


@dataclass(frozen=True)
class Size:
    name: str
    deliveries: int
    destinations: int
    # The last ``failing`` destinations answer 500 to ``fail_percent`` % of their requests.
    failing: int
    fail_percent: int
    in_flight: int
    # The producer emits a batch whenever fewer than ``backlog`` deliveries are due.
    backlog: int
    emit_batch: int
    page_size: int
    # The most rows one engine run claims: runs end, and the next one's sweeps run, as a
    # schedule's would.
    run_rows: int
    retain_seconds: float
    duplicate_seconds: float
    retention_every: float
    max_attempts: int
    backoff_base: float
    backoff_cap: float
    # The run stops here, finished or not (the summary then says how far it got).
    time_limit: float
    # Delivered deliveries written before the run (bench.sustained_history).
    history: int = 0
    # Deliveries a second the producer emits at most (None: as fast as the backlog allows).
    rate: float | None = None


SIZES = {
    # At 700 a second the run lasts at least 14 s on any machine, whatever the engine's speed,
    # and retention (a second's window, every half second) drops ranges behind it several
    # times: unthrottled, a fast machine ended the run before the first range was done with.
    "ci": Size("ci", 10_000, 4, 1, 40, 4, 1_200, 400, 250, 2_000, 1, 4, 0.5, 3, 0.2, 1, 60, rate=700),
    "report": Size("report", 60_000, 8, 2, 40, 4, 3_000, 1_000, 250, 10_000, 30, 90, 5, 3, 0.5, 4, 900),
    "baseline": Size(
        "baseline", 300_000, 8, 2, 40, 4, 3_000, 1_000, 250, 10_000, 15, 45, 5, 3, 0.5, 4, 3_600
    ),
    "issue": Size(
        "issue", 5_000_000, 8, 2, 40, 4, 3_000, 1_000, 250, 10_000, 60, 180, 10, 3, 0.5, 4, 8 * 3_600
    ),
    "deep": Size(
        "deep", 500_000, 8, 2, 40, 4, 3_000, 1_000, 250, 10_000, 86_400, 172_800, 10, 3, 0.5, 4, 3_600
    ),
}  # fmt: skip


# The server ------------------------------------------------------------------------------------

AUTOVACUUM_SETTINGS = """
SELECT name, setting, source FROM pg_settings
WHERE name LIKE 'autovacuum%%' OR name IN ('track_counts', 'shared_buffers', 'max_wal_size',
      'checkpoint_timeout', 'wal_level', 'full_page_writes', 'synchronous_commit',
      'wal_compression', 'data_checksums')
ORDER BY name
"""


@contextmanager
def autovacuum_at_defaults(server: str) -> Iterator[dict[str, Any]]:
    """Autovacuum on for the run, at the server's settings; turned back off after it where the
    server had it off. Yields what was found and done, for the results."""
    with psycopg.connect(server, autocommit=True) as conn:
        was, source = conn.execute(
            "SELECT setting, coalesce(sourcefile, '') FROM pg_settings WHERE name = 'autovacuum'"
        ).fetchone()
        if was == "off":
            conn.execute("ALTER SYSTEM SET autovacuum = on")
            conn.execute("SELECT pg_reload_conf()")
            _wait_for_setting(server, "autovacuum", "on")
    # Put back as found: an ALTER SYSTEM's off is written again, a configuration file's is
    # uncovered by taking ours away.
    restore = (
        "ALTER SYSTEM SET autovacuum = off"
        if source.endswith("postgresql.auto.conf")
        else "ALTER SYSTEM RESET autovacuum"
    )
    try:
        with psycopg.connect(server, autocommit=True, row_factory=dict_row) as conn:
            settings = {r["name"]: r["setting"] for r in conn.execute(AUTOVACUUM_SETTINGS)}
        yield {"autovacuum_found": was, "turned_on_for_the_run": was == "off", "settings": settings}
    finally:
        if was == "off":
            with psycopg.connect(server, autocommit=True) as conn:
                conn.execute(restore)
                conn.execute("SELECT pg_reload_conf()")


def _wait_for_setting(server: str, name: str, value: str, seconds: float = 10) -> None:
    """A reload reaches the server's processes a moment later: wait until a new session sees it."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with psycopg.connect(server) as conn:
            if conn.execute(f"SHOW {name}").fetchone()[0] == value:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{name} is not {value} {seconds:.0f} s after pg_reload_conf()")


def destinations(size: Size, receiver: str) -> list[Destination]:
    """dest-1..N on the instant receiver, the last ``failing`` of them failing publishers."""
    made = []
    for n in range(1, size.destinations + 1):
        fails = n > size.destinations - size.failing
        path = f"0/fail-{size.fail_percent}/dest-{n}" if fails else f"0/dest-{n}"
        made.append(Destination(f"dest-{n}", receiver + path, max_in_flight=size.in_flight))
    return made


def partition_seconds(size: Size) -> int:
    """How wide the history tables' partitions are for a run: as its retention window, a day at
    most (the default). Retention drops a range once every delivery in it ended a window ago, so
    that a window of seconds keeps the history flat as a month's does in production."""
    return min(DAY, math.ceil(size.retain_seconds))


def narrow_partitions(url: str, seconds: int) -> None:
    """Partitions ``seconds`` wide from now on, in a fresh database (nothing in them yet): the
    migration's, a day wide, are dropped, and the ones retention and delivery runs make ahead
    from then on start a range before now."""
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        width = conn.execute("SELECT width_seconds FROM media_hooks_partitioning").fetchone()
        if width["width_seconds"] == seconds:
            return
        for made in conn.execute("SELECT child FROM media_hooks_partition").fetchall():
            conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(made["child"])))
        conn.execute("DELETE FROM media_hooks_partition")
        conn.execute("UPDATE media_hooks_partitioning SET width_seconds = %s", (seconds,))
        partitions.make_ahead(conn)


def seed(url: str, size: Size, receiver: str) -> list[str]:
    narrow_partitions(url, partition_seconds(size))
    targets = destinations(size, receiver)
    add_destinations(url, targets)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "UPDATE webhook_destination SET max_attempts = %s, backoff_base_seconds = %s,"
            " backoff_cap_seconds = %s",
            (size.max_attempts, size.backoff_base, size.backoff_cap),
        )
    return [d.destination_id for d in targets]


# Snapshots -------------------------------------------------------------------------------------

# Each table's counters and sizes, a partitioned table's by partition (``name``) under its
# own (``table``).
TABLE_FIGURES = """
SELECT s.relname AS name, r.relname AS table, s.n_tup_ins, s.n_tup_upd, s.n_tup_hot_upd,
       s.n_tup_del, (to_jsonb(s) ->> 'n_tup_newpage_upd')::bigint AS n_tup_newpage_upd,
       s.n_live_tup, s.n_dead_tup, s.autovacuum_count, s.autoanalyze_count,
       pg_total_relation_size(s.relid) AS total_bytes, pg_relation_size(s.relid) AS heap_bytes,
       pg_indexes_size(s.relid) AS index_bytes
FROM pg_stat_user_tables AS s
JOIN pg_class AS r ON r.oid = coalesce(pg_partition_root(s.relid), s.relid)
WHERE r.relname = ANY (%(tables)s)
"""
# A partitioned index's partitions summed under its own name.
INDEX_SIZES = """
SELECT t.relname AS table_name, x.relname AS name, sum(pg_relation_size(i.indexrelid)) AS bytes,
       sum(i.idx_scan) AS idx_scan
FROM pg_stat_user_indexes AS i
JOIN pg_class AS t ON t.oid = coalesce(pg_partition_root(i.relid), i.relid)
JOIN pg_class AS x ON x.oid = coalesce(pg_partition_root(i.indexrelid), i.indexrelid)
WHERE t.relname = ANY (%(tables)s)
GROUP BY t.relname, x.relname
ORDER BY t.relname, x.relname
"""
# lsn: where the WAL is flushed to, the furthest pg_walinspect reads on PostgreSQL 15.
WAL = """
SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint AS wal,
       pg_current_wal_flush_lsn()::text AS lsn, (SELECT wal_fpi FROM pg_stat_wal) AS fpi
"""
STATES = "SELECT state, count(*) AS n FROM webhook_delivery_all GROUP BY state ORDER BY state"


def wal_position(conn: psycopg.Connection) -> dict[str, Any]:
    """The WAL written so far (bytes), where it is flushed to, and the full-page images so far."""
    position = conn.execute(WAL).fetchone()
    return {"wal": int(position["wal"]), "lsn": position["lsn"], "fpi": int(position["fpi"])}


def snapshot(conn: psycopg.Connection) -> dict[str, Any]:
    """The server's WAL position and each table's (and partition's) counters and sizes, now."""
    rows = conn.execute(TABLE_FIGURES, {"tables": list(TABLES)}).fetchall()
    return {**wal_position(conn), "tables": {r["name"]: dict(r) for r in rows}}


COUNTERS = ("n_tup_ins", "n_tup_upd", "n_tup_hot_upd", "n_tup_del", "n_tup_newpage_upd",
            "autovacuum_count", "autoanalyze_count")  # fmt: skip
GAUGES = ("n_live_tup", "n_dead_tup", "total_bytes", "heap_bytes", "index_bytes")


def by_table(before: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each table's counters as they moved between two snapshots and its gauges at the second,
    a partitioned table's partitions summed: one made since counts from nothing, one dropped
    since is gone with what it counted, and its live rows at the first are the table's
    ``dropped_rows`` (retention's drop deletes no row). A counter the server does not keep is
    None."""
    tables: dict[str, dict[str, Any]] = {}

    def of(name: str) -> dict[str, Any]:
        return tables.setdefault(name, dict.fromkeys((*COUNTERS, *GAUGES, "dropped_rows"), 0))

    for name, then in before["tables"].items():
        if name not in after["tables"]:
            of(then["table"])["dropped_rows"] += then["n_live_tup"]
    for name, now in after["tables"].items():
        then = before["tables"].get(name, {})
        table = of(now["table"])
        for key in COUNTERS:
            if now[key] is None or table[key] is None:
                table[key] = None
            else:
                table[key] += now[key] - (then.get(key) or 0)
        for key in GAUGES:
            table[key] += now[key]
    return {name: tables[name] for name in TABLES if name in tables}


def wal_read(before: dict[str, Any], after: dict[str, Any]) -> WalRead | None:
    """What the WAL reader read between two marks (``wal_read``: WalReader.mark's), or None
    where it could not read all of the stretch between them (or there is no reader)."""
    if before.get("wal_read") is None or after.get("wal_read") is None:
        return None
    return after["wal_read"].since(before["wal_read"])


# Windows ---------------------------------------------------------------------------------------

KINDS = ("claim", "lease", "record")


class Windows:
    """The run's 20 windows, closed as the engine's lines report terminal deliveries."""

    def __init__(self, url: str, total: int) -> None:
        self.conn = psycopg.connect(url, autocommit=True, row_factory=dict_row)
        self.reader = WalReader.start(url, roots=True)
        self.boundaries = [total * (k + 1) // WINDOWS for k in range(WINDOWS)]
        self.started = time.monotonic()
        self.closed: list[dict[str, Any]] = []
        self.samples: dict[str, list[float]] = {kind: [] for kind in KINDS}
        self.emit_seconds: list[float] = []
        self.emitted = 0
        self.purged = dict.fromkeys(
            ("deliveries", "outbox_rows", "attempts", "tombstones_expired", "partitions_dropped"),
            0,
        )
        self.retention_passes: list[float] = []
        # The producer's and retention's own WAL so far (None: the server cannot tell).
        self.own_wal: dict[str, int | None] = {"emit": 0, "retention": 0}
        self.terminal = 0
        self.succeeded = 0
        self.dead = 0
        self.recorded = 0
        self.last: dict[str, Any] = {}
        self.first: dict[str, Any] = {}
        self.begun = threading.Event()
        self.done = threading.Event()
        self._lock = threading.Lock()

    def _begin(self, at: float) -> None:
        """The first window opens when the engine is ready to deliver (its imports and pool
        are its start-up, not the load's)."""
        self.started = at
        self.last = self.first = self._mark(at)
        self.begun.set()

    def engine_line(self, line: dict[str, Any]) -> None:
        with self._lock:
            if line.get("ready"):
                self._begin(line["at"])
                return
            for kind in KINDS:
                self.samples[kind] += [seconds for _, seconds in line.get(kind, ())]
            self.succeeded, self.dead = line["succeeded"], line["dead"]
            self.recorded = line.get("recorded", self.recorded)
            self.terminal = self.succeeded + self.dead
            if not self.done.is_set() and self.terminal >= self.boundaries[len(self.closed)]:
                self._close(line["at"])

    def producer_line(self, line: dict[str, Any]) -> None:
        with self._lock:
            self.emitted = line["emitted"]
            self.emit_seconds.append(line["seconds"])
            self.own_wal["emit"] = line["wal_bytes"]

    def retention_line(self, line: dict[str, Any]) -> None:
        with self._lock:
            for key in self.purged:
                self.purged[key] += line[key]
            self.retention_passes.append(line["seconds"])
            self.own_wal["retention"] = line["wal_bytes"]

    def _mark(self, at: float) -> dict[str, Any]:
        mark = {"at": at, "terminal": self.terminal, "own_wal": dict(self.own_wal)}
        mark.update(snapshot(self.conn))
        mark["wal_read"] = None if self.reader is None else self.reader.mark(mark["lsn"])
        return mark

    def _close(self, at: float) -> None:
        now = self._mark(at)
        self.closed.append(window_figures(len(self.closed) + 1, self.last, now, self))
        self.last = now
        self.samples = {kind: [] for kind in KINDS}
        self.emit_seconds, self.retention_passes = [], []
        self.purged = dict.fromkeys(self.purged, 0)
        if len(self.closed) == WINDOWS:
            self.done.set()

    def close(self) -> None:
        if self.reader is not None:
            self.reader.stop()
        self.conn.close()


def _ms(values: list[float], fraction: float) -> float | None:
    found = stats.percentile(values, fraction)
    return None if found is None else round(found * 1000, 2)


def _left_their_page(moved: dict[str, Any]) -> float | None:
    """The share of a table's updates whose new version went to another page (written whole
    instead of the bytes that changed), where the server counts them (PostgreSQL 16 on)."""
    if moved["n_tup_newpage_upd"] is None:
        return None
    return _ratio(moved["n_tup_newpage_upd"], moved["n_tup_upd"])


def _ratio(top: float, bottom: float) -> float | None:
    return round(top / bottom, 4) if bottom else None


def window_figures(
    number: int, before: dict[str, Any], after: dict[str, Any], windows: Windows
) -> dict[str, Any]:
    """One window's figures from the snapshots at its two ends and what the roles reported."""
    deliveries = after["terminal"] - before["terminal"]
    seconds = after["at"] - before["at"]
    tables = {
        name: {
            "inserts": moved["n_tup_ins"],
            "updates": moved["n_tup_upd"],
            "hot_updates": moved["n_tup_hot_upd"],
            "hot_ratio": _ratio(moved["n_tup_hot_upd"], moved["n_tup_upd"]),
            "new_page_ratio": _left_their_page(moved),
            "deletes": moved["n_tup_del"],
            "dropped_rows": moved["dropped_rows"],
            "live_tuples": moved["n_live_tup"],
            "dead_tuples": moved["n_dead_tup"],
            "autovacuum_runs": moved["autovacuum_count"],
            "autoanalyze_runs": moved["autoanalyze_count"],
            "total_bytes": moved["total_bytes"],
            "heap_bytes": moved["heap_bytes"],
            "index_bytes": moved["index_bytes"],
        }
        for name, moved in by_table(before, after).items()
    }
    wal = after["wal"] - before["wal"]
    return {
        **wal_split(wal, deliveries, before, after),
        **full_page_images(deliveries, before, after),
        "window": number,
        "ended_after_seconds": round(after["at"] - windows.started, 2),
        "deliveries_done": after["terminal"],
        "seconds": round(seconds, 3),
        "deliveries": deliveries,
        "per_second": round(deliveries / seconds, 1) if seconds > 0 else None,
        **{
            f"{kind}_{name}_ms": _ms(windows.samples[kind], fraction)
            for kind in KINDS
            for name, fraction in (("p50", 0.5), ("p99", 0.99))
        },
        **{f"{kind}_statements": len(windows.samples[kind]) for kind in KINDS},
        "emit_batch_p99_ms": _ms(windows.emit_seconds, 0.99),
        "emitted_so_far": windows.emitted,
        "wal_bytes": wal,
        "wal_bytes_per_delivery": round(wal / deliveries, 1) if deliveries else None,
        "history_bytes": sum(tables[t]["total_bytes"] for t in HISTORY if t in tables),
        "purged": dict(windows.purged),
        "retention_passes": len(windows.retention_passes),
        "retention_pass_max_seconds": round(max(windows.retention_passes, default=0), 3),
        "tables": tables,
    }


# The processes ---------------------------------------------------------------------------------


def _start(role: list[str], env: dict[str, str], log: IO[str]) -> subprocess.Popen:
    """A role in a process group of its own (``processes.stop_group`` reaches it), its lines on
    a pipe, its errors in the run's log, stopped by closing its standard input."""
    grouping: dict[str, Any] = (
        {"start_new_session": True} if processes.own_sessions else {"process_group": 0}
    )
    return subprocess.Popen(
        processes.python_command("bench.sustained_roles", *role),
        env=env,
        cwd=processes.REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        **grouping,
    )


def _follow(process: subprocess.Popen, handle) -> threading.Thread:
    def read() -> None:
        for text in process.stdout:
            handle(json.loads(text))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def _stop(process: subprocess.Popen, reader: threading.Thread) -> int | None:
    """Close its standard input and wait for it to finish its last run; then its group goes."""
    try:
        process.stdin.close()
    except BrokenPipeError:
        pass
    try:
        process.wait(timeout=STOP_SECONDS)
    except subprocess.TimeoutExpired:
        processes.stop_group(process)
    reader.join(timeout=10)
    return process.returncode


def role_commands(size: Size, destination_ids: list[str]) -> dict[str, list[str]]:
    rate = [] if size.rate is None else ["--rate", str(size.rate)]
    return {
        "engine": ["engine", "--page-size", str(size.page_size), "--max-rows", str(size.run_rows)],
        "producer": [
            "producer", "--backlog", str(size.backlog), "--batch", str(size.emit_batch),
            "--destinations", ",".join(destination_ids), *rate,
        ],
        "retention": [
            "retention", "--retain-seconds", str(size.retain_seconds),
            "--duplicate-seconds", str(size.duplicate_seconds),
            "--every", str(size.retention_every),
        ],
    }  # fmt: skip


def role_env(url: str, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEDIA_HOOKS_", "DAGSTER_"))}
    env.update(
        MEDIA_HOOKS_DATABASE_URL=url,
        MEDIA_HOOKS_HOME=str(home),
        MEDIA_HOOKS_ALLOW_PRIVATE_URLS="1",
        PYTHONPATH=str(processes.REPO),
    )
    return env


def drive(url: str, size: Size, receiver: str, home: Path, deadline: float) -> dict[str, Any]:
    """Seed, run the three roles until the last window closes (or ``deadline``), stop them."""
    destination_ids = seed(url, size, receiver)
    preloaded = (
        sustained_history.preload(url, size.history, destination_ids, 0.8 * size.retain_seconds)
        if size.history
        else None
    )
    env = role_env(url, home)
    started = time.monotonic()
    windows = Windows(url, size.deliveries)
    handlers = {
        "engine": windows.engine_line,
        "producer": windows.producer_line,
        "retention": windows.retention_line,
    }
    exits: dict[str, int | None] = {}
    log_path = home / "roles.log"
    with log_path.open("w") as log, ExitStack() as stack:
        stack.callback(windows.close)
        running = {}
        for name, command in role_commands(size, destination_ids).items():
            process = _start(command, env, log)
            stack.callback(processes.kill_group, process)  # whatever happens, none outlives this
            running[name] = (process, _follow(process, handlers[name]))
        while not windows.done.wait(0.5):
            if time.monotonic() >= deadline:
                break
            if any(process.poll() is not None for process, _ in running.values()):
                break
        # The engine last: the others stop loading it while it finishes its run.
        for name in ("producer", "retention", "engine"):
            exits[name] = _stop(*running[name])
        states = {r["state"]: r["n"] for r in windows.conn.execute(STATES)}
        indexes = windows.conn.execute(INDEX_SIZES, {"tables": list(TABLES)}).fetchall()
        totals = totals_over(windows.first, windows.last) if windows.begun.is_set() else {}
        # `media-hooks check`, whole history, once every role has stopped: the issue's
        # "holds at the end of the long run".
        with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
            check = checks.run(conn, checks.Options(full=True)).as_dict()
    errors = [line for line in log_path.read_text().splitlines() if "Error" in line][-5:]
    return {
        "seconds": round(time.monotonic() - started, 1),
        "partition_seconds": partition_seconds(size),
        "history_preload_seconds": preloaded,
        "complete": len(windows.closed) == WINDOWS,
        # At the last window's end; the engine delivers a little more while it stops.
        "deliveries_done": windows.last.get("terminal", 0),
        "succeeded_by_the_end": windows.succeeded,
        "dead_by_the_end": windows.dead,
        # Attempts the engine recorded, counted as it recorded them (pg_stat_user_tables'
        # insert counters lag a busy backend by up to seconds, so they can undercount).
        "attempts_recorded_by_the_end": windows.recorded,
        "emitted": windows.emitted,
        "role_exits": exits,
        "role_errors": errors,
        "states_at_end": states,
        "check_at_end": check,
        "index_bytes_at_end": [dict(r) for r in indexes],
        "totals": totals,
        "windows": windows.closed,
    }


def wal_split(
    wal: int, deliveries: int, before: dict[str, Any], after: dict[str, Any]
) -> dict[str, float | None]:
    """The server's WAL per delivery split into the producer's, retention's and the rest (the
    engine's, autovacuum's, checkpoints'), where the server tells a session's own WAL."""
    own = {}
    for role in ("emit", "retention"):
        then, now = before["own_wal"][role], after["own_wal"][role]
        own[role] = None if then is None or now is None else now - then
    split: dict[str, float | None] = {f"{role}_wal_bytes_per_delivery": None for role in own}
    split["delivering_wal_bytes_per_delivery"] = None
    if deliveries and None not in own.values():
        for role, written in own.items():
            split[f"{role}_wal_bytes_per_delivery"] = round(written / deliveries, 1)
        split["delivering_wal_bytes_per_delivery"] = round(
            (wal - sum(own.values())) / deliveries, 1
        )
    return split


def full_page_images(
    deliveries: int, before: dict[str, Any], after: dict[str, Any]
) -> dict[str, float | None]:
    """How many full-page images the server wrote per delivery (the first change of a page
    after a checkpoint logs the whole page), and their bytes where the WAL could be read."""
    if not deliveries:
        return {"fpi_per_delivery": None, "fpi_bytes_per_delivery": None}
    read = wal_read(before, after)
    return {
        "fpi_per_delivery": round((after["fpi"] - before["fpi"]) / deliveries, 3),
        "fpi_bytes_per_delivery": None if read is None else round(read.images / deliveries, 1),
    }


def totals_over(first: dict[str, Any], last: dict[str, Any]) -> dict[str, Any]:
    """The whole run's WAL per delivery and HOT ratios (from the first to the last window's end)."""
    deliveries = last["terminal"] - first["terminal"]
    moved = by_table(first, last)
    updates = {name: m["n_tup_upd"] for name, m in moved.items()}
    hot = {name: _ratio(m["n_tup_hot_upd"], m["n_tup_upd"]) for name, m in moved.items()}
    new_page = {name: _left_their_page(m) for name, m in moved.items()}
    wal = last["wal"] - first["wal"]
    return {
        **wal_split(wal, deliveries, first, last),
        **full_page_images(deliveries, first, last),
        **breakdown(wal_read(first, last), deliveries),
        "deliveries": deliveries,
        "wal_bytes": wal,
        "wal_bytes_per_delivery": round(wal / deliveries, 1) if deliveries else None,
        "updates": updates,
        "hot_ratio": hot,
        "new_page_ratio": new_page,
        "updates_per_delivery": {
            name: round(n / deliveries, 3) if deliveries else None for name, n in updates.items()
        },
    }


def run(
    size: Size,
    *,
    server: str | None = None,
    scratch: Scratch | None = None,
    receiver: str | None = None,
    seconds: float | None = None,
) -> dict[str, Any]:
    """One sustained run on a fresh scratch database; returns the results document."""
    server = server or default_server_url()
    limit = min(size.time_limit, seconds) if seconds is not None else size.time_limit
    with ExitStack() as stack:
        found = stack.enter_context(autovacuum_at_defaults(server))
        if scratch is None:
            scratch = stack.enter_context(Scratch(server, "mh_sustained"))
        if receiver is None:
            receiver = stack.enter_context(fast_receiver())
        home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mh_sustained_")))
        url = stack.enter_context(scratch.database())
        document = {
            "schema": 1,
            "title": "Sustained load: emit, deliver and purge at once, autovacuum at defaults",
            "size": asdict(size),
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": machine(),
            "postgres": {**postgres(server), **found},
        }
        document.update(drive(url, size, receiver, home, time.monotonic() + limit))
    document["machine"]["load_average_after"] = machine()["load_average"]
    return document


# The command line and the report's section --------------------------------------------------


def write(document: dict[str, Any], out: Path) -> None:
    from bench import sustained_report

    out.mkdir(parents=True, exist_ok=True)
    (out / "sustained.json").write_text(json.dumps(document, indent=2, default=str) + "\n")
    document["plots"] = sustained_report.draw(document, out)
    (out / "sustained.json").write_text(json.dumps(document, indent=2, default=str) + "\n")
    (out / "SUMMARY.md").write_text(sustained_report.render(document))


SUITE_SIZES = {"smoke": "ci", "quick": "ci", "full": "report"}


def measure(session) -> dict[str, Any]:
    """The report's section (``python -m bench --only sustained``): the size that fits the
    suite's, on the session's server, scratch databases and receiver."""
    from bench import sustained_report

    size = SIZES[SUITE_SIZES[session.size.name]]
    document = run(
        size,
        server=session.scratch.server,
        scratch=session.scratch,
        receiver=session.receiver,
        seconds=session.remaining(),
    )
    return sustained_report.as_measurement(document)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.sustained", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--size", choices=sorted(SIZES), default="baseline")
    parser.add_argument("--deliveries", type=int, help="the size's settings, this many deliveries")
    parser.add_argument(
        "--history", type=int, help="delivered deliveries to write before the run (a deep history)"
    )
    parser.add_argument(
        "--rate",
        type=float,
        help="deliveries a second the producer emits at most (default: "
        "as fast as the engine takes them)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "sustained")
    parser.add_argument(
        "--report", action="store_true", help="only redraw the plots and SUMMARY.md from the JSON"
    )
    args = parser.parse_args(argv)
    if args.report:
        source = args.out / "sustained.json"
        if not source.is_file():
            parser.error(f"no {source} to report from: run the benchmark first")
        write(json.loads(source.read_text()), args.out)
        print(f"rewrote {args.out / 'SUMMARY.md'}")
        return 0
    size = SIZES[args.size]
    if args.deliveries is not None:
        if args.deliveries < WINDOWS * 10:
            parser.error(f"--deliveries must be at least {WINDOWS * 10} (20 windows of 10)")
        size = replace(size, deliveries=args.deliveries)
    if args.history is not None:
        if args.history < 0:
            parser.error("--history must be 0 or more")
        size = replace(size, history=args.history)
    if args.rate is not None:
        if args.rate <= 0:
            parser.error("--rate must be more than 0")
        size = replace(size, rate=args.rate)
    document = run(size)
    document["command"] = shlex.join(["python", "-m", "bench.sustained", *(argv or sys.argv[1:])])
    write(document, args.out)
    print((args.out / "SUMMARY.md").read_text())
    return 0 if document["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
