"""The sizes of a benchmark session: ``--smoke`` (CI), ``--quick`` (under 2 minutes) and full.

Full is issue 13's own scenarios at their own sizes. Quick scales each down to what fits in
two minutes on a 2-core machine, and smoke to what proves in CI that every measurement runs
and writes its report. The report prints the size it ran at beside every table.

Time is shared out so that a size's time limit holds whatever the paths cost: each
measurement has its share (``seconds``); in its first round each path gets an equal part of
what is left of it (a quick path leaves the rest to the next), and a run still going at the
end of its part is stopped and marked incomplete. Each figure is the median of up to
``rounds`` runs: after the first round a path runs again only while its last run fits in what
is left, so a slow path (today, the job: 10-25 s a run on this machine, whatever its size)
costs its own repeats, not the others'. Nothing starts after ``session_seconds``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Publishers:
    """Slow publishers: ``destinations`` each limited to ``rates`` per second (spread evenly
    from the first to the second), answering in ``latencies_ms`` (spread likewise, in another
    order), with ``seconds`` of backlog at their limits (or ``per_destination`` each)."""

    destinations: int
    rates: tuple[float, float]
    latencies_ms: tuple[int, int]
    seconds: float | None = None
    per_destination: int | None = None
    total: int | None = None


@dataclass(frozen=True)
class Size:
    name: str
    rounds: int
    # Each measurement's share of the session's time, seconds.
    seconds: dict[str, float]
    # The longest one run of a path may take before it is stopped and marked incomplete.
    run_timeout: float
    # Stop starting measurements after this long (the session's time limit).
    session_seconds: float
    emit_rows: int
    claim_rows: int
    claim_pages: tuple[int, ...]
    sketch_rows: int
    deliver_rows: int
    deliver_destinations: int
    deliver_in_flight: int
    # Fixed cost of a job run: 20 deliveries to each of 1 and of N destinations.
    fixed_cost_destinations: tuple[int, ...]
    publishers: dict[str, Publishers]
    fidelity_seconds: float
    memory_backlogs: tuple[int, ...]
    memory_destinations: int
    # A memory run is watched until the receiver has seen this many of its deliveries (or it
    # ends), and at most ``memory_seconds`` (engine, job); then it is stopped.
    memory_deliveries: int
    memory_seconds: tuple[float, float]
    latency_rate: float
    latency_seconds: float
    latency_destinations: int
    sensor_interval: float
    # Who starts the runs in the latency measurement: the lag sensor, an operator, or both.
    latency_drivers: tuple[str, ...] = ("sensor", "by_hand")
    # Measurements that run the job beside the engine (smoke runs it where it proves the
    # harness: once through `media-hooks run`, once through the sensor's launches).
    job_in: frozenset[str] = frozenset({"deliver", "publishers", "memory"})
    # The publishers the Celery measurement delivers locally, by one worker and by two.
    celery: Publishers = Publishers(32, (10, 10), (200, 200), per_destination=200)


ISSUE_PUBLISHERS = {
    # Issue 13: 16 destinations x 50 deliveries, each limited to 10/s, receivers at 200 ms.
    "sixteen": Publishers(16, (10, 10), (200, 200), per_destination=50),
    # Issue 13: 50 destinations at 5-50/s, receivers at 100-500 ms, 20,000 deliveries.
    "fifty": Publishers(50, (5, 50), (100, 500), total=20_000),
}

FULL = Size(
    name="full",
    rounds=5,
    seconds={
        "emit": 50,
        "claim": 100,
        "deliver": 240,
        "fixed_cost": 60,
        "publishers": 260,
        "fidelity": 70,
        "latency": 120,
        "memory": 200,
        # On request only (`--only celery`): three arrangements a round, then a kill.
        "celery": 600,
    },
    run_timeout=300,
    session_seconds=19 * 60,
    emit_rows=100_000,
    claim_rows=100_000,
    claim_pages=(250, 1000, 5000),
    sketch_rows=10_000,
    deliver_rows=10_000,
    deliver_destinations=10,
    deliver_in_flight=4,
    fixed_cost_destinations=(1, 16),
    publishers=ISSUE_PUBLISHERS,
    fidelity_seconds=20,
    memory_backlogs=(10_000, 100_000, 1_000_000),
    memory_destinations=5,
    memory_deliveries=5_000,
    memory_seconds=(60, 120),
    latency_rate=20,
    latency_seconds=30,
    latency_destinations=4,
    sensor_interval=1.0,
)

QUICK = Size(
    name="quick",
    rounds=3,
    # About 95 s of shares; with the session's set-up, stopping runs and the report, the
    # whole of --quick measured 117 s when these were 8 s more (load average 2-3.6).
    seconds={
        "emit": 4,
        "claim": 6,
        "deliver": 17,
        "fixed_cost": 0,
        "publishers": 26,
        "fidelity": 4,
        "latency": 19,
        "memory": 18,
        "celery": 150,
    },
    run_timeout=30,
    session_seconds=104,
    emit_rows=5_000,
    claim_rows=5_000,
    claim_pages=(250, 1000, 5000),
    sketch_rows=500,
    deliver_rows=300,
    deliver_destinations=4,
    deliver_in_flight=4,
    fixed_cost_destinations=(),
    publishers={
        "sixteen": Publishers(4, (10, 10), (200, 200), per_destination=16),
        "fifty": Publishers(6, (5, 50), (100, 500), seconds=1.5),
    },
    fidelity_seconds=2,
    memory_backlogs=(2_000, 50_000),
    memory_destinations=5,
    memory_deliveries=300,
    memory_seconds=(5, 20),
    latency_rate=20,
    latency_seconds=1,
    latency_destinations=2,
    sensor_interval=0.5,
    celery=Publishers(8, (10, 10), (200, 200), per_destination=40),
)

SMOKE = Size(
    name="smoke",
    rounds=1,
    # Generous: in CI a smoke run must not be cut short by a busy machine.
    seconds={
        "emit": 30,
        "claim": 30,
        "deliver": 90,
        "fixed_cost": 0,
        "publishers": 30,
        "fidelity": 30,
        "latency": 90,
        "memory": 30,
        "celery": 300,
    },
    run_timeout=60,
    session_seconds=400,
    emit_rows=300,
    claim_rows=600,
    claim_pages=(250, 1000),
    sketch_rows=200,
    deliver_rows=60,
    deliver_destinations=2,
    deliver_in_flight=2,
    fixed_cost_destinations=(),
    publishers={
        "sixteen": Publishers(2, (10, 10), (50, 50), per_destination=5),
        "fifty": Publishers(3, (5, 50), (100, 500), seconds=1),
    },
    fidelity_seconds=1,
    memory_backlogs=(100, 300, 1_000),
    memory_destinations=2,
    memory_deliveries=100,
    memory_seconds=(5, 30),
    latency_rate=10,
    latency_seconds=1,
    latency_destinations=1,
    sensor_interval=0.5,
    latency_drivers=("sensor",),
    job_in=frozenset({"deliver"}),
    # Four: both shards of a two-worker run serve some (pub-4 hashes to the first).
    celery=Publishers(4, (5, 5), (50, 50), per_destination=20),
)

SIZES = {size.name: size for size in (SMOKE, QUICK, FULL)}
