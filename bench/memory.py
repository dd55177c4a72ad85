"""(6) Memory: peak RSS of a run's whole process tree over growing backlogs of due deliveries.

For each backlog (spread over a few destinations on the instant receiver) the engine and the
job each start a plain run, with their defaults, and the resident memory of the run's process
and all its descendants (any step processes an executor starts) is summed every 0.1 s. A
run is watched until the receiver has seen a few thousand of its deliveries (or it ends, or a
time limit passes) and then stopped: by then it has claimed, planned and started delivering,
so a run that holds the whole backlog shows it (a million rows would take far longer to
deliver than a benchmark has), and a bounded one shows its plateau. Target: the largest
backlog's peak within 1.2x of the smallest's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench import paths, stats
from bench.fast_receiver import answered
from bench.scratch import add_destinations, add_due_deliveries, spread, unlimited_destinations
from bench.session import Session

METRICS = {
    "peak_rss_mib": "peak RSS of the run's process tree, MiB",
    "delivered": "deliveries the receiver saw while the run was watched",
    "fairness": "least / most served destination's deliveries while watched",
    "seconds": "time watched, s",
}


def measure(session: Session) -> dict[str, Any]:
    size = session.size
    engine_seconds, job_seconds = size.memory_seconds

    def enough() -> Callable[[], bool]:
        """True once the receiver has answered ``memory_deliveries`` more requests."""
        base = answered(session.receiver)
        return lambda: answered(session.receiver) - base >= size.memory_deliveries

    engines: dict[str, Callable[[], dict]] = {}
    jobs: dict[str, Callable[[], dict]] = {}
    for backlog in size.memory_backlogs:

        def seed(url: str, backlog: int = backlog) -> None:
            targets = unlimited_destinations(session.receiver, size.memory_destinations, 4)
            add_destinations(url, targets)
            add_due_deliveries(url, "mem-", spread(backlog, [d.destination_id for d in targets]))

        template = f"memory-{size.memory_destinations}-{backlog}"
        session.scratch.template(template, seed)

        def engine(template: str = template) -> dict:
            with session.scratch.database(template) as url:
                run = paths.run_engine(session, url, timeout=engine_seconds, until=enough())
                return _watched(run, size.memory_destinations, size.memory_deliveries)

        def job(template: str = template) -> dict:
            with session.scratch.database(template) as url, session.dagster_storage() as storage:
                run = paths.run_job(session, url, storage, timeout=job_seconds, until=enough())
                return _watched(run, size.memory_destinations, size.memory_deliveries)

        engines[f"engine_{backlog}"] = engine
        if "memory" in size.job_in:
            jobs[f"job_{backlog}"] = job
    # The job's runs last: the slowest to start, they get what the engine's leave.
    figures = stats.summarize(session.interleaved({**engines, **jobs}), list(METRICS))
    smallest, largest = size.memory_backlogs[0], size.memory_backlogs[-1]
    ratios = []
    for path in ("engine", "job"):
        ratios += stats.ratios(
            figures, [(f"{path}_{largest}", f"{path}_{smallest}")], "peak_rss_mib"
        )
    targets = [
        stats.target(
            f"{r['of'].split('_')[0]}: peak RSS at {largest:,} due within 1.2x of at "
            f"{smallest:,} (issue 13, part 2)",
            r["value"],
            1.2,
            at_most=True,
            depends=(figures[r["of"]], figures[r["to"]]),
        )
        for r in ratios
    ]
    for path in ("engine", "job"):
        if f"{path}_{largest}" in figures:
            targets.append(
                stats.target(
                    f"{path}: destinations served round-robin on {largest:,} due: the least "
                    "served gets at least half the most served's deliveries (issue 13, part 2)",
                    figures[f"{path}_{largest}"]["fairness"]["median"],
                    0.5,
                    depends=(figures[f"{path}_{largest}"],),
                )
            )
    return {
        "title": "Memory: peak RSS of a run's process tree by backlog",
        "metrics": METRICS,
        "size": {
            "backlogs": list(size.memory_backlogs),
            "destinations": size.memory_destinations,
            "watched_until_deliveries": size.memory_deliveries,
            "watched_at_most_seconds": {"engine": engine_seconds, "job": job_seconds},
        },
        "figures": figures,
        "ratios": ratios,
        "targets": targets,
        "notes": [
            f"Each run is stopped (its whole process group) once the receiver has seen "
            f"{size.memory_deliveries:,} of its deliveries, or at its time limit: the figure "
            "is the peak while it was watched.",
            "fairness: deliveries of the least served destination over the most served's, "
            "while the run was watched. Both paths run a thread per due destination, each "
            "claiming its own pages of 250 as it sends them (round-robin: none waits behind "
            "another's backlog), with a connection each.",
        ]
        + (
            [f"Backlogs scaled down from 10,000 / 100,000 / 1,000,000 at the {size.name} size."]
            if size.memory_backlogs[-1] < 1_000_000
            else []
        ),
    }


def _watched(run: paths.PathRun, destinations: int, deliveries: int) -> dict[str, Any]:
    served = [len(times) for times in paths.starts_by_destination(run.starts).values()]
    served += [0] * (destinations - len(served))
    if not run.finished.complete and run.delivered < deliveries:
        # Stopped at its time limit before it got to delivering: its peak is a start-up's.
        return {
            "peak_rss_mib": run.finished.peak_rss_mib,
            "delivered": run.delivered,
            "seconds": run.finished.seconds,
            "error": f"stopped after {run.finished.seconds:.0f} s, before {deliveries:,} "
            f"deliveries ({run.delivered:,})",
        }
    return {
        "peak_rss_mib": run.finished.peak_rss_mib,
        "delivered": run.delivered,
        # 1: every destination got as many deliveries as the best served; 0: one got none.
        "fairness": min(served) / max(served) if max(served) else None,
        "seconds": run.finished.seconds,
        # Stopped at its time limit is expected here; only a failure is an error.
        "finished": run.finished.complete,
        **({"error": run.finished.failure()} if run.finished.returncode not in (0, None) else {}),
    }
