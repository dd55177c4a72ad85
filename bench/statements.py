"""What the worker's statements cost the database: server CPU per call and per row.

    .venv/bin/python -m bench.statements [--rows 8000] [--lease-batch 4] [--record-batch 25]

One destination, ``--rows`` due deliveries whose statistics were taken while they were all
pending (as right after a claim in production: autovacuum has not caught up), then, on one
connection and one thread: the claim (which publishes), ``lease_with_permits`` in steps of
``--lease-batch`` (a worker's step: permits, release and lease in one call), and
``record_classified_outcomes`` (``leases.record_classified``: the database decides each next
state) in batches of ``--record-batch``: the statements this release's workers run. The
server's CPU time is read from /proc for that connection's backend, so the figures are the
database's own work, not the client's. Writes bench/results/statements.json.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Callable

import psycopg
from psycopg.rows import dict_row

from bench.scratch import (
    CLAIMED_TABLES,
    add_destinations,
    add_due_deliveries,
    scratch_database,
    unlimited_destinations,
    write_results,
)
from media_hooks.outbox import leases
from media_hooks.outbox.claims import claim_destination_page
from media_hooks.outbox.cohort import Cohort
from media_hooks.outbox.leases import Classified, Lease, Message

TICKS = os.sysconf("SC_CLK_TCK")


def backend_cpu_seconds(pid: int) -> float:
    """User + system CPU of one server process (Linux /proc; the server runs here)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def measured(pid: int, work: Callable[[], int]) -> tuple[float, float, int]:
    """(server CPU seconds, wall seconds, calls) of ``work``, which returns its call count."""
    cpu, wall = backend_cpu_seconds(pid), time.perf_counter()
    calls = work()
    return backend_cpu_seconds(pid) - cpu, time.perf_counter() - wall, calls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=8000)
    parser.add_argument("--lease-batch", type=int, default=4)
    parser.add_argument("--record-batch", type=int, default=25)
    args = parser.parse_args()
    rows, k, m = args.rows, args.lease_batch, args.record_batch
    with scratch_database() as url:
        add_destinations(url, unlimited_destinations("http://127.0.0.1:9/", 1, 64))
        add_due_deliveries(url, "s-", {"dest-1": rows})  # analyzed while pending
        with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
            for table in CLAIMED_TABLES:
                conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
            pid = conn.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"]
            messages: list[Message] = []
            taken: list[Lease] = []

            def claim() -> int:
                calls = 1  # the last, short page
                while page := claim_destination_page(conn, "run-1", "dest-1", Cohort(), 1000):
                    messages.extend(page)
                    calls += 1
                return calls

            def lease() -> int:
                slots: list[int] = []
                for start in range(0, rows, k):
                    step = leases.lease_with_permits(
                        conn,
                        "run-1",
                        "dest-1",
                        messages[start : start + k],
                        holder="run-1",
                        lease_seconds=90,
                        release_slots=slots,
                    )
                    slots = step.grant.slots
                    taken.extend(step.leases)
                return math.ceil(rows / k)

            def record() -> int:
                now = time.monotonic()
                for start in range(0, len(taken), m):
                    outcomes = [
                        Classified(lease, "success", 200, None, None, '{"ok": true}', now)
                        for lease in taken[start : start + m]
                    ]
                    leases.record_classified(conn, outcomes)
                return math.ceil(len(taken) / m)

            figures: dict[str, dict[str, float]] = {}
            for name, work, per in (
                ("claim", claim, rows),
                (f"lease_with_permits_{k}_per_call", lease, rows),
                (f"record_classified_outcomes_{m}_per_call", record, rows),
            ):
                cpu, wall, calls = measured(pid, work)
                figures[name] = {
                    "server_cpu_ms_per_row": round(1e3 * cpu / per, 4),
                    "server_cpu_ms_per_call": round(1e3 * cpu / calls, 3),
                    "wall_ms_per_call": round(1e3 * wall / calls, 3),
                    "calls": calls,
                }
            assert len(taken) == rows
    result = {"rows": rows, "statements": figures}
    for name, values in figures.items():
        print(f"{name:40} {values}")
    print(f"written to {write_results('statements', result)}")


if __name__ == "__main__":
    main()
