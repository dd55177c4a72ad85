"""The sustained-load benchmark's three processes: producer, engine and retention.

    python -m bench.sustained_roles producer --backlog 3000 --batch 1000 --destinations d1,d2
    python -m bench.sustained_roles producer ... --rate 1000
    python -m bench.sustained_roles engine --page-size 250 --max-rows 5000
    python -m bench.sustained_roles retention --retain-seconds 60 --duplicate-seconds 180

Each runs against ``MEDIA_HOOKS_DATABASE_URL`` until its standard input closes (the harness,
``bench.sustained``, closes it to stop them), and prints one JSON object a line on its
standard output: what it did since its last line, with ``at``, this machine's monotonic clock
(CLOCK_MONOTONIC: the same clock in every process, so the harness puts each line in its
window). Each role is a process of its own, as in production: the producer's serialization
and the engine's threads do not share one interpreter's lock.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

# How often the engine reports its figures (seconds).
REPORT_EVERY = 0.1
# A payload of about 300 bytes, as in the measurement.
PAD = "x" * 250


def _write(line: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(line, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def _stop_on_eof() -> threading.Event:
    """Set when standard input closes: the harness's way to stop this process."""
    stop = threading.Event()

    def watch() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=watch, name="stdin", daemon=True).start()
    return stop


# The producer ---------------------------------------------------------------------------------

BACKLOG = """
SELECT count(*) AS due FROM delivery_timer WHERE kind = 'due' AND fire_at <= now()
"""


def own_wal_bytes(conn: Any) -> int | None:
    """The WAL this session has written so far (PostgreSQL 18's per-backend statistics), or
    None on an older server: what lets the harness tell the producer's and retention's WAL from
    the engine's. Ends the connection's transaction."""
    try:
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.commit()
        found = conn.execute(
            "SELECT wal_bytes FROM pg_stat_get_backend_wal(pg_backend_pid())"
        ).fetchone()
        conn.commit()
    except Exception:  # no such function before PostgreSQL 18
        conn.rollback()
        return None
    return int(found["wal_bytes"])


def events(start: int, count: int, destinations: list[str]) -> Iterator[Any]:
    """``count`` deliveries numbered from ``start``, spread over ``destinations`` in turn."""
    from media_hooks.outbox.emit import Event

    for n in range(start, start + count):
        yield Event(
            destination_id=destinations[n % len(destinations)],
            asset_id=f"asset-{n % 10007}",
            event_type="transcode.completed",
            payload={"n": n, "rendition": "1080p", "pad": PAD},
            delivery_id=f"sus-{n}",
        )


def next_batch_at(started: float, emitted: int, batch: int, rate: float | None) -> float:
    """When the next batch may go (this machine's monotonic clock): at once without a rate;
    with one, once the run's emits, that batch included, are within ``rate`` a second of its
    start, so that the producer holds the rate over the run, not batch by batch."""
    if rate is None:
        return started
    return started + (emitted + batch) / rate


def producer(backlog: int, batch: int, destinations: list[str], rate: float | None = None) -> None:
    """Emit ``batch`` deliveries a transaction (the bulk COPY path, in the producer's own
    transaction) whenever fewer than ``backlog`` are due: the engine never starves, and the
    backlog stays bounded whatever the engine's speed. With ``rate``, no faster than that many
    a second either, as a platform's events come: the history then follows the rate, not the
    engine's speed."""
    from media_hooks.outbox.emit import emit_many

    stop = _stop_on_eof()
    emitted = 0
    started = time.monotonic()
    with _producer_connection() as conn:
        while not stop.is_set():
            wait = next_batch_at(started, emitted, batch, rate) - time.monotonic()
            if wait > 0:
                stop.wait(min(wait, 0.05))
                continue
            due = conn.execute(BACKLOG).fetchone()["due"]
            conn.commit()
            if due >= backlog:
                stop.wait(0.05)
                continue
            began = time.monotonic()
            counts = emit_many(conn, events(emitted, batch, destinations))
            conn.commit()
            emitted += counts.inserted
            seconds = time.monotonic() - began
            _write(
                {
                    "at": time.monotonic(),
                    "emitted": emitted,
                    "seconds": seconds,
                    "wal_bytes": own_wal_bytes(conn),
                }
            )


def _producer_connection():
    from media_hooks.core.config import Settings
    from media_hooks.store import db

    settings = Settings.from_env()
    return db.connect(db.resolve_url(settings), role=db.Role.PRODUCER, settings=settings)


# The engine -----------------------------------------------------------------------------------


class Timings:
    """Latencies of the engine's statements and the terminal moves it recorded, drained by the
    reporter thread (the engine's threads add to them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.samples: dict[str, list[tuple[float, float]]] = {
            "claim": [],
            "lease": [],
            "record": [],
        }
        self.succeeded = 0
        self.dead = 0
        self.recorded = 0

    def add(self, kind: str, at: float, seconds: float) -> None:
        with self._lock:
            self.samples[kind].append((round(at, 4), round(seconds, 6)))

    def count(self, recorded: Any) -> None:
        """Counts what ``leases.record_classified`` recorded (its ``states``)."""
        finished = list(recorded.states.values())
        with self._lock:
            self.recorded += len(finished)
            self.succeeded += finished.count("succeeded")
            self.dead += finished.count("dead")

    def drain(self) -> dict[str, Any]:
        with self._lock:
            taken = self.samples
            self.samples = {kind: [] for kind in taken}
            return {
                "succeeded": self.succeeded,
                "dead": self.dead,
                "recorded": self.recorded,
                **taken,
            }


# The statements the benchmark times, as the engine reaches them (module, attribute). A
# wrapper is put in their place in this process only.
TIMED = (
    ("media_hooks.outbox.claims", "claim_destination_page", "claim"),
    ("media_hooks.outbox.leases", "lease_with_permits", "lease"),
    ("media_hooks.outbox.leases", "record_classified", "record"),
)


def _timed(function: Callable[..., Any], kind: str, timings: Timings) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        began = time.monotonic()
        result = function(*args, **kwargs)
        ended = time.monotonic()
        timings.add(kind, ended, ended - began)
        if kind == "record":
            timings.count(result)
        return result

    return timed


def install_timers(timings: Timings) -> None:
    import importlib

    for module_name, attribute, kind in TIMED:
        module = importlib.import_module(module_name)
        setattr(module, attribute, _timed(getattr(module, attribute), kind, timings))


def engine(page_size: int, max_rows: int) -> None:
    """``deliver_due`` run after run (a run of at most ``max_rows``, so that each run's sweeps
    come round as a schedule's would), until standard input closes."""
    from media_hooks.core.config import Settings
    from media_hooks.engine.delivery_run import deliver_due
    from media_hooks.store import db

    settings = Settings.from_env()
    stop = _stop_on_eof()
    timings = Timings()
    install_timers(timings)

    def report() -> None:
        while not stop.wait(REPORT_EVERY):
            _write({"at": time.monotonic(), **timings.drain()})

    reporter = threading.Thread(target=report, name="reporter", daemon=True)
    url = db.resolve_url(settings)
    with db.connect(url, settings=settings) as conn:
        destinations = conn.execute("SELECT count(*) AS n FROM webhook_destination").fetchone()["n"]
    runs = 0
    with db.open_pool(url, max_size=destinations + 4, settings=settings) as pool:
        _write({"at": time.monotonic(), "ready": True})
        reporter.start()
        while not stop.is_set():
            runs += 1
            done = deliver_due(
                pool, f"sustained-{runs}", settings, page_size=page_size, max_rows=max_rows,
                stop=stop,
            )  # fmt: skip
            if done.claim.claimed == 0:
                stop.wait(0.1)  # nothing due: the backlog is the producer's to fill
    reporter.join()
    _write({"at": time.monotonic(), "runs": runs, **timings.drain()})


# Retention ------------------------------------------------------------------------------------


def retention(retain_seconds: float, duplicate_seconds: float, every: float) -> None:
    """A retention pass every ``every`` seconds, each to the end of what is due to purge."""
    from media_hooks.core.config import Settings
    from media_hooks.outbox.maintenance import retention
    from media_hooks.store import db

    settings = Settings.from_env()
    stop = _stop_on_eof()
    policy = retention.RetentionPolicy(
        retain_seconds=retain_seconds,
        tombstone_seconds=duplicate_seconds,
        batch_size=1000,
        max_batches=100_000,
    )
    url = db.resolve_url(settings)
    with db.connect(url, role=db.Role.SWEEPS, settings=settings, autocommit=True) as conn:
        while not stop.is_set():
            began = time.monotonic()
            figures = retention.run_retention(conn, policy)
            _write(
                {
                    "at": time.monotonic(),
                    "seconds": time.monotonic() - began,
                    "wal_bytes": own_wal_bytes(conn),
                    **figures.as_dict(),
                }
            )
            stop.wait(max(every - (time.monotonic() - began), 0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sustained_roles", description=__doc__)
    roles = parser.add_subparsers(dest="role", required=True)
    produce = roles.add_parser("producer")
    produce.add_argument("--backlog", type=int, required=True)
    produce.add_argument("--batch", type=int, required=True)
    produce.add_argument("--destinations", required=True, help="comma-separated ids")
    produce.add_argument("--rate", type=float, help="deliveries a second, at most")
    deliver = roles.add_parser("engine")
    deliver.add_argument("--page-size", type=int, required=True)
    deliver.add_argument("--max-rows", type=int, required=True)
    purge = roles.add_parser("retention")
    purge.add_argument("--retain-seconds", type=float, required=True)
    purge.add_argument("--duplicate-seconds", type=float, required=True)
    purge.add_argument("--every", type=float, required=True)
    args = parser.parse_args(argv)
    if args.role == "producer":
        producer(args.backlog, args.batch, args.destinations.split(","), args.rate)
    elif args.role == "engine":
        engine(args.page_size, args.max_rows)
    else:
        retention(args.retain_seconds, args.duplicate_seconds, args.every)
    return 0


if __name__ == "__main__":
    sys.exit(main())
