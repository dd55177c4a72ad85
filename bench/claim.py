"""Claim throughput and memory: the reconciler against a large due backlog.

    .venv/bin/python bench/claim.py [--rows 100000]

For page sizes 250 and 1,000: rows/s of ``claim_due`` with one reconciler and with two
reconciler processes at once, beside the bare ``claim_due_page`` statement run in a loop from
the same script (target: ``claim_due`` at least 0.8x of it), and a round trip per row for
reference. Then peak memory of a process claiming a 20,000-row and a 200,000-row backlog:
flat, because pages are bounded. Writes bench/results/claim.json.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time

import psycopg
from psycopg.rows import dict_row
from scratch import scratch_database, write_results

from media_hooks.cohort import Cohort
from media_hooks.reconciler import claim_due
from media_hooks.sqlfiles import query

SEED = """
INSERT INTO webhook_destination (destination_id, url) VALUES ('bench', 'http://127.0.0.1:9/')
ON CONFLICT DO NOTHING;
TRUNCATE dispatch_outbox;
DELETE FROM webhook_delivery;
INSERT INTO webhook_delivery (delivery_id, destination_id, asset_id, event_type, payload, body, next_attempt_at)
SELECT 'bench-' || g, 'bench', 'asset-' || g, 'transcode.completed', jsonb_build_object('n', g),
       convert_to(json_build_object('type', 'transcode.completed', 'data', json_build_object('n', g))::text, 'UTF8'),
       now() - interval '1 minute'
FROM generate_series(1, {rows}) AS g;
"""

CLAIMER = """
import sys, time, resource
import psycopg
from psycopg.rows import dict_row
from media_hooks.cohort import Cohort
from media_hooks.reconciler import claim_due
with psycopg.connect(sys.argv[1], autocommit=True, row_factory=dict_row) as conn:
    start = time.perf_counter()
    figures = claim_due(conn, sys.argv[2], Cohort(), page_size=int(sys.argv[3]))
    print(figures.claimed, time.perf_counter() - start,
          resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def seed(url: str, rows: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SEED.format(rows=rows).encode())
        conn.execute("VACUUM ANALYZE webhook_delivery")
        conn.execute("VACUUM ANALYZE dispatch_outbox")


def bare_statement(url: str, page_size: int) -> tuple[int, float]:
    params = {"run_id": "bare", "page_size": page_size, **Cohort().params()}
    statement = query("claim_due_page")
    total = 0
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        start = time.perf_counter()
        while True:
            with conn.transaction():
                claimed = sum(r["claimed"] for r in conn.execute(statement, params).fetchall())
            total += claimed
            if claimed < page_size:
                break
        return total, time.perf_counter() - start


def engine(url: str, page_size: int) -> tuple[int, float]:
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        start = time.perf_counter()
        figures = claim_due(conn, "engine", Cohort(), page_size=page_size)
        return figures.claimed, time.perf_counter() - start


def claimer_processes(url: str, page_size: int, count: int) -> tuple[int, float, list[int]]:
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, url, f"proc-{n}", str(page_size)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(count)
    ]
    outputs = [p.communicate()[0].split() for p in procs]
    elapsed = time.perf_counter() - start
    return sum(int(o[0]) for o in outputs), elapsed, [int(o[2]) for o in outputs]


def per_row(url: str, rows: int) -> tuple[int, float]:
    """The sketch's shape: one delivery per round trip."""
    done = 0
    with psycopg.connect(url, autocommit=True) as conn:
        start = time.perf_counter()
        for _ in range(rows):
            with conn.transaction():
                row = conn.execute(
                    "SELECT delivery_id, body FROM webhook_delivery WHERE state = 'pending' "
                    "ORDER BY next_attempt_at, delivery_id LIMIT 1 FOR UPDATE SKIP LOCKED"
                ).fetchone()
                if row is None:
                    break
                conn.execute(
                    "INSERT INTO dispatch_outbox (message_id, delivery_id, dispatch_no, destination_id, run_id, body) "
                    "VALUES (%s || ':1', %s, 1, 'bench', 'per-row', %s)",
                    (row[0], row[0], row[1]),
                )
                conn.execute(
                    "UPDATE webhook_delivery SET state = 'enqueued', dispatch_count = 1, "
                    "current_message_id = %s || ':1' WHERE delivery_id = %s",
                    (row[0], row[0]),
                )
            done += 1
        return done, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100_000)
    args = parser.parse_args()
    figures: dict = {"rows": args.rows, "claim": {}, "memory": {}}
    with scratch_database() as url:
        for page_size in (250, 1000):
            seed(url, args.rows)
            bare_rows, bare_s = bare_statement(url, page_size)
            seed(url, args.rows)
            engine_rows, engine_s = engine(url, page_size)
            seed(url, args.rows)
            two_rows, two_s, _ = claimer_processes(url, page_size, 2)
            result = {
                "bare_statement_rows_per_s": round(bare_rows / bare_s),
                "claim_due_one_reconciler_rows_per_s": round(engine_rows / engine_s),
                "claim_due_two_reconcilers_rows_per_s": round(two_rows / two_s),
                "ratio_to_bare": round((engine_rows / engine_s) / (bare_rows / bare_s), 3),
                "two_reconcilers_claimed": two_rows,
            }
            assert bare_rows == engine_rows == two_rows == args.rows, (
                bare_rows,
                engine_rows,
                two_rows,
            )
            figures["claim"][str(page_size)] = result
            print(f"page {page_size}: {result}")
        seed(url, 10_000)
        rows, seconds = per_row(url, 10_000)
        figures["per_row_round_trip_rows_per_s"] = round(rows / seconds)
        print(f"one round trip per row: {figures['per_row_round_trip_rows_per_s']} rows/s")
        for backlog in (20_000, 200_000):
            seed(url, backlog)
            claimed, seconds, (rss_kib,) = claimer_processes(url, 1000, 1)
            figures["memory"][str(backlog)] = {
                "claimed": claimed,
                "peak_rss_mib": round(rss_kib / 1024, 1),
            }
            print(
                f"backlog {backlog}: peak RSS {rss_kib / 1024:.1f} MiB ({claimed} claimed in {seconds:.1f} s)"
            )
    figures["own_peak_rss_mib"] = round(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1
    )
    print(f"written to {write_results('claim', figures)}")


if __name__ == "__main__":
    main()
