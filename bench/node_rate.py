"""Issue 33: the Node.js worker against an instant receiver, beside the Python engine and pg-boss.

The same due deliveries (destinations whose limits never bind, on the receiver's instant
paths, as ``bench.deliver_rate`` seeds them), delivered in interleaved rounds by:

- ``engine``: the Python engine, ``deliver_due`` in a process of its own (``bench.run_peer``);
- ``node``: the Node.js worker, ``node node/bin/media-hooks-node.js worker dest-1 ... --json``
  (one connection per destination);
- ``pgboss``: pg-boss (a Node.js PostgreSQL queue) used the same way: one job per delivery,
  enqueued with ``boss.insert`` before the run (in the template database, not timed, as the
  rows are emitted before the engine starts), and workers whose job POSTs the body
  (``bench/pgboss/peer.js``).

pg-boss's settings: one worker per destination, each fetching ``PGBOSS_BATCH`` jobs at a time
and POSTing them at once over one keep-alive agent of as many sockets as the engine may have
requests in flight (destinations x max in flight), polling every 0.5 s (pg-boss's minimum).
pg-boss's worker waits out its polling interval after every fetch that took less, so jobs
at a time are its throughput: the same 40 requests in flight as 40 workers of one job each
delivered 80/s here (each polls twice a second), against over 2,000/s in batches of 100.

Figures per run: deliveries/s of the process's wall time (start-up included), in steady state
(the receiver's timestamps), as the process reports its own delivery span (the engine from
``deliver_due``'s start, pg-boss from its first fetch to the last completion seen; the Node
worker reports none), and CPU per delivery: the measured process tree's own (the children the
harness reaped during the run: unaffected by other load on the machine; for pg-boss also its
own count over its delivery span), the database server's and the whole machine's (both
include any other load on a shared machine).

    python -m bench.node_rate [--deliveries 10000] [--rounds 3] [--out PATH]
    python -m bench --only node    # the same as a section of the report, at the session's size

Installs bench/pgboss's and node/'s packages (``npm ci``) when their node_modules is missing.
Writes bench/results/node_rate.json (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from psycopg.conninfo import conninfo_to_dict

from bench import cpu, paths, stats
from bench.processes import NODE_CLI, REPO, node_packages
from bench.scratch import (
    add_destinations,
    add_due_deliveries,
    machine,
    postgres,
    spread,
    unlimited_destinations,
    write_results,
)
from bench.session import Session, session
from bench.sizes import FULL

PGBOSS = REPO / "bench" / "pgboss"
PGBOSS_PEER = PGBOSS / "peer.js"
PGBOSS_BATCH = 100
METRICS = {
    "per_second": "deliveries/s, end to end (process wall time)",
    "steady_per_second": "deliveries/s in steady state (receiver's timestamps)",
    "own_per_second": "deliveries/s over the delivery span the process reports",
    "own_cpu_ms_per_delivery": "the process's CPU over that span per delivery, ms (pg-boss)",
    "seconds": "process wall time, s",
    "peak_rss_mib": "peak RSS of the process tree, MiB",
    **cpu.PROCESS_METRICS,
    **cpu.METRICS,
}
PATHS = ("engine", "node", "pgboss")
# libpq's environment variables, which pg (node-postgres) reads as libpq does.
LIBPQ_VARIABLES = {
    "host": "PGHOST",
    "port": "PGPORT",
    "dbname": "PGDATABASE",
    "user": "PGUSER",
    "password": "PGPASSWORD",
}


def libpq_env(url: str) -> dict[str, str]:
    """The database at ``url`` (a URL or a key=value string) as libpq environment variables."""
    given = conninfo_to_dict(url)
    return {name: str(given[key]) for key, name in LIBPQ_VARIABLES.items() if given.get(key)}


def pgboss_args(destinations: int, in_flight: int) -> list[str]:
    return [
        "--workers",
        str(destinations),
        "--batch-size",
        str(PGBOSS_BATCH),
        "--sockets",
        str(destinations * in_flight),
    ]


def seeded(session: Session, destinations: int, rows: int, in_flight: int):
    def seed(url: str) -> None:
        targets = unlimited_destinations(session.receiver, destinations, in_flight)
        add_destinations(url, targets)
        add_due_deliveries(url, "dlv-", spread(rows, [d.destination_id for d in targets]))
        done = subprocess.run(
            ["node", str(PGBOSS_PEER), "enqueue"],
            env=session.env(url, **libpq_env(url)),
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"pg-boss enqueue failed: {done.stderr.strip()[-300:]}")

    return seed


def own_figures(run: paths.PathRun) -> dict[str, float | None]:
    """Deliveries per second of the delivery span the process reports, and its CPU per
    delivery over that span (None: it reports none)."""
    reported = run.reported if isinstance(run.reported, dict) else {}
    seconds, cpu_ms = reported.get("seconds"), reported.get("cpu_ms")
    return {
        "own_per_second": run.delivered / seconds if seconds else None,
        "own_cpu_ms_per_delivery": cpu_ms / run.delivered if cpu_ms and run.delivered else None,
    }


def measure(session: Session) -> dict[str, Any]:
    missing = node_packages(REPO / "node", PGBOSS)
    if missing is not None:
        raise RuntimeError(missing)
    size = session.size
    rows, count, in_flight = size.deliver_rows, size.deliver_destinations, size.deliver_in_flight
    template = f"node-{count}-{rows}"
    session.scratch.template(template, seeded(session, count, rows, in_flight))
    destination_ids = [f"dest-{n}" for n in range(1, count + 1)]

    def on_fresh(run: Callable[[str], paths.PathRun]) -> Callable[[], dict]:
        def measured() -> dict:
            with session.scratch.database(template) as url:
                done = run(url)
            return {**done.figures(expected=rows), **own_figures(done)}

        return measured

    node = ["node", str(NODE_CLI), "worker", *destination_ids, "--json"]
    pgboss = ["node", str(PGBOSS_PEER), "work", *pgboss_args(count, in_flight)]
    runners = {
        "engine": on_fresh(lambda url: paths.run_engine(session, url)),
        "node": on_fresh(lambda url: paths.run_command(session, "node", node, url)),
        "pgboss": on_fresh(
            lambda url: paths.run_command(session, "pgboss", pgboss, url, **libpq_env(url))
        ),
    }
    figures = stats.summarize(session.interleaved(runners), list(METRICS))
    pairs = [("node", "engine"), ("node", "pgboss"), ("engine", "pgboss")]
    ratios = [
        ratio
        for metric in ("per_second", "steady_per_second", "process_cpu_ms_per_delivery")
        for ratio in stats.ratios(figures, pairs, metric)
    ]
    return {
        "title": "Deliver, instant receiver: the Node worker beside the Python engine and pg-boss",
        "metrics": METRICS,
        "size": {
            "deliveries": rows,
            "destinations": count,
            "max_in_flight_per_destination": in_flight,
            "pgboss_workers": count,
            "pgboss_batch_size": PGBOSS_BATCH,
            "pgboss_sockets": count * in_flight,
            "pgboss_polling_seconds": 0.5,
        },
        "figures": figures,
        "ratios": ratios,
        "targets": [],
        "notes": [
            "Every path is a process of its own; per_second divides the deliveries by its "
            "whole wall time, so its start-up counts against it, most at small sizes.",
            "process_cpu_ms_per_delivery: the CPU time of the measured process and what it "
            "reaped; server and machine CPU include any other load on the machine.",
            f"pg-boss: {count} workers (one per destination), batches of {PGBOSS_BATCH} jobs "
            f"POSTed at once over {count * in_flight} keep-alive sockets (the engine's "
            "requests in flight), polling every 0.5 s (its minimum); the jobs are inserted "
            "before the run (boss.insert, in batches of 1,000), not timed.",
        ],
    }


def table(figures: dict[str, Any]) -> str:
    """The medians of the main figures, a path a line."""
    columns = [
        ("deliveries/s", "per_second"),
        ("steady/s", "steady_per_second"),
        ("own/s", "own_per_second"),
        ("process CPU ms/dlv", "process_cpu_ms_per_delivery"),
        ("own CPU ms/dlv", "own_cpu_ms_per_delivery"),
        ("server CPU ms/dlv", "server_cpu_ms_per_delivery"),
        ("machine CPU ms/dlv", "machine_cpu_ms_per_delivery"),
    ]
    lines = [f"{'path':<8}" + "".join(f"{title:>19}" for title, _ in columns)]
    for path, entry in figures.items():
        cells = [entry[metric]["median"] for _, metric in columns]
        lines.append(f"{path:<8}" + "".join(f"{'-' if c is None else c:>19}" for c in cells))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deliveries", type=int, default=FULL.deliver_rows)
    parser.add_argument("--rounds", type=int, default=3, help="runs of each path, interleaved")
    parser.add_argument("--out", type=Path, help="where to write the JSON (default: results)")
    args = parser.parse_args()
    if args.deliveries < 1 or args.rounds < 1:
        parser.error("--deliveries and --rounds must be at least 1")
    missing = node_packages(REPO / "node", PGBOSS)
    if missing is not None:
        sys.exit(f"bench.node_rate: {missing}")
    size = replace(
        FULL,
        name="node_rate",
        rounds=args.rounds,
        deliver_rows=args.deliveries,
        session_seconds=4 * 3600,
    )
    before = machine()
    with session(size) as bench:
        server = postgres(bench.scratch.server)
        result = measure(bench)
    document = {
        "command": shlex.join(["python", "-m", "bench.node_rate", *sys.argv[1:]]),
        "machine": {**before, "load_average_after": machine()["load_average"]},
        "postgres": server,
        **result,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(document, indent=2, default=str) + "\n")
        written = args.out
    else:
        written = write_results("node_rate", document)
    print(table(result["figures"]))
    print(f"written to {written}")


if __name__ == "__main__":
    main()
