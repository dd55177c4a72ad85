"""(7) Latency: from emit to the receiver, when the lag sensor drives catch-up runs and when an
operator starts a run by hand.

A producer emits deliveries at a steady rate (``media_hooks.outbox.emit.emit``, one committed
statement each) to destinations on the receiver; each delivery's latency is the receiver's
first sight of its ``webhook-id`` minus the moment its emit returned (one clock: this
machine's). Two drivers, each on a fresh database and Dagster storage:

- ``sensor``: ``delivery_lag_sensor`` evaluated every ``sensor_interval`` seconds with
  Dagster's ``build_sensor_context`` against a real instance, with the resources the project's
  ``Definitions`` bind. Each run it requests is created in the instance at once, as the daemon
  does, and launched in a fresh interpreter, as Dagster's DefaultRunLauncher launches it
  (``bench.launch_run``). Deployed, the sensor ticks every 30 s: add up to that to its
  figures.
- ``by_hand``: ``media-hooks run --until-idle --json`` started as the emits start, and started
  again whenever it returns with deliveries still to come (an operator who keeps it going).

The run ends when every emitted delivery reached the receiver (or at a deadline).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import psycopg

from bench import stats
from bench.fast_receiver import take_log
from bench.processes import python_command, run_measured, stop_group
from bench.scratch import Destination, add_destinations
from bench.session import Session
from media_hooks.outbox.emit import Event, emit

LATENCY_MS = 50
METRICS = {
    "p50_seconds": "emit to receiver, p50, s",
    "p99_seconds": "emit to receiver, p99, s",
    "max_seconds": "emit to receiver, max, s",
    "delivered": "deliveries that reached the receiver",
    "dagster_runs": "delivery runs started",
}


class Emitter(threading.Thread):
    """Emits ``count`` deliveries at ``rate`` per second, round robin over the destinations,
    and keeps when each one's emit returned."""

    def __init__(self, url: str, destinations: list[str], rate: float, count: int) -> None:
        super().__init__(daemon=True)
        self.url, self.destinations, self.rate, self.count = url, destinations, rate, count
        self.emitted: dict[str, float] = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                started = time.monotonic()
                for n in range(self.count):
                    time.sleep(max(0.0, started + n / self.rate - time.monotonic()))
                    delivery_id = f"lat-{n:06d}"
                    event = Event(
                        destination_id=self.destinations[n % len(self.destinations)],
                        asset_id=f"asset-{n:06d}",
                        event_type="rights.updated",
                        payload={"n": n, "territory": "FR"},
                        delivery_id=delivery_id,
                    )
                    emit(conn, event)
                    self.emitted[delivery_id] = time.time()
        except BaseException as exc:  # reported by the driver
            self.error = exc


def _delivered(url: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT count(*) FROM webhook_delivery WHERE state = 'succeeded'"
        ).fetchone()[0]


Drive = Callable[[Emitter, float], int]


@contextmanager
def sensor_driver(session: Session, url: str, storage: str) -> Iterator[Drive]:
    """The lag sensor's evaluation loop, launching each run it requests in a process of its
    own, as the daemon does. Dagster is loaded and the instance opened before the emits start
    (a deployed daemon's are), so none of that counts as latency."""
    from dagster import SensorResult, build_sensor_context

    from bench.launch_run import LAG_SENSOR, create_run, daemon_instance, launch, settled
    from media_hooks.orchestration.definitions import defs

    sensor = defs.resolve_sensor_def(LAG_SENSOR)
    launched: list[str] = []
    running: dict[str, subprocess.Popen] = {}  # launched and not finished when last looked at
    keys: set[str] = set()

    def drive(emitter: Emitter, deadline: float) -> int:
        cursor = None
        while time.monotonic() < deadline:
            tick = time.monotonic()
            with build_sensor_context(
                instance=instance, cursor=cursor, resources=defs.resources
            ) as context:
                result = sensor(context)
            if isinstance(result, SensorResult):
                cursor = result.cursor if result.cursor is not None else cursor
                for request in result.run_requests or []:
                    tags = {"dagster/sensor_name": sensor.name}
                    if request.run_key is not None:
                        # The daemon launches a run key once; a repeat request is dropped.
                        if request.run_key in keys:
                            continue
                        keys.add(request.run_key)
                        tags["dagster/run_key"] = request.run_key
                    run = create_run(instance, request.run_config, {**request.tags, **tags})
                    running[run.run_id] = launch(instance, run.run_id, env)
                    launched.append(run.run_id)
            for run_id, process in list(running.items()):
                if settled(instance, run_id, process).is_finished:
                    process.wait()
                    del running[run_id]
            if not emitter.is_alive() and not running and _delivered(url) >= emitter.count:
                break
            time.sleep(max(0.0, tick + session.size.sensor_interval - time.monotonic()))
        return len(launched)

    with daemon_instance(session, url, storage) as (instance, env):
        try:
            yield drive
        finally:
            for process in running.values():
                stop_group(process)


@contextmanager
def by_hand_driver(session: Session, url: str, storage: str) -> Iterator[Drive]:
    """``media-hooks run --until-idle``, again and again until everything was delivered."""
    command = python_command("media_hooks.cli", "run", "--until-idle", "--json")

    def drive(emitter: Emitter, deadline: float) -> int:
        runs = 0
        while time.monotonic() < deadline:
            finished = run_measured(
                command, env=session.env(url, storage), timeout=deadline - time.monotonic()
            )
            if finished.complete:
                runs += len(json.loads(finished.stdout)["runs"])
            if not emitter.is_alive() and _delivered(url) >= emitter.count:
                break
        return runs

    yield drive


def measure(session: Session) -> dict[str, Any]:
    size = session.size
    found = [
        Destination(f"lat-{n}", f"{session.receiver}{LATENCY_MS}/lat-{n}", max_in_flight=4)
        for n in range(1, size.latency_destinations + 1)
    ]
    session.scratch.template(f"latency-{len(found)}", lambda url: add_destinations(url, found))
    count = round(size.latency_rate * size.latency_seconds)

    def driven(driver: Callable[[Session, str, str], AbstractContextManager[Drive]]) -> dict:
        with (
            session.scratch.database(f"latency-{len(found)}") as url,
            session.dagster_storage() as storage,
            driver(session, url, storage) as drive,
        ):
            take_log(session.receiver)
            emitter = Emitter(url, [d.destination_id for d in found], size.latency_rate, count)
            deadline = time.monotonic() + min(
                size.latency_seconds + 2 * size.run_timeout, session.remaining()
            )
            emitter.start()
            runs = drive(emitter, deadline)
            emitter.join()
            starts = take_log(session.receiver)
        if emitter.error is not None:
            raise emitter.error
        first: dict[str, float] = {}
        for seen in starts:
            first.setdefault(seen.webhook_id, seen.at)
        latencies = [first[d] - at for d, at in emitter.emitted.items() if d in first]
        result = {
            "p50_seconds": stats.percentile(latencies, 0.5),
            "p99_seconds": stats.percentile(latencies, 0.99),
            "max_seconds": max(latencies, default=None),
            "delivered": len(latencies),
            "dagster_runs": runs,
            "latencies": sorted(latencies),
        }
        if len(latencies) < count:
            result["error"] = f"{len(latencies)} of {count} delivered before the deadline"
        return result

    drivers = {"sensor": sensor_driver, "by_hand": by_hand_driver}
    runners = {name: lambda driver=drivers[name]: driven(driver) for name in size.latency_drivers}
    runs = session.interleaved(runners)
    figures = stats.summarize(runs, list(METRICS))
    ratios = stats.ratios(figures, [("sensor", "by_hand")], "p50_seconds")
    ratios += stats.ratios(figures, [("sensor", "by_hand")], "p99_seconds")
    return {
        "title": "Latency: emit to receiver, lag-sensor catch-up runs vs a run started by hand",
        "metrics": METRICS,
        "size": {
            "emits_per_second": size.latency_rate,
            "seconds_of_emits": size.latency_seconds,
            "deliveries": count,
            "destinations": len(found),
            "receiver_latency_ms": LATENCY_MS,
            "sensor_interval_seconds": size.sensor_interval,
        },
        "figures": figures,
        "series": {path: results[-1]["latencies"] for path, results in runs.items() if results},
        "ratios": ratios,
        "targets": [],
        "notes": [
            f"The sensor is evaluated every {size.sensor_interval:g} s here; deployed it ticks "
            "every 30 s, which adds up to 30 s (15 s on average) to its latencies.",
            "A run the sensor requests is created in the instance at once and launched in a "
            "fresh interpreter (`dagster api execute_run`), as Dagster's DefaultRunLauncher "
            "launches it under the daemon.",
        ],
    }
