"""(4) Many slow publishers: the fraction of the sum of their limits a run achieves.

Issue 13's two scenarios (``bench.sizes``): destinations each with a start-rate limit and a
receiver path that answers after its own latency. Each destination's backlog lasts the same
time at its limit (a fixed count each, or a total split in proportion to the limits), so in
an ideal run every destination is busy until the end.

Steady state is the middle 80% of the run by the receiver's timestamps (from the first
request to the last, without the first and last tenth): start-up, the first burst of each
token bucket and the tail are left out. The figure is the requests the receiver saw in that
window per second, over the sum of the limits. The engine and the job run the same backlog.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

from bench import cpu, paths, stats
from bench.scratch import Destination, add_destinations, add_due_deliveries
from bench.session import Session
from bench.sizes import Publishers

METRICS = {
    "fraction_of_limits": "achieved / sum of limits, steady state",
    "lowest_destination_fraction": "the slowest destination's steady rate / its limit",
    "steady_per_second": "requests/s, steady state",
    "seconds": "process wall time, s",
    **cpu.METRICS,
    "cpu_ceiling_fraction": "the most the machine's CPUs allow at that CPU per delivery, "
    "over the sum of limits",
}


def spread_evenly(low: float, high: float, count: int) -> list[float]:
    if count == 1:
        return [low]
    return [low + (high - low) * n / (count - 1) for n in range(count)]


def destinations(receiver: str, scenario: Publishers) -> list[Destination]:
    """The scenario's destinations: rates spread low to high, latencies spread in another
    order (so a fast limit does not always meet a fast receiver), burst a tenth of a second's
    starts, and enough requests in flight that only the start rate binds."""
    count = scenario.destinations
    rates = spread_evenly(*scenario.rates, count)
    latencies = spread_evenly(*scenario.latencies_ms, count)
    # A stride coprime with the count visits every latency once, out of the rates' order.
    stride = next(s for s in (7, 11, 13, 17, 1) if math.gcd(s, count) == 1)
    found = []
    for n, rate in enumerate(rates):
        latency_ms = round(latencies[(n * stride) % count])
        found.append(
            Destination(
                destination_id=f"pub-{n + 1}",
                url=f"{receiver}{latency_ms}/pub-{n + 1}",
                rate_per_second=round(rate, 2),
                burst=max(1, math.ceil(rate / 10)),
                max_in_flight=math.ceil(rate * latency_ms / 1000 * 1.5) + 2,
            )
        )
    return found


def backlog(scenario: Publishers, found: list[Destination]) -> dict[str, int]:
    """Deliveries per destination: a fixed count, a total in proportion to the limits, or
    ``seconds`` at each limit (plus its burst)."""
    if scenario.per_destination is not None:
        return {d.destination_id: scenario.per_destination for d in found}
    total_rate = sum(d.rate_per_second for d in found)
    if scenario.total is not None:
        return {
            d.destination_id: round(scenario.total * d.rate_per_second / total_rate) for d in found
        }
    return {d.destination_id: round(d.rate_per_second * scenario.seconds) + d.burst for d in found}


def steady_figures(run: paths.PathRun, found: list[Destination], expected: int) -> dict:
    # The figure is the receiver's: a job stopped while it checked for more work after
    # delivering everything still measured its steady state.
    figures = run.figures(expected=expected, wall=False)
    times = [start.at for start in run.starts]
    if len(times) < 3:
        return {**figures, "fraction_of_limits": None, "lowest_destination_fraction": None}
    low, high = stats.steady_window(times)
    width = stats.plot_bin(times)
    total_rate = sum(d.rate_per_second for d in found)
    achieved = stats.rate_over(times, low, high)
    by_destination = paths.starts_by_destination(run.starts)
    fractions = []
    for d in found:
        rate = stats.steady_rate(by_destination.get(d.destination_id, []))
        fractions.append(None if rate is None else rate / d.rate_per_second)
    known = [f for f in fractions if f is not None]
    return {
        **figures,
        "fraction_of_limits": None if achieved is None else achieved / total_rate,
        "lowest_destination_fraction": min(known) if known else None,
        "cpu_ceiling_fraction": cpu_ceiling(figures, total_rate),
        # For the plot: starts per second over the run, against the sum of limits.
        "series": {"bin_seconds": width, "per_second": stats.per_second(times, times[0], width)},
    }


def cpu_ceiling(figures: dict[str, Any], total_rate: float) -> float | None:
    """Deliveries/s the machine's CPUs could sustain at the run's CPU per delivery (delivering
    side, server and receiver together), over the sum of limits: below the target, no
    scheduling of the same work reaches it on this machine."""
    used = figures.get("machine_cpu_ms_per_delivery")
    if not used:
        return None
    return len(os.sched_getaffinity(0)) * 1000 / used / total_rate


def measure_scenario(session: Session, name: str, scenario: Publishers) -> dict[str, Any]:
    found = destinations(session.receiver, scenario)
    counts = backlog(scenario, found)
    expected = sum(counts.values())

    def seed(url: str) -> None:
        add_destinations(url, found)
        add_due_deliveries(url, f"{name}-", counts)

    template = f"publishers-{name}-{session.size.name}"
    session.scratch.template(template, seed)

    def engine() -> dict:
        with session.scratch.database(template) as url:
            return steady_figures(paths.run_engine(session, url), found, expected)

    def job() -> dict:
        with session.scratch.database(template) as url, session.dagster_storage() as storage:
            return steady_figures(paths.run_job(session, url, storage), found, expected)

    runners: dict[str, Callable[[], dict]] = {"engine": engine}
    if "publishers" in session.size.job_in:
        runners["job"] = job
    runs = session.interleaved(runners)
    figures = stats.summarize(runs, list(METRICS))
    sum_of_limits = sum(d.rate_per_second for d in found)
    return {
        "scenario": {
            "destinations": len(found),
            "rates_per_second": "{:g}–{:g}".format(*scenario.rates),
            "latencies_ms": "{}–{}".format(*scenario.latencies_ms),
            "deliveries": expected,
            "sum_of_limits_per_second": round(sum_of_limits, 1),
            "ideal_seconds": round(
                max(counts[d.destination_id] / d.rate_per_second for d in found), 2
            ),
        },
        "figures": figures,
        # The last run of each path, over time, for the plot.
        "series": {path: results[-1].get("series") for path, results in runs.items() if results},
    }


def measure(session: Session) -> dict[str, Any]:
    scenarios = {}
    for number, (name, scenario) in enumerate(session.size.publishers.items()):
        with session.share(len(session.size.publishers) - number):
            scenarios[name] = measure_scenario(session, name, scenario)
    figures = {
        f"{path}_{name}": entry
        for name, scenario in scenarios.items()
        for path, entry in scenario["figures"].items()
    }
    ratios = []
    targets = []
    for name in scenarios:
        ratios += stats.ratios(figures, [(f"job_{name}", f"engine_{name}")], "fraction_of_limits")
        job, engine = figures.get(f"job_{name}"), figures.get(f"engine_{name}")
        for path, entry in (("job", job), ("engine", engine)):
            targets.append(
                stats.target(
                    f"{path} at least 0.9x the sum of limits in steady state, scenario {name} "
                    "(issue 13, part 1)",
                    entry["fraction_of_limits"]["median"] if entry else None,
                    0.9,
                    depends=(entry,),
                )
            )
        targets.append(
            stats.target(
                f"job at least 0.9x the engine, scenario {name} (issue 13, part 1)",
                ratios[-1]["value"] if ratios and ratios[-1]["of"] == f"job_{name}" else None,
                0.9,
                depends=(job, engine),
            )
        )
    return {
        "title": "Many slow publishers: fraction of the sum of limits in steady state",
        "metrics": METRICS,
        "size": {name: scenario["scenario"] for name, scenario in scenarios.items()},
        "figures": figures,
        "series": {name: scenario["series"] for name, scenario in scenarios.items()},
        "ratios": ratios,
        "targets": targets,
        "notes": [
            "Steady state: the middle 80% of the run by the receiver's timestamps (first to "
            "last request, less the first and last tenth); all destinations' requests in that "
            "window per second, over the sum of their limits.",
            "Each destination: burst = a tenth of a second's starts (at least 1), max in flight "
            "1.5x rate x latency + 2 (only the start rate binds); backlogs last equally long "
            "at each limit.",
            "CPU per delivery: the machine's busy time over the run (bench/cpu.py), the "
            "server's read from the operating system, the delivering side's the rest less "
            "the receiver's. The CPU ceiling: the usable CPUs over the machine's CPU per "
            "delivery, over the sum of limits.",
        ],
    }
