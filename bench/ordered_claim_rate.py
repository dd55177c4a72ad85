"""Ordered claim (issue 14): rows/s the reconciler claims from a 100,000 backlog on a destination
with ``--ordering asset`` against the same backlog on a plain destination, in the same run.

The backlog is recorded the way a producer records it, through ``emit_many`` (the bulk emit
path), so an ordered destination's held deliveries are born parked as in production (migration
0013). Shapes (each run is a delivery run's reconciler step: the sweeps, among them the one that
wakes a parked delivery left heading its queue, then the claims of the whole due backlog as a
delivery run makes them (each due destination's pages of 250); timed together, in a fresh clone
of the seeded database):

- ``distinct``: every delivery a different asset: every row is a queue head, so the ordered
  claim pays the rule's look-up on every row and claims all of them.
- ``revisions``: 4 deliveries per asset (25,000 assets): the ordered claim takes the 25,000
  heads; the 75,000 held rows were born parked, out of its due scan; its rows/s counts the rows
  it claimed.

``-drain``: the same backlog claimed to the end: reconciler steps (sweeps and claims, timed)
until nothing is left, what each step claimed succeeding in between (untimed; the settle trigger
makes each queue's next delivery due), so the ordered destination's four passes over its queues
count.

Prints the figures and writes them to bench/results/ordered_claim.json.

    python -m bench.ordered_claim_rate [--backlog 100000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import psycopg

from bench.scratch import Scratch, postgres, server_url, write_results
from media_hooks.core.config import Settings
from media_hooks.outbox.claims import claim_destination_page, due_destinations
from media_hooks.outbox.cohort import Cohort
from media_hooks.outbox.emit import Event, emit_many
from media_hooks.outbox.maintenance import sweeps

TARGET_RATIO = 0.5
SHAPES = {"distinct": 1, "revisions": 4}

SEED_CHUNK = 10_000


def _seeder(ordering: str, rows: int, per_asset: int) -> Callable[[str], None]:
    """The backlog as a producer records it: ``emit_many`` (the bulk emit path, which parks a
    held delivery when it is recorded) in files of SEED_CHUNK events, revision after revision:
    event g is revision g // assets of asset g % assets, so an asset's later revisions are held
    behind an earlier one in the same file or in an earlier, committed one."""
    assets = rows // per_asset

    def seed(url: str) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO webhook_destination (destination_id, url, ordering) "
                "VALUES ('pub', 'http://127.0.0.1:9/', %s)",
                (ordering,),
            )
            for first in range(0, rows, SEED_CHUNK):
                emit_many(
                    conn,
                    (
                        Event("pub", f"asset-{g % assets}", "rights.updated", {"n": g})
                        for g in range(first, min(first + SEED_CHUNK, rows))
                    ),
                )
            conn.execute("VACUUM ANALYZE")

    return seed


def _claimed(conn: psycopg.Connection, run_id: str) -> int:
    """A delivery run's claims: each due destination's pages of 250 until none is left."""
    claimed = 0
    for destination_id in due_destinations(conn, Cohort()):
        while page := claim_destination_page(conn, run_id, destination_id, Cohort(), 250):
            claimed += len(page)
    return claimed


def _claim_all(url: str) -> dict[str, float]:
    """A run's reconciler step: the sweeps that precede its claims (they park held deliveries),
    then the claim of the whole due backlog."""
    with psycopg.connect(url, autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
        started = time.perf_counter()
        sweeps.run_sweeps(conn, Settings.from_env())
        claimed = _claimed(conn, "bench-run")
        seconds = time.perf_counter() - started
    return {"claimed": claimed, "seconds": seconds, "per_second": claimed / seconds}


def _drain(url: str) -> dict[str, float]:
    """Reconciler steps until the whole backlog is claimed: each timed step is the sweeps and
    the claims; between steps, untimed, what was claimed succeeds (a worker's part: the settle
    trigger releases each queue's next delivery). Rows/s over the timed steps."""
    settings = Settings.from_env()
    claimed = passes = 0
    seconds = 0.0
    with psycopg.connect(url, autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
        while True:
            started = time.perf_counter()
            sweeps.run_sweeps(conn, settings)
            step = _claimed(conn, f"bench-run-{passes}")
            seconds += time.perf_counter() - started
            if not step:
                break
            claimed += step
            passes += 1
            conn.execute("UPDATE webhook_delivery SET state = 'succeeded' WHERE state = 'enqueued'")
    return {
        "claimed": claimed,
        "passes": passes,
        "seconds": seconds,
        "per_second": claimed / seconds,
    }


def measure(backlog: int, rounds: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, float]]] = {}
    with Scratch(server_url(), "mh_bench_ordered") as scratch:
        for shape, per_asset in SHAPES.items():
            for ordering in ("none", "asset"):
                scratch.template(f"{shape}-{ordering}", _seeder(ordering, backlog, per_asset))
        for _ in range(rounds):
            for shape in SHAPES:
                for ordering in ("none", "asset"):
                    key = f"{shape}-{ordering}"
                    with scratch.database(key) as url:
                        runs.setdefault(key, []).append(_claim_all(url))
                    with scratch.database(key) as url:
                        runs.setdefault(f"{key}-drain", []).append(_drain(url))
        server = postgres(scratch.create(scratch.template("distinct-none")))
    figures = {
        key: {
            "median_per_second": statistics.median(r["per_second"] for r in results),
            "claimed": results[0]["claimed"],
            "runs_per_second": [round(r["per_second"]) for r in results],
        }
        for key, results in runs.items()
    }
    # Paired by round (the two runs of a round are back to back: the same load on a shared
    # machine), then the median of the rounds' ratios.
    ratios = {
        shape: statistics.median(
            ordered["per_second"] / plain["per_second"]
            for ordered, plain in zip(runs[f"{shape}-asset"], runs[f"{shape}-none"], strict=True)
        )
        for shape in SHAPES
    }
    ratios.update(
        {
            f"{shape}-drain": statistics.median(
                ordered["per_second"] / plain["per_second"]
                for ordered, plain in zip(
                    runs[f"{shape}-asset-drain"], runs[f"{shape}-none-drain"], strict=True
                )
            )
            for shape in SHAPES
        }
    )
    return {
        "title": "Ordered claim: rows/s claimed, --ordering asset vs none, same run",
        "command": f"python -m bench.ordered_claim_rate --backlog {backlog} --rounds {rounds}",
        "size": {"backlog": backlog, "page_size": 250, "shapes": SHAPES},
        "postgres": server,
        "figures": figures,
        "ordered_over_unordered": ratios,
        "ratio": "median over rounds of (ordered rows/s / unordered rows/s) of the same round",
        "target": {
            "what": "ordered claim at least 0.5x the unordered claim's rows/s (100,000 backlog)",
            "met": all(r >= TARGET_RATIO for r in ratios.values()),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    result = measure(args.backlog, args.rounds)
    path = write_results("ordered_claim", result)
    for key, figure in result["figures"].items():
        print(
            f"{key:>16}: median {figure['median_per_second']:,.0f} rows/s "
            f"(claimed {figure['claimed']}, runs {figure['runs_per_second']})"
        )
    for shape, ratio in result["ordered_over_unordered"].items():
        print(f"{shape}: ordered / unordered = {ratio:.2f}")
    print(f"target met: {result['target']['met']}; written to {path}")


if __name__ == "__main__":
    main()
