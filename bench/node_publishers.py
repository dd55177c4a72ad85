"""The Node.js worker on slow publishers: the fraction of the sum of their limits it achieves.

Issue 33's target: 16 destinations at 10 starts/s each, every receiver answering after 200 ms;
the Node worker (``node node/bin/media-hooks-node.js worker pub-1 ... pub-16``) should reach at
least 0.9x the sum of limits (160/s) in steady state. Each destination's backlog lasts
``--seconds`` at its limit, so in an ideal run every destination is busy until the end. The
Python engine (media_hooks.engine.delivery_run.deliver_due, in a process of its own) runs the same
backlog in alternating rounds, for comparison on the same machine in the same minutes.

Steady state is measured as bench/publishers.py measures it: the middle 80% of the run by the
receiver's timestamps (bench.fast_receiver, its own process), the requests it saw in that
window per second over the sum of limits; and each destination's steady rate over its limit
(the slowest is reported). The limits are kept at the database, where each start is granted;
at the receiver, arrival jitter (the host's scheduling, the network stack) adds to them, so the
envelope figure is how early the worst start arrived against burst + rate * t, in ms (0: every
destination's arrivals fit their limit exactly), for both paths alike.

    python -m bench.node_publishers [--rounds 2] [--seconds 30] [--out PATH]

Prints the figures and writes them to bench/results/node_publishers.json (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import stats
from bench.fast_receiver import Start, fast_receiver, take_log
from bench.paths import starts_by_destination
from bench.processes import NODE_CLI, REPO
from bench.scratch import (
    Destination,
    Scratch,
    add_destinations,
    add_due_deliveries,
    server_url,
    write_results,
)

DESTINATIONS = 16
RATE = 10.0
LATENCY_MS = 200
TARGET = 0.9
PYTHON_RUN = """
import sys
from media_hooks.store import db
from media_hooks.core.config import Settings
from media_hooks.engine.delivery_run import deliver_due
with db.open_pool(sys.argv[1], max_size=24) as pool:
    report = deliver_due(pool, sys.argv[2], Settings.from_env())
print(report.totals.succeeded)
"""


def publishers(receiver: str) -> list[Destination]:
    """16 destinations at 10/s, 200 ms answers, a tenth of a second's burst, and enough
    requests in flight that only the start rate binds (as bench/publishers.py sizes them)."""
    in_flight = math.ceil(RATE * LATENCY_MS / 1000 * 1.5) + 2
    return [
        Destination(
            destination_id=f"pub-{n}",
            url=f"{receiver}{LATENCY_MS}/pub-{n}",
            rate_per_second=RATE,
            burst=max(1, math.ceil(RATE / 10)),
            max_in_flight=in_flight,
        )
        for n in range(1, DESTINATIONS + 1)
    ]


def environment(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEDIA_HOOKS_", "DAGSTER_"))}
    env.update(MEDIA_HOOKS_DATABASE_URL=url, MEDIA_HOOKS_ALLOW_PRIVATE_URLS="1")
    env["PYTHONPATH"] = str(REPO)
    return env


def run_node(url: str, found: list[Destination]) -> float:
    command = ["node", str(NODE_CLI), "worker", *(d.destination_id for d in found), "--json"]
    started = time.monotonic()
    done = subprocess.run(command, env=environment(url), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the Node worker failed: {done.stderr.strip()[-500:]}")
    return time.monotonic() - started


def run_python(url: str, found: list[Destination]) -> float:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", PYTHON_RUN, url, "bench-python"],
        env=environment(url),
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the Python engine failed: {done.stderr.strip()[-500:]}")
    return time.monotonic() - started


def figures(starts: list[Start], found: list[Destination], seconds: float) -> dict[str, Any]:
    times = [s.at for s in starts]
    low, high = stats.steady_window(times)
    total = sum(d.rate_per_second for d in found)
    by_destination = starts_by_destination(starts)
    fractions = []
    early = []
    for d in found:
        own = sorted(by_destination.get(d.destination_id, []))
        rate = stats.steady_rate(own)
        fractions.append(None if rate is None else rate / d.rate_per_second)
        if own:
            worst = stats.envelope_excess(own, d.rate_per_second, d.burst)[0]
            early.append(max(worst, 0.0) / d.rate_per_second * 1000)
    achieved = stats.rate_over(times, low, high)
    return {
        "delivered": len(starts),
        "seconds": round(seconds, 2),
        "steady_per_second": None if achieved is None else round(achieved, 2),
        "fraction_of_limits": None if achieved is None else round(achieved / total, 4),
        "lowest_destination_fraction": round(min(f for f in fractions if f is not None), 4),
        "worst_early_arrival_ms": round(max(early), 1),
    }


def measure(rounds: int, seconds: float) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"node": [], "python": []}
    with fast_receiver() as receiver, Scratch(server_url(), "mh_bench_node") as scratch:
        found = publishers(receiver)
        per_destination = round(RATE * seconds) + found[0].burst

        def seed(url: str) -> None:
            add_destinations(url, found)
            add_due_deliveries(url, "node-", {d.destination_id: per_destination for d in found})

        scratch.template("node-publishers", seed)
        for _ in range(rounds):
            for path, runner in (("node", run_node), ("python", run_python)):
                with scratch.database("node-publishers") as url:
                    take_log(receiver)
                    wall = runner(url, found)
                    runs[path].append(figures(take_log(receiver), found, wall))
    summary = {
        path: {
            name: stats.summary([r[name] for r in results])
            for name in (
                "fraction_of_limits",
                "lowest_destination_fraction",
                "steady_per_second",
                "worst_early_arrival_ms",
            )
        }
        for path, results in runs.items()
    }
    node = summary["node"]["fraction_of_limits"]["median"]
    return {
        "title": "The Node.js worker on 16 publishers at 10/s with 200 ms answers",
        "scenario": {
            "destinations": DESTINATIONS,
            "rate_per_second": RATE,
            "latency_ms": LATENCY_MS,
            "deliveries": per_destination * DESTINATIONS,
            "sum_of_limits_per_second": RATE * DESTINATIONS,
            "rounds": rounds,
        },
        "runs": runs,
        "summary": summary,
        "targets": [
            stats.target(
                f"the Node worker at least {TARGET}x the sum of limits in steady state (issue 33)",
                node,
                TARGET,
            )
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="runs of each path, alternating")
    parser.add_argument("--seconds", type=float, default=30.0, help="backlog at each limit")
    parser.add_argument("--out", type=Path, help="where to write the JSON (default: results)")
    args = parser.parse_args()
    if shutil.which("node") is None:
        sys.exit("bench.node_publishers: node is not installed")
    result = measure(args.rounds, args.seconds)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        written = args.out
    else:
        written = write_results("node_publishers", result)
    print(json.dumps({"summary": result["summary"], "targets": result["targets"]}, indent=2))
    print(f"written to {written}")


if __name__ == "__main__":
    main()
