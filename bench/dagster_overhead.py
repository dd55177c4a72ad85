"""What Dagster adds to a delivery run: the job next to the engine alone, in one script.

    .venv/bin/python bench/dagster_overhead.py [--rows 10000] [--destinations 10]

1. Wall time of a one-delivery ``deliver_webhooks`` run in process (cold: the first run of the
   process, which starts the executor's forkserver; warm: the next one).
2. Deliveries/s of a ``--rows`` run through the job (multiprocess executor, one mapped step
   per destination batch) and through the engine alone (``delivery_run.deliver_due``: the same
   sweeps, claim and batches in threads of one process), each on fresh rows, against the same
   fast receiver. Target: the job keeps at least 0.8x the engine's rate. The engine runs twice:
   with its defaults, which pin its threads to one CPU (``MEDIA_HOOKS_DELIVERY_CPU=auto``; the
   job's one-batch step processes are left unpinned), and with ``off``, like the job's steps.

Runs on a scratch database of the configured server (or the embedded default); Dagster's
storage is a second scratch database. Writes bench/results/dagster_overhead.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import tempfile
import time

from fast_receiver import fast_receiver
from scratch import (
    add_due_deliveries,
    add_unlimited_destinations,
    engine_rate,
    scratch_database,
    write_results,
)

from media_hooks.config import Settings


def timed_job_run(instance, config: dict, max_concurrent: int) -> tuple[float, object]:
    from media_hooks.orchestration.jobs import DELIVERY_EXECUTION
    from media_hooks.orchestration.running import execute_delivery

    execution = {"config": {**DELIVERY_EXECUTION["config"], "max_concurrent": max_concurrent}}
    start = time.perf_counter()
    run = execute_delivery(instance, config, execution=execution)
    seconds = time.perf_counter() - start
    if not run.success:
        raise SystemExit(f"delivery run {run.run_id} failed")
    return seconds, run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--destinations", type=int, default=10)
    parser.add_argument("--in-flight", type=int, default=4)
    parser.add_argument(
        "--max-concurrent", type=int, default=None, help="steps at once (default: the job's)"
    )
    args = parser.parse_args()
    from media_hooks.orchestration.jobs import MAX_CONCURRENT_STEPS

    steps = args.max_concurrent or MAX_CONCURRENT_STEPS
    home = tempfile.mkdtemp(prefix="mh_dagster_bench_")
    with (
        fast_receiver() as receiver_url,
        scratch_database() as url,
        scratch_database("mh_bench_dagster") as storage,
    ):
        from media_hooks.orchestration import instance as instance_module

        # Before the first run: the executor's forkserver keeps the environment it starts with.
        os.environ.update(
            MEDIA_HOOKS_DATABASE_URL=url,
            MEDIA_HOOKS_ALLOW_PRIVATE_URLS="1",
            MEDIA_HOOKS_DAGSTER_STORAGE_URL=instance_module.as_url(storage),
        )
        shutil.copyfile(instance_module.INSTANCE_TEMPLATE, os.path.join(home, "dagster.yaml"))
        from dagster import DagsterInstance

        add_unlimited_destinations(url, receiver_url, args.destinations, args.in_flight)
        with DagsterInstance.from_config(home) as instance:
            add_due_deliveries(url, "one-cold-", 1, 1)
            cold, _ = timed_job_run(instance, {}, steps)
            add_due_deliveries(url, "one-warm-", 1, 1)
            warm, _ = timed_job_run(instance, {}, steps)

            add_due_deliveries(url, "job-", args.rows, args.destinations)
            job_seconds, run = timed_job_run(instance, {"page_size": 1000}, steps)
            assert run.summary.totals["succeeded"] == args.rows, run.summary.totals
            job = args.rows / job_seconds

            engine = {}
            for cpu in ("auto", "off"):
                add_due_deliveries(url, f"engine-{cpu}-", args.rows, args.destinations)
                # Batches of 1,000, as the job's steps deliver them.
                settings = dataclasses.replace(
                    Settings.from_env(), allow_private_urls=True, delivery_cpu=cpu
                )
                engine[cpu] = engine_rate(
                    url, settings, args.rows, args.destinations, batch_size=1000
                )
    shutil.rmtree(home, ignore_errors=True)
    figures = {
        "one_delivery_run_seconds_cold": round(cold, 2),
        "one_delivery_run_seconds_warm": round(warm, 2),
        "rows": args.rows,
        "destinations": args.destinations,
        "mapped_steps": len(run.summary.per_destination),
        "max_concurrent_steps": steps,
        "job_run_seconds": round(job_seconds, 2),
        "job_deliveries_per_s": round(job),
        "engine_deliveries_per_s": round(engine["auto"]),
        "job_to_engine_ratio": round(job / engine["auto"], 3),
        # The job's steps are processes of one batch each, which MEDIA_HOOKS_DELIVERY_CPU=auto
        # leaves unpinned: beside the engine unpinned too, the ratio is Dagster's own cost.
        "engine_unpinned_deliveries_per_s": round(engine["off"]),
        "job_to_unpinned_engine_ratio": round(job / engine["off"], 3),
    }
    print(figures)
    print(f"written to {write_results('dagster_overhead', figures)}")


if __name__ == "__main__":
    main()
