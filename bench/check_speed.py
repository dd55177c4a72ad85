"""How long `media-hooks check` takes on a large database (issue 12: under 10 s at 1,000,000
deliveries on the embedded server for the default pass; ``--all`` may be slower).

    python -m bench.check_speed                 # 1,000,000 deliveries
    python -m bench.check_speed --deliveries 100000

Seeds a scratch database with a realistic history (mostly succeeded deliveries with their
outbox rows and attempts over three days, some dead, a pending backlog, a few thousand enqueued
and leased ones in flight, tombstones of purged deliveries, limiter rows), then times the
default pass (median of three) and one ``--all`` pass through ``media_hooks.observe.checks.run``.
Writes ``bench/results/check_speed.json``.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time

import psycopg
from psycopg.rows import dict_row

from bench.scratch import (
    Destination,
    add_destinations,
    postgres,
    scratch_database,
    write_results,
)
from media_hooks.observe import checks

DESTINATIONS = 20

# Of every 1000 deliveries: 900 succeeded and 50 dead (history, with their dispatch and their
# attempt), 40 pending, 5 enqueued and 5 leased (open; an attempt in flight is its lease), each
# with its identity and its body, as the emit, the claim, the lease and the record write them.
SEED = """
WITH made AS MATERIALIZED (
    SELECT 'd-' || g AS delivery_id, 'dest-' || (g %% %(destinations)s + 1) AS destination_id,
           'asset-' || g AS asset_id, g, s.state,
           now() - make_interval(secs => 259200.0 * g / %(rows)s) AS at
    FROM generate_series(1, %(rows)s) AS g,
         LATERAL (SELECT CASE WHEN g %% 1000 < 900 THEN 'succeeded'
                              WHEN g %% 1000 < 950 THEN 'dead'
                              WHEN g %% 1000 < 990 THEN 'pending'
                              WHEN g %% 1000 < 995 THEN 'enqueued'
                              ELSE 'leased' END AS state) AS s
),
identities AS (
    INSERT INTO delivery_identity (delivery_id, destination_id, created_at)
    SELECT delivery_id, destination_id, at FROM made
),
bodies AS (
    INSERT INTO delivery_body (delivery_id, created_at, payload, body)
    SELECT delivery_id, at, jsonb_build_object('n', g),
           convert_to(json_build_object('type', 'transcode.completed', 'n', g)::text, 'UTF8')
    FROM made
),
ended AS (
    INSERT INTO delivery_history
        (delivery_id, destination_id, asset_id, event_type, created_at, queued, state,
         attempt_count, budget_used, budget_started_at, dispatch_count, next_attempt_at,
         current_message_id, last_outcome, finished_at)
    SELECT delivery_id, destination_id, asset_id, 'transcode.completed', at, false, state,
           1, 1, at, 1, at, delivery_id || ':1',
           CASE state WHEN 'succeeded' THEN 'success' ELSE 'rejected' END,
           at + interval '1 second'
    FROM made WHERE state IN ('succeeded', 'dead')
),
open AS (
    INSERT INTO delivery_state
        (delivery_id, destination_id, asset_id, event_type, created_at, queued, state,
         attempt_count, budget_used, budget_started_at, dispatch_count, next_attempt_at,
         lease_until, lease_token, lease_started_at, current_message_id, updated_at)
    SELECT delivery_id, destination_id, asset_id, 'transcode.completed', at, false, state,
           CASE WHEN state = 'leased' THEN 1 ELSE 0 END,
           CASE WHEN state = 'leased' THEN 1 ELSE 0 END,
           at, CASE WHEN state = 'pending' THEN 0 ELSE 1 END,
           now() - make_interval(secs => g %% 600),
           CASE WHEN state = 'leased' THEN now() + interval '90 seconds' END,
           CASE WHEN state = 'leased' THEN gen_random_uuid() END,
           CASE WHEN state = 'leased' THEN at END,
           CASE WHEN state <> 'pending' THEN delivery_id || ':1' END, at
    FROM made WHERE state IN ('pending', 'enqueued', 'leased')
    RETURNING delivery_id, destination_id, state, next_attempt_at, lease_until, updated_at
),
timers AS (
    INSERT INTO delivery_timer (delivery_id, destination_id, kind, fire_at)
    SELECT delivery_id, destination_id,
           CASE WHEN state = 'pending' THEN 'due' ELSE 'inflight' END,
           CASE state WHEN 'pending' THEN next_attempt_at WHEN 'leased' THEN lease_until
                      ELSE updated_at END
    FROM open
),
outbox AS (
    INSERT INTO dispatch_outbox_v3
        (message_id, delivery_id, dispatch_no, destination_id, run_id, delivery_created_at,
         created_at, published_at)
    SELECT delivery_id || ':1', delivery_id, 1, destination_id, 'run-' || (at::date), at, at, at
    FROM made WHERE state <> 'pending'
)
INSERT INTO delivery_attempt_v2
    (delivery_id, attempt_no, destination_id, message_id, run_id, lease_token,
     delivery_created_at, started_at, finished_at, outcome, http_status)
SELECT delivery_id, 1, destination_id, delivery_id || ':1', 'run-' || (at::date),
       gen_random_uuid(), at, at, at + interval '1 second',
       CASE state WHEN 'succeeded' THEN 'success' ELSE 'rejected' END,
       CASE state WHEN 'succeeded' THEN 200 ELSE 410 END
FROM made WHERE state IN ('succeeded', 'dead')
"""

# Ids of deliveries retention dropped within the duplicate window: identities no table's
# delivery holds.
TOMBSTONES = """
INSERT INTO delivery_identity (delivery_id, destination_id, created_at)
SELECT 'purged-' || g, 'dest-1', now() - interval '40 days'
FROM generate_series(1, %(rows)s) AS g
"""

LIMITERS = """
INSERT INTO destination_limiter (destination_id, level, slot_until, slot_holder)
SELECT destination_id, 1, ARRAY[now() + interval '60 seconds', NULL, NULL, NULL]::timestamptz[],
       ARRAY[1, NULL, NULL, NULL]::bigint[]
FROM webhook_destination
"""


def seed(url: str, rows: int) -> float:
    started = time.perf_counter()
    add_destinations(
        url, [Destination(f"dest-{n}", f"http://127.0.0.1:9/{n}") for n in range(1, 21)]
    )
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SEED, {"rows": rows, "destinations": DESTINATIONS})
        conn.execute(TOMBSTONES, {"rows": rows // 10})
        conn.execute(LIMITERS)
        conn.execute("VACUUM ANALYZE")
    return time.perf_counter() - started


def timed(url: str, options: checks.Options) -> tuple[float, checks.Report]:
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        started = time.perf_counter()
        report = checks.run(conn, options)
        return time.perf_counter() - started, report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.check_speed", description=__doc__)
    parser.add_argument("--deliveries", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3, help="default passes timed")
    args = parser.parse_args(argv)
    with scratch_database("mh_bench_check") as url:
        print(f"seeding {args.deliveries:,} deliveries ...", flush=True)
        seeded = seed(url, args.deliveries)
        print(f"seeded in {seeded:.0f} s", flush=True)
        passes = [timed(url, checks.Options()) for _ in range(args.repeat)]
        default = statistics.median(seconds for seconds, _ in passes)
        full_seconds, full_report = timed(url, checks.Options(full=True))
        server = postgres(url)
    broken = sorted({r.name for _, report in passes for r in report.failed()})
    broken += [f"{r.name} (--all)" for r in full_report.failed()]
    figures = {
        "command": shlex.join(["python", "-m", "bench.check_speed", *(argv or sys.argv[1:])]),
        "postgres": server,
        "deliveries": args.deliveries,
        "seed_seconds": round(seeded, 1),
        "default_pass_seconds": [round(seconds, 3) for seconds, _ in passes],
        "default_pass_median_seconds": round(default, 3),
        "all_pass_seconds": round(full_seconds, 3),
        "broken_on_the_seeded_history": broken,
    }
    path = write_results("check_speed", figures)
    print(
        f"check at {args.deliveries:,} deliveries: default {default:.2f} s (median of "
        f"{args.repeat}), --all {full_seconds:.2f} s; wrote {path}"
    )
    if broken:
        print(f"the seeded history should hold, but broke: {', '.join(broken)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
