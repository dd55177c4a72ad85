"""Delivery throughput: the engine against a local receiver that answers 200 at once.

    .venv/bin/python bench/delivery.py [--rows 10000] [--destinations 10] [--in-flight 4]

10 destinations without effective rate limits, one process. Reports deliveries/s of a whole
run (sweeps, claim, relay, permits, leases, sends, outcome records) beside a bare
``requests.Session`` loop posting the same bodies to the same receiver in the same run
(targets: at least 1,000 deliveries/s and at least 0.5x the bare loop). The engine runs with
its default settings (``MEDIA_HOOKS_DELIVERY_CPU=auto``: a run's threads on one CPU) and again
with ``off``, each on a fresh backlog, to show what the pinning is worth. Writes
bench/results/delivery.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

import psycopg
import requests
from fast_receiver import fast_receiver
from scratch import (
    add_due_deliveries,
    add_unlimited_destinations,
    engine_rate,
    scratch_database,
    write_results,
)

from media_hooks import affinity
from media_hooks.config import Settings


def bare_loop(url: str, bodies: list[bytes]) -> float:
    """Requests/s of a plain keep-alive session posting ``bodies`` one after another."""
    session = requests.Session()
    session.trust_env = False
    start = time.perf_counter()
    for n, body in enumerate(bodies):
        response = session.post(
            url, data=body, headers={"Content-Type": "application/json", "webhook-id": f"b-{n}"}
        )
        response.content  # noqa: B018 - read the answer as the engine does
    return len(bodies) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--destinations", type=int, default=10)
    parser.add_argument("--in-flight", type=int, default=4)
    args = parser.parse_args()
    settings = dataclasses.replace(Settings.from_env(), allow_private_urls=True)
    engine: dict[str, float] = {}
    with fast_receiver() as receiver_url, scratch_database() as url:
        add_unlimited_destinations(url, receiver_url, args.destinations, args.in_flight)
        for cpu in (affinity.AUTO, affinity.OFF):
            add_due_deliveries(url, f"bench-{cpu}-", args.rows, args.destinations)
            if cpu == affinity.AUTO:
                with psycopg.connect(url, autocommit=True) as conn:
                    bodies = [
                        bytes(r[0])
                        for r in conn.execute(
                            "SELECT body FROM webhook_delivery LIMIT 3000"
                        ).fetchall()
                    ]
                bare = bare_loop(receiver_url, bodies)
            engine[cpu] = engine_rate(
                url,
                dataclasses.replace(settings, delivery_cpu=cpu),
                args.rows,
                args.destinations,
                batch_size=args.rows,
            )
    figures = {
        "rows": args.rows,
        "destinations": args.destinations,
        "max_in_flight_per_destination": args.in_flight,
        "engine_deliveries_per_s": round(engine[affinity.AUTO]),
        "bare_requests_loop_per_s": round(bare),
        "ratio_to_bare": round(engine[affinity.AUTO] / bare, 3),
        "engine_unpinned_deliveries_per_s": round(engine[affinity.OFF]),
        "unpinned_ratio_to_bare": round(engine[affinity.OFF] / bare, 3),
        "load_average_1min_after": round(os.getloadavg()[0], 2),
    }
    print(figures)
    print(f"written to {write_results('delivery', figures)}")


if __name__ == "__main__":
    main()
