"""(3) Deliver to an instant receiver: the engine and the job beside three peers.

The same due deliveries (destinations whose limits never bind, on the receiver's instant
paths), delivered by:

- ``engine``: ``deliver_due`` in a process of its own (and ``engine_unpinned``: the same with
  ``MEDIA_HOOKS_DELIVERY_CPU=off``, its threads left to the scheduler);
- ``job``: ``media-hooks run --until-idle --json``, Dagster imported in the command's own
  process;
- ``bare_requests``: one ``requests.Session`` posting the same bodies one after another;
- ``rejected_design``: the design record's rejected design (select every pending row, POST
  each, mark success inline), one process, one loop;
- ``procrastinate``: a Procrastinate worker whose task POSTs the same bodies, as many jobs
  at once as the engine may have requests in flight (destinations x max in flight).

Two figures per run: deliveries per second of the process's wall time (what a user waits
for, interpreter and Dagster start included), and per second in steady state (the middle of
the run by the receiver's timestamps: the paths' delivery speed without their start-up).

Also the job's fixed cost: a run of 20 deliveries to one destination, and to N destinations,
as ``media-hooks run`` runs it; and the one-destination run launched as the daemon launches
it, in a fresh interpreter (``bench.launch_run``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

from bench import cpu, paths, peers, stats
from bench.fast_receiver import take_log
from bench.scratch import add_destinations, add_due_deliveries, spread, unlimited_destinations
from bench.session import Session

METRICS = {
    "per_second": "deliveries/s, end to end (process wall time)",
    "steady_per_second": "deliveries/s in steady state (receiver's timestamps)",
    "seconds": "process wall time, s",
    "peak_rss_mib": "peak RSS of the process tree, MiB",
    **cpu.METRICS,
}
FIXED_COST_PER_DESTINATION = 20


def procrastinate_available() -> bool:
    try:
        import procrastinate  # noqa: F401
    except ImportError:
        return False
    return True


def seeded(session: Session, destinations: int, rows: int, in_flight: int, queue: bool):
    def seed(url: str) -> None:
        targets = unlimited_destinations(session.receiver, destinations, in_flight)
        add_destinations(url, targets)
        add_due_deliveries(url, "dlv-", spread(rows, [d.destination_id for d in targets]))
        if queue:
            peers.install_procrastinate(url)

    return seed


def measure(session: Session) -> dict[str, Any]:
    size = session.size
    rows, count, in_flight = size.deliver_rows, size.deliver_destinations, size.deliver_in_flight
    queue = procrastinate_available()
    template = f"deliver-{count}-{rows}"
    session.scratch.template(template, seeded(session, count, rows, in_flight, queue))
    not_measured: dict[str, str] = {}

    def on_fresh(run: Callable[[str], paths.PathRun]) -> Callable[[], dict]:
        def measured() -> dict:
            with session.scratch.database(template) as url:
                return run(url).figures(expected=rows)

        return measured

    def job(url: str) -> paths.PathRun:
        with session.dagster_storage() as storage:
            return paths.run_job(session, url, storage)

    def procrastinate(url: str) -> paths.PathRun:
        peers.defer_procrastinate_jobs(url)
        return paths.run_peer(
            session, "procrastinate", url, "--concurrency", str(count * in_flight)
        )

    # Each path compared with the engine runs right after it in every round (a drift of the
    # machine's speed between the two then weighs least on their ratio); the slowest last, so
    # that it gets what the quicker ones leave of the first round's time.
    runners: dict[str, Callable[[], dict]] = {
        "engine": on_fresh(lambda url: paths.run_engine(session, url)),
    }
    if "deliver" in size.job_in:
        runners["job"] = on_fresh(job)
    else:
        not_measured["job"] = f"the job is not run in this measurement at the {size.name} size"
    # What MEDIA_HOOKS_DELIVERY_CPU=auto (the engine's one CPU) is worth here.
    runners["engine_unpinned"] = on_fresh(
        lambda url: paths.run_engine(session, url, MEDIA_HOOKS_DELIVERY_CPU="off")
    )
    runners["bare_requests"] = on_fresh(lambda url: paths.run_peer(session, "bare", url))
    runners["rejected_design"] = on_fresh(lambda url: paths.run_peer(session, "rejected", url))
    if queue:
        runners["procrastinate"] = on_fresh(procrastinate)
    else:
        not_measured["procrastinate"] = "not installed (pip install -e '.[bench]')"
    figures = stats.summarize(session.interleaved(runners), list(METRICS))
    pairs = [
        ("engine", "engine_unpinned"),
        ("engine", "bare_requests"),
        ("job", "bare_requests"),
        ("job", "engine"),
        ("engine", "rejected_design"),
        ("job", "rejected_design"),
        ("engine", "procrastinate"),
        ("job", "procrastinate"),
    ]
    ratios = stats.ratios(figures, pairs, "per_second")
    ratios += stats.ratios(figures, pairs, "steady_per_second")
    value = {(r["of"], r["to"], r["metric"]): r["value"] for r in ratios}.get
    return {
        "title": "Deliver, instant receiver: engine and job vs a bare requests loop, the "
        "record's rejected design and Procrastinate",
        "metrics": METRICS,
        "size": {
            "deliveries": rows,
            "destinations": count,
            "max_in_flight_per_destination": in_flight,
            "procrastinate_concurrency": count * in_flight,
        },
        "figures": figures,
        "not_measured": not_measured,
        "ratios": ratios,
        "targets": [
            stats.target(
                "job at least 0.95x the engine's deliveries/s in steady state, instant receiver",
                value(("job", "engine", "steady_per_second")),
                0.95,
                depends=(figures.get("job"), figures["engine"]),
            ),
            stats.target(
                "engine at least 3x Procrastinate (issue 13, part 3)",
                value(("engine", "procrastinate", "per_second")),
                3.0,
                depends=(figures["engine"], figures.get("procrastinate")),
            ),
            stats.target(
                "job at least 3x Procrastinate (issue 13, part 3)",
                value(("job", "procrastinate", "per_second")),
                3.0,
                depends=(figures.get("job"), figures.get("procrastinate")),
            ),
            stats.target(
                "engine at least 1,000 deliveries/s (issue 3)",
                figures["engine"]["per_second"]["median"],
                1000,
                depends=(figures["engine"],),
            ),
            stats.target(
                "engine at least 0.5x the bare requests loop (issue 3)",
                value(("engine", "bare_requests", "per_second")),
                0.5,
                depends=(figures["engine"], figures["bare_requests"]),
            ),
        ],
        "notes": [
            "Every path is a process of its own; per_second divides the deliveries by its "
            "whole wall time, so a path's start-up counts against it, most at small sizes.",
            "steady_per_second: requests the receiver saw per second over the middle 80% of "
            "the run's span, by the receiver's timestamps.",
            "job: Dagster is imported in the command's own process, so its per_second counts "
            "that start; its steady_per_second is the delivery itself.",
            "Procrastinate: its sync task runs in a thread pool sized to the concurrency; the "
            "jobs are deferred before the worker starts (not timed), as the rows are emitted "
            "before the engine starts.",
        ],
    }


def measure_fixed_cost(session: Session) -> dict[str, Any]:
    """A job run of 20 deliveries to 1 destination and to N, as ``media-hooks run`` runs it."""
    counts = session.size.fixed_cost_destinations
    runners: dict[str, Callable[[], dict]] = {}
    for count in counts:
        rows = FIXED_COST_PER_DESTINATION * count
        template = f"deliver-{count}-{rows}"
        session.scratch.template(template, seeded(session, count, rows, 4, False))

        def run(template: str = template, rows: int = rows) -> dict:
            with (
                session.scratch.database(template) as url,
                session.dagster_storage() as storage,
            ):
                return paths.run_job(session, url, storage).figures(expected=rows)

        runners[f"job_{count}_destinations"] = run
        if count == 1:
            runners["launched"] = partial(launched_run, session, template, rows)
    figures = stats.summarize(session.interleaved(runners), ["seconds"])
    medians = [figures[f"job_{n}_destinations"]["seconds"]["median"] for n in counts]
    one = medians[0] if counts and counts[0] == 1 else None
    slope = None
    if len(counts) >= 2 and None not in medians[:1] + medians[-1:]:
        slope = (medians[-1] - medians[0]) / (counts[-1] - counts[0])
    return {
        "title": "Job fixed cost: 20 deliveries per destination, instant receiver",
        "metrics": {
            "seconds": "wall time of `media-hooks run --until-idle --json`; of a launched run, "
            "from its launch to its end, s"
        },
        "size": {"destinations": list(counts), "deliveries_per_destination": 20},
        "figures": figures,
        "derived": {"seconds_per_extra_destination": slope},
        "ratios": stats.ratios(figures, [("launched", "job_1_destinations")], "seconds"),
        "targets": [
            stats.target(
                "a run of 20 deliveries to one destination under 3 s wall from the command's start",
                one,
                3.0,
                at_most=True,
                depends=list(figures.values())[:1],
            ),
            stats.target(
                "each extra destination adds under 50 ms (issue 13, part 1)",
                slope,
                0.05,
                at_most=True,
                depends=[figures[f"job_{n}_destinations"] for n in counts],
            ),
        ],
        "notes": [
            "job_N_destinations: `media-hooks run`, Dagster imported in the command's own process.",
            "launched: a run of the same 20 deliveries launched as the daemon launches the "
            "schedule's, the lag sensor's and the Launchpad's: a fresh interpreter running "
            "`dagster api execute_run`, as Dagster's DefaultRunLauncher has its code server "
            "start each run.",
        ],
    }


def launched_run(session: Session, template: str, rows: int) -> dict[str, Any]:
    """A ``deliver_webhooks`` run launched as the daemon launches one, from launch to end."""
    from dagster import DagsterRunStatus

    from bench.launch_run import create_run, daemon_instance, launch, wait_finished
    from media_hooks.orchestration.jobs import DELIVERY_EXECUTION
    from media_hooks.orchestration.running import delivery_run_config

    with session.scratch.database(template) as url, session.dagster_storage() as storage:
        with daemon_instance(session, url, storage) as (instance, env):
            run = create_run(instance, delivery_run_config({}, execution=DELIVERY_EXECUTION), {})
            take_log(session.receiver)
            started = time.perf_counter()
            process = launch(instance, run.run_id, env)
            run = wait_finished(instance, run.run_id, process, session.size.run_timeout)
            seconds = time.perf_counter() - started
            process.wait()
        delivered = len({start.webhook_id for start in take_log(session.receiver)})
    figures: dict[str, Any] = {"seconds": seconds, "delivered": delivered}
    if run.status != DagsterRunStatus.SUCCESS or delivered < rows:
        figures["error"] = f"run {run.status.value}, {delivered} of {rows} delivered"
    return figures
