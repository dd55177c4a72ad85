"""(8) The job's steps on Celery workers, beside the local default; and a worker killed mid-run.

Issue 31's targets, on request (``python -m bench --only celery``: it needs a broker, RabbitMQ
at ``MEDIA_HOOKS_BENCH_BROKER_URL``, default amqp://guest:guest@127.0.0.1:5672//, and the
``celery`` extra). One scenario (``Size.celery``: at full size 32 publishers at 10/s, answers
after 200 ms, 200 deliveries each), delivered by ``media-hooks run --until-idle --json`` three
ways, in turn in each round:

- ``local``: the local default, no broker (every step in the command's process);
- ``one_worker`` and ``two_workers``: ``MEDIA_HOOKS_CELERY_BROKER_URL`` set and that many
  ``media-hooks worker`` processes (each its own home and process group, started for the run
  on the run's database, before its clock starts): the run's shards follow the workers.

Each gives the publishers' fraction of the sum of limits in steady state (as the publishers
measurement counts it), the worst window of any publisher over ``burst + rate * t`` (as the
rate fidelity measurement counts it, in ms of arrival jitter), the CPU per delivery, and with
workers each one's share of the deliveries (from the run's Dagster events).

Then ``two_workers_one_killed``: the same with two workers, one SIGKILLed with its whole process
group once both shards deliver and a quarter of the deliveries have arrived. Its figures are
the evidence the issue asks for: deliveries lost, successes recorded twice, repeats at the
receiver with no recorded ambiguous attempt before them, ``media-hooks check``'s exit status,
and how long after the kill the killed worker's destinations received their last delivery.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from dagster import DagsterInstance

from bench import paths, publishers, stats
from bench.fast_receiver import answered
from bench.processes import python_command
from bench.scratch import Destination, add_destinations, add_due_deliveries
from bench.session import Session, environment
from media_hooks.devtools.celery_workers import (
    LocalWorkers,
    attempted_by_worker,
    delete_queues,
    executions,
)
from media_hooks.orchestration.celery.settings import CelerySettings
from media_hooks.orchestration.instance import STORAGE_VARIABLE, as_url
from media_hooks.orchestration.ops.delivery import Shard

BROKER_URL = os.environ.get("MEDIA_HOOKS_BENCH_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
ARRANGEMENTS = {"local": 0, "one_worker": 1, "two_workers": 2}
KILLED = "two_workers_one_killed"
# The rate fidelity measurement's allowance for a request's way from its permit to the
# receiver (bench/fidelity.py).
ARRIVAL_SLACK_MS = 20
KILL_AFTER_FRACTION = 0.25
WITHIN_SECONDS = 120
METRICS = {
    "fraction_of_limits": "achieved / sum of limits, steady state",
    "lowest_destination_fraction": "the slowest publisher's steady rate / its limit",
    "envelope_excess_ms": "worst publisher window over burst + rate x t, ms of arrival jitter",
    "machine_cpu_ms_per_delivery": "machine CPU per delivery, ms",
    "smallest_worker_share": "the least-loaded worker's share of the deliveries",
    "worker_cpu_ms_per_delivery": "the workers' own CPU per delivery (their processes' CPU "
    "time), ms",
    "seconds": "process wall time, s",
}
KILL_METRICS = {
    "lost": "deliveries not succeeded at the end",
    "succeeded_twice": "deliveries with two recorded successes",
    "unexplained_repeats": "ids the receiver saw again with no ambiguous attempt recorded",
    "check_exit": "`media-hooks check` exit status",
    "seconds_kill_to_last": "kill to the killed worker's destinations' last delivery, s",
    "fraction_of_limits": "achieved / sum of limits, steady state",
}
DATABASE_METRICS = {
    "limiter_writes_per_second_per_destination": "limiter row writes per second per publisher",
    "commits_per_delivery": "committed transactions on the project's database per delivery",
    "peak_connections": "the most connections to the project's database at once",
    "bytes_per_delivery": "table and index bytes per delivery (state, timer, body, history, "
    "outbox, attempt, identity)",
}
COUNTERS = """
SELECT (SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = 'destination_limiter'),
       (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database())
"""
CONNECTIONS = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
# A partitioned table's bytes are its partitions'.
BYTES = """
SELECT sum(pg_total_relation_size(c.oid))
FROM pg_class AS c
WHERE c.relkind = 'r'
  AND coalesce(pg_partition_root(c.oid), c.oid) = ANY (ARRAY[
      'delivery_state', 'delivery_timer', 'delivery_body', 'delivery_history',
      'dispatch_outbox_v3', 'delivery_attempt_v2', 'delivery_identity']::regclass[])
"""
SAMPLE_SECONDS = 0.5


def _seed(found: list[Destination], counts: dict[str, int]) -> Callable[[str], None]:
    def seed(url: str) -> None:
        add_destinations(url, found)
        add_due_deliveries(url, "celery-", counts)

    return seed


def _queue_prefix() -> str:
    return f"mh_bench_{os.getpid()}_{time.monotonic_ns() % 10**9}"


@contextmanager
def _deployment(session: Session, url: str, storage: str, workers: int) -> Iterator[tuple]:
    """The environment of a run with ``workers`` Celery workers started on its database (none:
    the local default), and the workers."""
    if not workers:
        yield {}, None
        return
    extra = {
        "MEDIA_HOOKS_CELERY_BROKER_URL": BROKER_URL,
        "MEDIA_HOOKS_CELERY_QUEUE": _queue_prefix(),
    }
    folder = session.home / f"workers-{extra['MEDIA_HOOKS_CELERY_QUEUE']}"
    try:
        with LocalWorkers(folder, session.env(url, storage, **extra)) as started:
            started.start(workers)
            yield extra, started
    finally:
        delete_queues(CelerySettings(BROKER_URL, extra["MEDIA_HOOKS_CELERY_QUEUE"]))


def _instance(session: Session, storage: str) -> DagsterInstance:
    with environment(**{STORAGE_VARIABLE: as_url(storage)}):
        return DagsterInstance.from_config(str(session.dagster_home()))


def _envelope_ms(run: paths.PathRun, found: list[Destination]) -> float | None:
    by_destination = paths.starts_by_destination(run.starts)
    worst = None
    for d in found:
        times = by_destination.get(d.destination_id)
        if times:
            excess, _ = stats.envelope_excess(times, d.rate_per_second, d.burst)
            ms = max(0.0, excess) / d.rate_per_second * 1000
            worst = ms if worst is None else max(worst, ms)
    return worst


def _worker_share(session: Session, storage: str, run: paths.PathRun) -> float | None:
    """The least-loaded worker's share of the deliveries its run's workers attempted."""
    if not isinstance(run.reported, dict):
        return None
    counted: Counter = Counter()
    with _instance(session, storage) as instance:
        for summary in run.reported["runs"]:
            counted.update(attempted_by_worker(instance, summary["run_id"]))
    total = sum(counted.values())
    return min(counted.values()) / total if total else None


class _Database:
    """What a run asked of the project's database: limiter writes, commits, connections at
    once (sampled), and the bytes its rows take."""

    def __init__(self, url: str, destinations: int) -> None:
        self.url, self.destinations = url, destinations
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="connections", daemon=True)

    def _read(self, statement: str) -> tuple:
        with psycopg.connect(self.url, autocommit=True) as conn:
            return conn.execute(statement).fetchone()

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            # Less this sampler's own connection.
            self.peak = max(self.peak, self._read(CONNECTIONS)[0] - 1)

    def __enter__(self) -> _Database:
        self.before = self._read(COUNTERS)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def figures(self, run: paths.PathRun) -> dict[str, float | None]:
        writes, commits = (a - b for a, b in zip(self._read(COUNTERS), self.before, strict=True))
        times = [start.at for start in run.starts]
        span = max(times) - min(times) if len(times) > 1 else None
        delivered = run.delivered or None
        return {
            "limiter_writes_per_second_per_destination": (
                writes / span / self.destinations if span else None
            ),
            "commits_per_delivery": commits / delivered if delivered else None,
            "peak_connections": self.peak,
            "bytes_per_delivery": int(self._read(BYTES)[0]) / delivered if delivered else None,
        }


def _arrangement(session: Session, template: str, found, expected: int, workers: int):
    def run() -> dict[str, Any]:
        with (
            session.scratch.database(template) as url,
            session.dagster_storage() as storage,
            _deployment(session, url, storage, workers) as (extra, started),
        ):
            used = started.cpu_seconds() if started else None
            with _Database(url, len(found)) as database:
                done = paths.run_job(session, url, storage, **extra)
            figures = publishers.steady_figures(done, found, expected)
            figures.update(database.figures(done))
            if started and done.delivered:
                figures["worker_cpu_ms_per_delivery"] = (
                    (started.cpu_seconds() - used) * 1000 / done.delivered
                )
            figures["envelope_excess_ms"] = _envelope_ms(done, found)
            if workers:
                figures["smallest_worker_share"] = _worker_share(session, storage, done)
            return figures

    return run


def _victim(found: list[Destination]) -> Shard:
    """Of a run's two shards, the one serving the most publishers: its worker is killed."""
    shards = [Shard(index, 2, prepared=None) for index in range(2)]
    return max(shards, key=lambda s: sum(s.serves(d.destination_id) for d in found))


class _Killer:
    """Kills the worker executing ``shard`` once both shards deliver and a quarter of the
    deliveries have reached the receiver; remembers which one and when."""

    def __init__(
        self, session: Session, storage: str, workers: LocalWorkers, expected: int, shard: Shard
    ):
        self.session, self.storage, self.workers = session, storage, workers
        self.expected = expected
        self.shard = shard
        self.step = f"deliver_shard[{shard.mapping_key}]"
        self.killed_at: float | None = None
        self.victim: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="killer", daemon=True)

    def __enter__(self) -> _Killer:
        self.first = answered(self.session.receiver)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        with _instance(self.session, self.storage) as instance:
            while not self._stop.wait(0.2):
                runs = instance.get_runs(limit=1)
                shards = executions(instance, runs[0].run_id) if runs else {}
                executing = shards.get(self.step)
                arrived = answered(self.session.receiver) - self.first
                if (
                    executing
                    and len(shards) >= 3
                    and arrived >= KILL_AFTER_FRACTION * self.expected
                ):
                    (worker,) = [w for w in self.workers.workers if w.name == executing[-1]]
                    self.killed_at = time.time()
                    self.workers.kill(worker)
                    self.victim = worker.name
                    return


def _killed(session: Session, template: str, found, expected: int):
    def run() -> dict[str, Any]:
        with (
            session.scratch.database(template) as url,
            session.dagster_storage() as storage,
            _deployment(session, url, storage, 2) as (extra, workers),
        ):
            with _Killer(session, storage, workers, expected, _victim(found)) as killer:
                done = paths.run_job(session, url, storage, **extra)
            figures = publishers.steady_figures(done, found, expected)
            if killer.killed_at is None:
                return {**figures, "error": "the run ended before a worker could be killed"}
            figures.update(_evidence(session, url, storage, done, killer))
            return figures

    return run


def _evidence(session, url, storage, done: paths.PathRun, killer: _Killer) -> dict:
    """What the kill left: lost, doubled, unexplained repeats, the invariants, the catch-up."""
    with psycopg.connect(url) as conn:
        lost = conn.execute(
            "SELECT count(*) FROM webhook_delivery WHERE state <> 'succeeded'"
        ).fetchone()[0]
        twice = conn.execute(
            "SELECT count(*) FROM (SELECT delivery_id FROM delivery_attempt "
            "WHERE outcome = 'success' GROUP BY 1 HAVING count(*) > 1) AS doubled"
        ).fetchone()[0]
        ambiguous = {
            row[0]
            for row in conn.execute(
                "SELECT DISTINCT delivery_id FROM delivery_attempt WHERE outcome = 'ambiguous'"
            )
        }
    seen = Counter(start.webhook_id for start in done.starts)
    unexplained = [i for i, n in seen.items() if n > 1 and i not in ambiguous]
    check = subprocess.run(
        python_command("media_hooks.cli", "check"),
        env=session.env(url, storage),
        capture_output=True,
        timeout=120,
    )
    theirs = [s.at for s in done.starts if killer.shard.serves(s.path.rsplit("/", 1)[-1])]
    with _instance(session, storage) as instance:
        runs = [r["run_id"] for r in done.reported["runs"]] if done.reported else []
        again = executions(instance, runs[0]).get(killer.step, []) if runs else []
    return {
        "lost": lost,
        "succeeded_twice": twice,
        "unexplained_repeats": len(unexplained),
        "check_exit": check.returncode,
        "seconds_kill_to_last": max(theirs) - killer.killed_at if theirs else None,
        "killed": killer.victim,
        "executed_by": again,
        "repeats": sum(1 for n in seen.values() if n > 1),
        "job_runs": paths.job_runs(done),
    }


def measure(session: Session) -> dict[str, Any]:
    scenario = session.size.celery
    found = publishers.destinations(session.receiver, scenario)
    counts = publishers.backlog(scenario, found)
    expected = sum(counts.values())
    template = f"celery-{session.size.name}"
    session.scratch.template(template, _seed(found, counts))
    runners = {
        name: _arrangement(session, template, found, expected, workers)
        for name, workers in ARRANGEMENTS.items()
    }
    runs = session.interleaved(runners)
    with session.share(1):
        killed = [_killed(session, template, found, expected)()]
    figures = stats.summarize(runs, [*METRICS, *DATABASE_METRICS])
    figures[KILLED] = stats.summarize({KILLED: killed}, list(KILL_METRICS))[KILLED]
    evidence = killed[-1]
    targets = []
    for name in ARRANGEMENTS:
        entry = figures[name]
        targets += [
            stats.target(
                f"{name}: at least 0.9x the sum of limits in steady state (issue 31)",
                entry["fraction_of_limits"]["median"],
                0.9,
                depends=(entry,),
            ),
            stats.target(
                f"{name}: no publisher window above burst + rate x t, beyond "
                f"{ARRIVAL_SLACK_MS} ms of arrival jitter, every run (issue 31)",
                entry["envelope_excess_ms"]["max"],
                ARRIVAL_SLACK_MS,
                at_most=True,
                depends=(entry,),
            ),
        ]
    kill = figures[KILLED]
    for metric, words in (
        ("lost", "no delivery lost"),
        ("succeeded_twice", "no success recorded twice"),
        ("unexplained_repeats", "every repeat explained by a recorded ambiguous attempt"),
        ("check_exit", "`media-hooks check` holds"),
    ):
        targets.append(
            stats.target(
                f"worker SIGKILLed: {words} (issue 31)",
                kill[metric]["max"],
                0,
                at_most=True,
                depends=(kill,),
            )
        )
    targets.append(
        stats.target(
            f"worker SIGKILLed: its destinations delivered within {WITHIN_SECONDS} s (issue 31)",
            kill["seconds_kill_to_last"]["max"],
            WITHIN_SECONDS,
            at_most=True,
            depends=(kill,),
        )
    )
    return {
        "title": "Celery workers: the same publishers delivered locally, by one worker and by two",
        "metrics": {
            **METRICS,
            **{k: v for k, v in KILL_METRICS.items() if k not in METRICS},
            **DATABASE_METRICS,
        },
        "size": {
            "destinations": len(found),
            "rate_per_second": found[0].rate_per_second,
            "latency_ms": scenario.latencies_ms[0],
            "deliveries": expected,
            "sum_of_limits_per_second": round(sum(d.rate_per_second for d in found), 1),
        },
        "figures": figures,
        "ratios": stats.ratios(
            figures, [("two_workers", "local"), ("one_worker", "local")], "fraction_of_limits"
        ),
        "targets": targets,
        "killed": {k: v for k, v in evidence.items() if k not in KILL_METRICS and k not in METRICS},
        "notes": [
            "Every arrangement runs `media-hooks run --until-idle --json`; with workers, "
            "MEDIA_HOOKS_CELERY_BROKER_URL is set and each step is a Celery task on a "
            "`media-hooks worker` (its own home, its own process group), started on the run's "
            "database before the run's clock starts. The broker and every worker share this "
            "machine's CPUs with the server and the receiver.",
            "Steady state and the envelope as in sections 4 and 5: the middle 80% of the run "
            "by the receiver's timestamps; every window of each publisher's requests.",
            "Worker share: each shard's attempted deliveries, credited to the worker whose "
            "execution of it ended it (Dagster's events of the run).",
            "Database: limiter writes from pg_stat_user_tables (destination_limiter) over the "
            "receiver's span of the run; commits from pg_stat_database; connections sampled "
            f"every {SAMPLE_SECONDS:g} s from pg_stat_activity (the run's database only: "
            "Dagster's storage is another); bytes of the four tables a delivery writes, after "
            "the run, over the deliveries.",
            f"Killed: once both shards deliver and {KILL_AFTER_FRACTION:.0%} of the deliveries "
            "have arrived, the worker executing the shard of the most publishers is SIGKILLed "
            "with its process "
            "group; its task goes back to the queue, to the other worker, which first releases "
            "what the dead attempt left claimed. `killed` names the worker and the workers that "
            "executed its shard.",
        ],
    }
