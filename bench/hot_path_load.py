"""The proposed layout under load (issue 34, parts 2 and 3): a producer, a worker per
destination and partition retention at once, autovacuum at the server's defaults.

    python -m bench.hot_path_load --deliveries 300000 --out DIR

``bench.hot_path_prototype`` measures what one delivery writes, on one connection. This runs
the same prototype statements the way the sustained benchmark runs the engine, to see what one
connection cannot show: whether the state row's updates stay HOT with workers and autovacuum
at work, whether the timer table (a row inserted, updated and deleted per delivery) and the
state table stay small, and whether dropping partitions keeps the history flat. No HTTP: a
worker "sends" by deciding the outcome (``--fail-percent`` retryable, due again at once).

Partitions are ``PART_SECONDS`` wide instead of a day, made ahead and attached as the design
says (a table with a ``CHECK`` of its range, then ``ATTACH PARTITION``), and detached
concurrently and dropped once older than ``--retain-seconds`` (the body's only when no open
delivery was created in it); identity rows expire after ``--duplicate-seconds``. The run is
cut into 20 windows of 5% of its deliveries, as the sustained benchmark's. Writes
``hot_path_load.json`` and ``hot_path_load.png`` to ``--out`` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from bench import stats, sustained
from bench.hot_path_prototype import (
    DESTINATIONS,
    P_CLAIM,
    P_EMIT,
    P_EXPIRE_IDENTITY,
    P_LEASE,
    P_RECORD,
    PAD,
    PAGE,
    PARTITIONED,
    PROPOSED_DDL,
    STEP,
)
from bench.scratch import Scratch, machine, postgres, server_url
from bench.sustained_roles import own_wal_bytes
from bench.wal import WalReader

PART_SECONDS = 15
AHEAD = 4  # partitions made ahead of now
WINDOWS = 20
BACKLOG = 3000
EMIT_BATCH = 1000
# Each partitioned table's key: the body by creation, the rest by when they were written.
KEYS = {"p_body": "created_at", "p_outbox": "created_at", "p_attempt": "finished_at",
        "p_done": "finished_at"}  # fmt: skip
# The retention job's look-up of open deliveries in a body partition's range (the design's
# delivery_state_created).
LOAD_DDL = "CREATE INDEX p_state_created ON p_state (created_at)"
FIGURES = """
SELECT relname AS name, n_tup_upd, n_tup_hot_upd, n_dead_tup, n_live_tup, autovacuum_count,
       pg_total_relation_size(relid) AS bytes
FROM pg_stat_user_tables WHERE relname IN ('p_state', 'p_timer', 'p_identity')
"""
HISTORY_BYTES = """
SELECT coalesce(sum(pg_total_relation_size(t.relid)), 0)::bigint AS bytes
FROM unnest(%(tables)s::regclass[]) AS p(parent)
CROSS JOIN LATERAL pg_partition_tree(p.parent) AS t
WHERE t.isleaf
"""


class Partitions:
    """Each partitioned table's partitions by the start of their range (epoch seconds)."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True, row_factory=dict_row)
        self.made: dict[str, dict[int, str]] = {table: {} for table in PARTITIONED}
        self.dropped = 0

    def make_ahead(self) -> None:
        first = math.floor(time.time() / PART_SECONDS) * PART_SECONDS - PART_SECONDS
        for table in PARTITIONED:
            for start in range(first, first + (AHEAD + 2) * PART_SECONDS, PART_SECONDS):
                if start not in self.made[table]:
                    self.made[table][start] = self._attach(table, start)

    def _attach(self, table: str, start: int) -> str:
        """Made apart and attached: the parent is locked SHARE UPDATE EXCLUSIVE, which lets
        every insert and update through; the CHECK spares ATTACH its scan."""
        name, key = f"{table}_{start}", KEYS[table]
        bounds = f"to_timestamp({start}) AND {key} < to_timestamp({start + PART_SECONDS})"
        self.conn.execute(f"CREATE TABLE {name} (LIKE {table} INCLUDING DEFAULTS)")
        self.conn.execute(f"ALTER TABLE {name} ADD CHECK ({key} >= {bounds})")
        self.conn.execute(
            f"ALTER TABLE {table} ATTACH PARTITION {name} FOR VALUES FROM "
            f"(to_timestamp({start})) TO (to_timestamp({start + PART_SECONDS}))"
        )
        return name

    def drop_old(self, retain_seconds: float) -> None:
        cutoff = time.time() - retain_seconds
        for table in PARTITIONED:
            for start, name in sorted(self.made[table].items()):
                end = start + PART_SECONDS
                if end > cutoff or (table == "p_body" and self._holds_open(end)):
                    break
                self.conn.execute(f"ALTER TABLE {table} DETACH PARTITION {name} CONCURRENTLY")
                self.conn.execute(f"DROP TABLE {name}")
                del self.made[table][start]
                self.dropped += 1

    def _holds_open(self, end: int) -> bool:
        found = self.conn.execute(
            "SELECT 1 FROM p_state WHERE created_at < to_timestamp(%s) LIMIT 1", (end,)
        ).fetchone()
        return found is not None


class Load:
    """The producer, the workers and retention, and what they did so far."""

    def __init__(self, url: str, fail_percent: int, seed: int) -> None:
        self.url = url
        self.fail_percent = fail_percent
        self.random = random.Random(seed)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.terminal = 0
        self.emitted = 0
        self.claims: list[float] = []
        self.records: list[float] = []
        self.errors: list[str] = []
        # The producer's and retention's own WAL so far (None: the server cannot tell).
        self.own_wal: dict[str, int | None] = {"emit": 0, "retention": 0}

    def run(self, target, *args) -> threading.Thread:
        def guarded() -> None:
            try:
                target(*args)
            except Exception as exc:  # recorded; the run stops
                self.errors.append(f"{target.__name__}: {type(exc).__name__}: {exc}")
                self.stop.set()

        thread = threading.Thread(target=guarded, daemon=True)
        thread.start()
        return thread

    def producer(self) -> None:
        destinations = [f"dest-{n}" for n in range(1, DESTINATIONS + 1)]
        with psycopg.connect(self.url, autocommit=True, row_factory=dict_row) as conn:
            while not self.stop.is_set():
                due = conn.execute(
                    "SELECT count(*) AS n FROM p_timer WHERE kind = 'due'"
                ).fetchone()["n"]
                if due >= BACKLOG:
                    self.stop.wait(0.02)
                    continue
                numbers = range(self.emitted, self.emitted + EMIT_BATCH)
                conn.execute(
                    P_EMIT,
                    {
                        "ids": [f"p-{n}" for n in numbers],
                        "destinations": [destinations[n % DESTINATIONS] for n in numbers],
                        "assets": [f"asset-{n % 10007}" for n in numbers],
                        "payloads": [
                            json.dumps({"n": n, "rendition": "1080p", "pad": PAD}) for n in numbers
                        ],
                    },
                )
                self.emitted += EMIT_BATCH
                self.own_wal["emit"] = own_wal_bytes(conn)

    def worker(self, destination: str) -> None:
        with psycopg.connect(self.url, autocommit=True, row_factory=dict_row) as conn:
            while not self.stop.is_set():
                began = time.monotonic()
                page = conn.execute(
                    P_CLAIM, {"destination_id": destination, "page": PAGE, "run_id": "load"}
                ).fetchall()
                claimed = time.monotonic()
                if not page:
                    self.stop.wait(0.02)
                    continue
                for at in range(0, len(page), STEP):
                    self._step(conn, page[at : at + STEP])
                with self.lock:
                    self.claims.append(claimed - began)

    def _step(self, conn: psycopg.Connection, offered: list[dict]) -> None:
        leased = conn.execute(
            P_LEASE,
            {
                "run_id": "load",
                "ids": [m["delivery_id"] for m in offered],
                "messages": [m["message_id"] for m in offered],
            },
        ).fetchall()
        with self.lock:
            outcomes = [
                "retryable" if self.random.random() * 100 < self.fail_percent else "success"
                for _ in leased
            ]
        began = time.monotonic()
        conn.execute(
            P_RECORD,
            {
                "ids": [lease["delivery_id"] for lease in leased],
                "tokens": [lease["lease_token"] for lease in leased],
                "outcomes": outcomes,
            },
        )
        with self.lock:
            self.records.append(time.monotonic() - began)
            self.terminal += outcomes.count("success")

    def retention(self, partitions: Partitions, retain: float, duplicate: float) -> None:
        with psycopg.connect(self.url, autocommit=True, row_factory=dict_row) as conn:
            while not self.stop.wait(2):
                partitions.make_ahead()
                partitions.drop_old(retain)
                expire = P_EXPIRE_IDENTITY.replace("%(cutoff)s", "to_timestamp(%(cutoff)s)")
                while conn.execute(expire, {"cutoff": time.time() - duplicate}).rowcount:
                    pass
                written = [own_wal_bytes(conn), own_wal_bytes(partitions.conn)]
                self.own_wal["retention"] = None if None in written else sum(written)

    def take(self) -> tuple[list[float], list[float]]:
        with self.lock:
            taken = self.claims, self.records
            self.claims, self.records = [], []
        return taken


def snapshot(conn: psycopg.Connection) -> dict[str, Any]:
    tables = {r["name"]: dict(r) for r in conn.execute(FIGURES)}
    history = conn.execute(HISTORY_BYTES, {"tables": list(PARTITIONED)}).fetchone()["bytes"]
    return {**sustained.wal_position(conn), "tables": tables, "history_bytes": history}


def window(number: int, before: dict, after: dict, claims: list, records: list) -> dict:
    deliveries = after["terminal"] - before["terminal"]
    wal = after["wal"] - before["wal"]
    state_now, state_then = after["tables"]["p_state"], before["tables"]["p_state"]
    updates = state_now["n_tup_upd"] - state_then["n_tup_upd"]
    hot = state_now["n_tup_hot_upd"] - state_then["n_tup_hot_upd"]
    seconds = after["at"] - before["at"]
    return {
        "window": number,
        "deliveries_done": after["terminal"],
        "per_second": round(deliveries / seconds, 1),
        "claim_p99_ms": round((stats.percentile(claims, 0.99) or 0) * 1000, 2),
        "record_p99_ms": round((stats.percentile(records, 0.99) or 0) * 1000, 2),
        "wal_bytes_per_delivery": round(wal / deliveries, 1),
        # The producer's own, retention's own, and the rest: what delivering costs.
        **sustained.wal_split(wal, deliveries, before, after),
        # The full-page images among it (bench.sustained: pg_stat_wal and pg_walinspect).
        **sustained.full_page_images(deliveries, before, after),
        "state_hot_ratio": round(hot / updates, 4) if updates else None,
        "state_mib": round(state_now["bytes"] / 2**20, 2),
        "timer_mib": round(after["tables"]["p_timer"]["bytes"] / 2**20, 2),
        "identity_mib": round(after["tables"]["p_identity"]["bytes"] / 2**20, 2),
        "history_mib": round(after["history_bytes"] / 2**20, 2),
        "state_live": state_now["n_live_tup"],
        "state_dead": state_now["n_dead_tup"],
        "timer_dead": after["tables"]["p_timer"]["n_dead_tup"],
        "autovacuum_runs": sum(
            after["tables"][t]["autovacuum_count"] - before["tables"][t]["autovacuum_count"]
            for t in after["tables"]
        ),
    }


def run(url: str, deliveries: int, args: argparse.Namespace) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(PROPOSED_DDL.format(fillfactor=args.fillfactor))
        conn.execute(LOAD_DDL)
        conn.execute("CREATE SEQUENCE p_emit_seq")
    partitions = Partitions(url)
    partitions.make_ahead()
    load = Load(url, args.fail_percent, args.seed)
    threads = [load.run(load.producer)]
    threads += [load.run(load.worker, f"dest-{n}") for n in range(1, DESTINATIONS + 1)]
    threads.append(
        load.run(load.retention, partitions, args.retain_seconds, args.duplicate_seconds)
    )
    boundaries = [deliveries * (k + 1) // WINDOWS for k in range(WINDOWS)]
    windows = []
    started = time.monotonic()
    reader = WalReader.start(url)

    def mark(terminal: int) -> dict[str, Any]:
        now = {"at": time.monotonic(), "terminal": terminal, "own_wal": dict(load.own_wal)}
        now.update(snapshot(conn))
        now["wal_read"] = None if reader is None else reader.mark(now["lsn"])
        return now

    try:
        with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
            last = mark(0)
            while len(windows) < WINDOWS and not load.stop.wait(0.1):
                if load.terminal < boundaries[len(windows)]:
                    continue
                now = mark(load.terminal)
                windows.append(window(len(windows) + 1, last, now, *load.take()))
                last = now
    finally:
        # Also when a window fails: the load's threads and the image reader's connection end.
        load.stop.set()
        for thread in threads:
            thread.join(timeout=60)
        if reader is not None:
            reader.stop()
    return {
        "seconds": round(time.monotonic() - started, 1),
        "complete": len(windows) == WINDOWS,
        "errors": load.errors,
        "partitions_dropped": partitions.dropped,
        "windows": windows,
    }


COLUMNS = ("per_second", "claim_p99_ms", "wal_bytes_per_delivery",
           "delivering_wal_bytes_per_delivery", "fpi_bytes_per_delivery",
           "state_hot_ratio",
           "state_mib", "timer_mib", "identity_mib", "history_mib", "state_dead", "timer_dead",
           "autovacuum_runs")  # fmt: skip


def render(document: dict[str, Any]) -> str:
    lines = ["| window | " + " | ".join(COLUMNS) + " |", "|---|" + "---|" * len(COLUMNS)]
    for w in document["windows"]:
        lines.append(f"| {w['window']} | " + " | ".join(str(w[c]) for c in COLUMNS) + " |")
    return "\n".join(lines)


def draw(document: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    windows = document["windows"]
    xs = [w["deliveries_done"] / 1000 for w in windows]
    figure, axes = pyplot.subplots(2, 2, figsize=(11, 7))
    panels = (
        ("MiB", {k: f"{k}_mib" for k in ("state", "timer", "identity", "history")}),
        ("HOT ratio, state row", {"": "state_hot_ratio"}),
        (
            "WAL bytes per delivery (all writers)",
            {
                "all": "wal_bytes_per_delivery",
                "delivering": "delivering_wal_bytes_per_delivery",
                "full-page images": "fpi_bytes_per_delivery",
            },
        ),
        ("dead tuples", {"state": "state_dead", "timer": "timer_dead"}),
    )
    for axis, (title, series) in zip(axes.flat, panels, strict=True):
        for label, key in series.items():
            values = [math.nan if w[key] is None else w[key] for w in windows]
            axis.plot(xs, values, marker="o", label=label or None)
        axis.set_title(title, fontsize=10)
        axis.set_xlabel("deliveries done (thousands)")
        axis.set_ylim(bottom=0)
        if len(series) > 1:
            axis.legend(fontsize=8)
    figure.suptitle("The proposed layout under load (bench/hot_path_load.py)")
    figure.tight_layout()
    figure.savefig(path, dpi=75)
    pyplot.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hot_path_load", description=__doc__)
    parser.add_argument("--deliveries", type=int, default=300_000)
    parser.add_argument("--fail-percent", type=int, default=10)
    parser.add_argument("--fillfactor", type=int, default=50)
    parser.add_argument("--retain-seconds", type=float, default=30)
    parser.add_argument("--duplicate-seconds", type=float, default=60)
    parser.add_argument("--seed", type=int, default=34)
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args(argv)
    server = server_url()
    # Autovacuum at the server's defaults, turned on for the run where the server has it off.
    with (
        sustained.autovacuum_at_defaults(server) as found,
        Scratch(server, "mh_hot_path_load") as scratch,
    ):
        url = scratch.create()
        result = run(url, args.deliveries, args)
    document = {
        "command": " ".join(["python -m bench.hot_path_load", *(argv or sys.argv[1:])]),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "part_seconds": PART_SECONDS,
        "machine": machine(),
        "postgres": {**postgres(server), **found},
        **result,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "hot_path_load.json").write_text(json.dumps(document, indent=2) + "\n")
    if document["windows"]:
        draw(document, args.out / "hot_path_load.png")
    print(render(document))
    if document["errors"]:
        print("errors:", *document["errors"], sep="\n  ")
    return 0 if document["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
