"""The chaos soak (issue 12): the whole system keeps its promise while many things fail at once.

    python -m bench.soak --size ci         # ~2,000 deliveries, 4 destinations, 2 runs: CI
    python -m bench.soak                   # 50,000 deliveries, 20 destinations, 4 runs

N deliveries over M rate-limited destinations are emitted (``media-hooks emit --file``) to a
publisher that answers at random (``bench.soak_receiver``). K ``media-hooks run --until-idle``
processes deliver them in parallel, each in a process group of its own, SIGKILLed as a group at
random and restarted (the restarted one recovers its predecessor's runs). Meanwhile, at set
points of the chaos phase: a requeue of a cohort, a ``db migrate``, an operator session holding
row locks for a few seconds, the project's connections killed for 10-20 s (pg_terminate_backend
in a loop), and a publisher outage. Then final runs deliver what is left, ``media-hooks check``
runs, and the table is printed and written to ``bench/results/soak-<size>.json`` and ``.md``.
Exit status 1 when any "must be" fails.

Runs on ``MEDIA_HOOKS_DATABASE_URL`` when set, otherwise the embedded server, in a scratch
database (and its Dagster storage database) dropped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import psycopg
from psycopg.rows import dict_row

from bench import processes
from bench.scratch import RESULTS, Scratch, database_name, machine, postgres, server_url
from bench.soak_receiver import ChaosPublisher, Limits
from bench.soak_table import measure, render

LEASE_SECONDS = 8.0
ENQUEUE_TIMEOUT_SECONDS = 20.0
# With 8 in flight instead of 3, the default size's publisher saw up to 7 starts over the
# envelope in 0.5-2.6 s windows on 7 of 20 destinations (soak-default-8-in-flight.md in git
# history under bench/results/); with 3, at most 2.9. Whether that is arrivals bunching behind
# the machine's scheduling (bounded by what is in flight) or a hole bounded by the in-flight
# ceiling is not settled: the publisher cannot tell a grant's time. See the issue-12 report.
BURST, MAX_IN_FLIGHT, TIMEOUT_SECONDS = 8, 3, 1.5


@dataclass(frozen=True)
class Size:
    deliveries: int
    destinations: int
    runs: int
    # The chaos phase: kills, the requeue, the migration, the lock, the connection killing and
    # the outage all happen within it, at fixed fractions of it.
    chaos_seconds: float
    kills: int
    kill_connections_seconds: float
    outage_seconds: float
    # The final runs must leave nothing due or leased within this long.
    final_seconds: float

    @property
    def limits(self) -> Limits:
        """A start rate at which each destination's share takes about 70 % of the chaos phase
        to send: the chaos lands on deliveries in progress."""
        rate = self.deliveries / self.destinations / (0.7 * self.chaos_seconds)
        return Limits(round(rate, 1), BURST, MAX_IN_FLIGHT, TIMEOUT_SECONDS)


SIZES = {
    "ci": Size(2000, 4, 2, 70, 4, 10, 6, 70),
    "default": Size(50_000, 20, 4, 300, 12, 15, 15, 1500),
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Slots:
    """K ``media-hooks run`` processes, each restarted when it ends, until ``stop``."""

    def __init__(self, count: int, env: dict[str, str], homes: Path, until: float) -> None:
        self.env = env
        self.homes = homes
        self.until = until
        self.processes: list[subprocess.Popen | None] = [None] * count
        self.exits: list[int] = []
        self.kills = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._keep_running, daemon=True)

    def _command(self) -> list[str]:
        left = max(self.until - time.monotonic(), 1)
        return processes.python_command(
            "media_hooks.cli", "run", "--until-idle", "--max-seconds", f"{left:.0f}"
        )

    def _start(self, slot: int) -> subprocess.Popen:
        # A home per slot: its next process recovers the runs of the one killed before it.
        env = {**self.env, "MEDIA_HOOKS_HOME": str(self.homes / f"slot-{slot}")}
        return processes.start(self._command(), env, log=self.log(slot))

    def log(self, slot: int) -> Path:
        return self.homes / f"slot-{slot}.log"

    def failures(self) -> list[str]:
        """The one-line errors the slots' processes ended with (a failed run says why)."""
        lines = []
        for slot in range(len(self.processes)):
            path = self.log(slot)
            if path.exists():
                lines += [
                    line[:300] for line in path.read_text().splitlines()
                    if line.startswith("media-hooks: ")
                ]  # fmt: skip
        return lines

    def _keep_running(self) -> None:
        while not self._stopping.is_set():
            with self._lock:
                for slot, process in enumerate(self.processes):
                    if process is not None and process.poll() is None:
                        continue
                    if process is not None:
                        self.exits.append(process.returncode)
                    if time.monotonic() < self.until - 5:
                        self.processes[slot] = self._start(slot)
            self._stopping.wait(0.5)

    def start(self) -> None:
        self._thread.start()

    def kill_one(self, rng: random.Random) -> bool:
        """SIGKILL the process group of a running slot; False when none runs."""
        with self._lock:
            running = [p for p in self.processes if p is not None and p.poll() is None]
            if not running:
                return False
            victim = rng.choice(running)
            processes.kill_group(victim)
            victim.wait()
            self.kills += 1
            return True

    def kill_all(self) -> None:
        """Whatever still runs (the soak itself failed or was stopped) goes with its group."""
        self._stopping.set()
        with self._lock:
            for process in self.processes:
                if process is not None and process.poll() is None:
                    processes.kill_group(process)

    def stop(self) -> None:
        """Let the running ones end by their --max-seconds, then end the restarting."""
        self._stopping.set()
        self._thread.join()
        for process in self.processes:
            if process is not None:
                try:
                    process.wait(timeout=max(self.until - time.monotonic(), 0) + 30)
                except subprocess.TimeoutExpired:
                    processes.kill_group(process)
                    process.wait()
                self.exits.append(process.returncode)


def cli(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        processes.python_command("media_hooks.cli", *args),
        env=env,
        cwd=processes.REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class Chaos:
    """The events of the chaos phase, each on a thread of its own, each recorded."""

    def __init__(self, url: str, env: dict[str, str], publisher: ChaosPublisher) -> None:
        self.url = url
        self.env = env
        self.publisher = publisher
        self.events: list[dict] = []
        self._lock = threading.Lock()

    def record(self, name: str, **facts) -> None:
        with self._lock:
            self.events.append({"event": name, "at": round(time.monotonic(), 1), **facts})
        print(f"  chaos: {name} {json.dumps(facts)}", flush=True)

    def requeue(self) -> None:
        done = cli(
            self.env, "requeue", "--destination", "dest-1", "--state", "dead", "--state",
            "pending", "--reason", "soak: the publisher says it is fixed", "--json",
        )  # fmt: skip
        moved = json.loads(done.stdout)["moved"] if done.returncode == 0 else None
        self.record("requeue", exit=done.returncode, moved=moved, error=done.stderr[-200:])

    def migrate(self) -> None:
        """This release's ``db migrate`` (nothing to do), then the next release's migration
        under the running processes, as a rollout does it (schema first, then workers): a
        column added to the busiest table and the ledger row. The processes restarted after
        it (a kill) must start and work on it."""
        done = cli(self.env, "db", "migrate")
        with psycopg.connect(self.url, application_name="soak:next release") as conn:
            conn.execute("SET LOCAL lock_timeout = '2s'")
            conn.execute("ALTER TABLE delivery_state ADD COLUMN next_release_note text")
            conn.execute(
                "INSERT INTO schema_migrations (version, name, checksum)"
                " VALUES (9001, '9001_next_release.sql', 'soak')"
            )
        self.record("db migrate", exit=done.returncode, output=_last_line(done), then=NEXT)

    def operator_lock(self, seconds: float = 4.0) -> None:
        with psycopg.connect(self.url, application_name="soak:operator") as conn:
            # Rows a run is about to lease (enqueued) and rows it would claim next (pending).
            locked = conn.execute(
                "SELECT count(*) FROM (SELECT 1 FROM delivery_state"
                " WHERE destination_id = 'dest-2' AND state IN ('enqueued', 'pending')"
                " ORDER BY state, delivery_id LIMIT 60 FOR UPDATE) AS held"
            ).fetchone()[0]
            conn.execute(
                "UPDATE webhook_destination SET updated_at = now() WHERE destination_id = 'dest-2'"
            )
            conn.execute("SELECT pg_sleep(%s)", (seconds,))
        self.record("operator lock", rows=locked, destination="dest-2", seconds=seconds)

    def kill_connections(self, seconds: float) -> None:
        ended = 0
        until = time.monotonic() + seconds
        with psycopg.connect(self.url, autocommit=True, application_name="soak:killer") as conn:
            while time.monotonic() < until:
                ended += conn.execute(
                    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    " AND application_name LIKE 'media_hooks:%%'"
                ).fetchone()[0]
                time.sleep(0.2)
        self.record("connections killed", seconds=seconds, terminated=ended)

    def outage(self, seconds: float) -> None:
        self.publisher.stop()
        time.sleep(seconds)
        self.publisher.start()
        self.record("publisher outage", seconds=seconds)


def _last_line(done: subprocess.CompletedProcess) -> str:
    text = (done.stderr.strip() or done.stdout.strip()).splitlines()
    return text[-1][:200] if text else ""


def schedule(size: Size, chaos: Chaos) -> list[tuple[float, str, Callable[[], None]]]:
    """(fraction of the chaos phase, name, action)."""
    return [
        (0.30, "requeue", chaos.requeue),
        (0.40, "db migrate", chaos.migrate),
        (0.50, "operator lock", chaos.operator_lock),
        (0.55, "kill connections", lambda: chaos.kill_connections(size.kill_connections_seconds)),
        (0.75, "publisher outage", lambda: chaos.outage(size.outage_seconds)),
    ]


def emit(env: dict[str, str], size: Size, folder: Path) -> list[str]:
    path = folder / "events.jsonl"
    ids = []
    with path.open("w") as out:
        for n in range(size.deliveries):
            delivery_id = f"soak-{n}"
            ids.append(delivery_id)
            event = {
                "destination_id": f"dest-{n % size.destinations + 1}",
                "asset_id": f"asset-{n % 997}",
                "event_type": "transcode.completed",
                "payload": {"n": n, "rendition": "1080p"},
                "delivery_id": delivery_id,
            }
            out.write(json.dumps(event) + "\n")
    done = cli(env, "emit", "--file", str(path), timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"emit failed: {_last_line(done)}")
    return ids


def add_destinations(env: dict[str, str], size: Size, receiver_url: str) -> None:
    limits = size.limits
    for n in range(1, size.destinations + 1):
        done = cli(
            env, "destination", "add", f"dest-{n}", "--url", f"{receiver_url}dest-{n}",
            "--rate", str(limits.rate_per_second), "--burst", str(limits.burst),
            "--max-in-flight", str(limits.max_in_flight), "--timeout", str(limits.timeout_seconds),
            "--backoff-base", "0.2", "--backoff-cap", "2",
        )  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"destination add failed: {_last_line(done)}")


def unfinished(url: str) -> dict:
    with psycopg.connect(url, row_factory=dict_row) as conn:
        return conn.execute(
            "SELECT count(*) FILTER (WHERE state NOT IN ('succeeded', 'dead')) AS open,"
            " max(lease_until) AS lease_until FROM webhook_delivery"
        ).fetchone()


def final_runs(env: dict[str, str], url: str, homes: Path, count: int, seconds: float) -> int:
    """Rounds of ``count`` runs in parallel, no chaos, until every delivery is terminal (or the
    time is up); returns how many rounds."""
    until = time.monotonic() + seconds
    rounds = 0
    while time.monotonic() < until and unfinished(url)["open"]:
        left = max(until - time.monotonic(), 1)
        command = processes.python_command(
            "media_hooks.cli", "run", "--until-idle", "--max-seconds", f"{left:.0f}"
        )
        running = [
            processes.start(command, {**env, "MEDIA_HOOKS_HOME": str(homes / f"slot-{slot}")})
            for slot in range(count)
        ]
        for process in running:
            try:
                process.wait(timeout=left + 60)
            except subprocess.TimeoutExpired:
                processes.kill_group(process)
                process.wait()
        rounds += 1
        if unfinished(url)["open"]:
            # What is left waits for a backoff, a pause, an expired lease or a stale enqueue.
            time.sleep(1)
    return rounds


def soak(size_name: str, seed: int, out: Path) -> int:
    size = SIZES[size_name]
    rng = random.Random(seed)
    started = time.monotonic()
    server = server_url()
    with (
        Scratch(server, "mh_soak") as scratch,
        tempfile.TemporaryDirectory(prefix="mh_soak_") as tmp,
    ):
        url = scratch.create(scratch.template("migrated"))
        folder = Path(tmp)
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEDIA_HOOKS_")}
        env.update(
            MEDIA_HOOKS_DATABASE_URL=url,
            MEDIA_HOOKS_HOME=str(folder / "slot-0"),
            MEDIA_HOOKS_ALLOW_PRIVATE_URLS="1",
            MEDIA_HOOKS_LEASE_SECONDS=str(LEASE_SECONDS),
            MEDIA_HOOKS_ENQUEUE_TIMEOUT_SECONDS=str(ENQUEUE_TIMEOUT_SECONDS),
        )
        publisher = ChaosPublisher(free_port(), size.limits, seed)
        publisher.start()
        try:
            print(f"soak ({size_name}): {asdict(size)}", flush=True)
            add_destinations(env, size, publisher.url)
            ids = emit(env, size, folder)
            print(f"  emitted {len(ids)} in {time.monotonic() - started:.0f} s", flush=True)
            chaos = Chaos(url, env, publisher)
            chaos_end = time.monotonic() + size.chaos_seconds
            slots = Slots(size.runs, env, folder, chaos_end)
            slots.start()
            try:
                chaos_phase(size, chaos, slots, rng, chaos_end)
                slots.stop()
            finally:
                slots.kill_all()
            print(f"  chaos phase over; {publisher.requests()} requests so far", flush=True)
            final = final_runs(env, url, folder, size.runs, size.final_seconds)
            checked = cli(env, "check", "--json")
            outcome = measure(
                url, ids, publisher, json.loads(checked.stdout), checked.returncode,
                kills=(slots.kills, size.kills),
                outages=(len([e for e in chaos.events if e["event"] in OUTAGES]), len(OUTAGES)),
            )  # fmt: skip
        finally:
            publisher.stop()
            with psycopg.connect(server, autocommit=True) as admin:
                admin.execute(
                    f'DROP DATABASE IF EXISTS "{database_name(url)}_dagster" WITH (FORCE)'
                )
        document = {
            "command": shlex.join(["python", "-m", "bench.soak", *sys.argv[1:]]),
            "size": size_name,
            "settings": asdict(size),
            "limits": asdict(size.limits),
            "seed": seed,
            "seconds": round(time.monotonic() - started, 1),
            "final_rounds": final,
            "run_exits": slots.exits,
            "run_errors": slots.failures(),
            "chaos": chaos.events,
            "answers": dict(publisher.answers),
            "machine": machine(),
            "postgres": postgres(server),
            **asdict(outcome),
        }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"soak-{size_name}.json").write_text(json.dumps(document, indent=2, default=str) + "\n")
    table = render(document)
    (out / f"soak-{size_name}.md").write_text(table + "\n")
    print(table)
    print(f"wrote {out / f'soak-{size_name}.json'} and .md")
    return 0 if outcome.holds else 1


OUTAGES = ("connections killed", "publisher outage")
NEXT = "the next release's migration 9001 (a column on delivery_state)"


def chaos_phase(
    size: Size, chaos: Chaos, slots: Slots, rng: random.Random, chaos_end: float
) -> None:
    """Run the scheduled events and the kills until the chaos phase ends."""
    begun = time.monotonic()
    events = [
        (begun + fraction * size.chaos_seconds, name, action)
        for fraction, name, action in schedule(size, chaos)
    ]
    # Kills spread over the phase's first 80 %, at random moments, never two at once.
    kill_times = sorted(
        begun + rng.uniform(0.1, 0.8) * size.chaos_seconds for _ in range(size.kills)
    )
    threads = []
    while time.monotonic() < chaos_end:
        now = time.monotonic()
        while events and events[0][0] <= now:
            _, name, action = events.pop(0)
            thread = threading.Thread(target=action, name=name, daemon=True)
            thread.start()
            threads.append(thread)
        while kill_times and kill_times[0] <= now:
            kill_times.pop(0)
            if slots.kill_one(rng):
                chaos.record("kill", kills=slots.kills)
        time.sleep(0.2)
    for thread in threads:
        thread.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument("--size", choices=sorted(SIZES), default="default")
    parser.add_argument("--seed", type=int, default=12, help="the random answers and kill times")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the results")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return soak(args.size, args.seed, args.out)


if __name__ == "__main__":
    sys.exit(main())
