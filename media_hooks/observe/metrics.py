"""The operator's figures as Prometheus gauges (``media-hooks metrics``).

A custom collector: each scrape measures the live figures afresh (``figures.measure`` without
the history: a few statements over partial indexes, bounded by the backlog and the dead
letters) plus the destination list (a small table). What grows with the history retention
keeps, the succeeded deliveries per destination (weeks of them: about 0.1 s a million on
PostgreSQL 15) and the attempts finished by outcome over the last hour and day, is counted by a
``HistoryCounter`` on a thread of its own every ``--history-every`` seconds; each scrape serves
its last count and how old it is (``history_age_seconds``), so that a scrape never waits on
the history, whose count would outlast Prometheus's scrape timeout at tens of millions of
deliveries. Until the first count the history's series are absent, never 0. With no counter,
each scrape counts it too (``--history-every 0``). Every figure is a gauge: they are levels
read from the tables, not counters kept by this process. Ages of nothing (no due row, no
unpublished outbox row) are 0. When the database cannot be read the scrape still answers, with
``media_hooks_up 0``, so an alert can fire on it. No Dagster here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import psycopg
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from media_hooks.core.errors import RuntimeFailure
from media_hooks.observe import figures, health
from media_hooks.outbox.destinations import list_destinations

ConnectionFactory = Callable[[], AbstractContextManager[psycopg.Connection]]


def _gauge(name: str, documentation: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"media_hooks_{name}", documentation, labels=list(labels))


def _single(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"media_hooks_{name}", documentation, value=value)


def figure_metrics(measured: figures.Figures, destinations: list[dict[str, Any]]) -> list[Metric]:
    """The gauges of one measurement; every known destination gets a value, zeros included."""
    names = sorted({d["destination_id"] for d in destinations} | set(measured.counts))
    deliveries = _gauge(
        "deliveries", "Deliveries now in each state, per destination.", ("destination_id", "state")
    )
    dead = _gauge("dead_letters", "Deliveries now dead, per destination.", ("destination_id",))
    # Without the history the succeeded count is unknown: no series rather than a wrong 0.
    states = (
        figures.COUNTED
        if measured.history
        else tuple(state for state in figures.COUNTED if state != "succeeded")
    )
    for name in names:
        by_state = measured.counts.get(name, {})
        for state in states:
            deliveries.add_metric([name, state], by_state.get(state, 0))
        dead.add_metric([name], by_state.get("dead", 0))

    paused = _gauge(
        "destination_paused",
        "1 while the destination is paused by a Retry-After, else 0.",
        ("destination_id",),
    )
    disabled = _gauge(
        "destination_disabled", "1 while the destination is disabled, else 0.", ("destination_id",)
    )
    paused_ids = {p.destination_id for p in measured.paused}
    disabled_ids = {d.destination_id for d in measured.disabled}
    for name in names:
        paused.add_metric([name], 1 if name in paused_ids else 0)
        disabled.add_metric([name], 1 if name in disabled_ids else 0)
    # Who disabled it, for alert rules and their routing: every cause is an alert (nothing
    # reaches that publisher until an operator enables it), never a healthy state.
    disabled_by = _gauge(
        "destination_disabled_cause",
        "1 for each disabled destination, labelled with what disabled it: ssrf_guard, gone "
        "(a 410), circuit_breaker, settings, configuration or operator. Alert on any.",
        ("destination_id", "cause"),
    )
    for off in health.disabled_destinations(measured):
        disabled_by.add_metric([off.destination_id, off.cause], 1)

    hour = _gauge(
        "attempts_finished_last_hour",
        "HTTP attempts finished in the trailing hour, by outcome (a window, not a counter).",
        ("outcome",),
    )
    day = _gauge(
        "attempts_finished_last_day",
        "HTTP attempts finished in the trailing day, by outcome (a window, not a counter).",
        ("outcome",),
    )
    for outcome in sorted(set(measured.attempts_last_day) | set(measured.attempts_last_hour)):
        hour.add_metric([outcome], measured.attempts_last_hour.get(outcome, 0))
        day.add_metric([outcome], measured.attempts_last_day.get(outcome, 0))

    sessions = _gauge(
        "sessions",
        "Other media_hooks sessions connected to the database, by role and by release: this, "
        "earlier or later, and its schema generation (unnamed for a release from before "
        "generations were named). During a rolling upgrade, the previous release is gone when "
        "no earlier release's series is above 0.",
        ("release", "generation", "role"),
    )
    for connected in measured.sessions:
        generation = "unnamed" if connected.generation is None else str(connected.generation)
        for role, n in connected.roles.items():
            sessions.add_metric([connected.release, generation, role], n)

    return [
        _single(
            "oldest_due_age_seconds",
            "Age of the oldest delivery due now and sendable (destination enabled, not paused); "
            "0 when none.",
            measured.oldest_due_age_seconds or 0.0,
        ),
        _single(
            "oldest_due_any_age_seconds",
            "Age of the oldest delivery due now, paused or disabled destinations included; "
            "0 when none.",
            measured.oldest_due_any_age_seconds or 0.0,
        ),
        _single(
            "relay_lag_seconds",
            "Age of the oldest outbox row not yet published; 0 when none.",
            measured.relay_lag_seconds or 0.0,
        ),
        _single(
            "oldest_enqueued_age_seconds",
            "Age of the oldest delivery waiting enqueued for its run; 0 when none.",
            measured.oldest_enqueued_age_seconds or 0.0,
        ),
        _single(
            "oldest_snapshot_age_seconds",
            "Age of the oldest transaction of another session that holds back vacuum in this "
            "database (row versions left by deliveries since cannot be removed); 0 when none.",
            measured.oldest_snapshot_age_seconds or 0.0,
        ),
        _single(
            "partitions_ahead_seconds",
            "How far ahead of now the history tables' partitions are made; an emit past that "
            "fails. 0 when none is made.",
            max(measured.partitions_ahead_seconds or 0.0, 0.0),
        ),
        _single(
            "expired_leases",
            "Leased deliveries whose lease has expired (a sweep makes them due again).",
            measured.expired_leases,
        ),
        deliveries,
        dead,
        paused,
        disabled,
        disabled_by,
        sessions,
        hour,
        day,
    ]


class HistoryCounter:
    """Counts the figures' history (``figures.measure_history``) every ``every`` seconds on a
    thread of its own, through a fresh connection from ``connect`` each time. A count that
    fails leaves the last one in place: its age keeps growing, which is what an alert watches."""

    def __init__(self, connect: ConnectionFactory, every: float) -> None:
        self._connect = connect
        self._every = every
        self._latest: tuple[figures.History, float] | None = None
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="history-counter", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=10)

    def latest(self) -> tuple[figures.History, float] | None:
        """The last count and its age in seconds; None before the first one."""
        with self._lock:
            if self._latest is None:
                return None
            history, counted_at = self._latest
        return history, time.monotonic() - counted_at

    def _run(self) -> None:
        while not self._stopped.is_set():
            started = time.monotonic()
            try:
                with self._connect() as conn:
                    history = figures.measure_history(conn)
            except (psycopg.Error, OSError, RuntimeFailure):
                pass  # the last count stays; history_age_seconds says how old it is
            else:
                with self._lock:
                    self._latest = (history, started)
            self._stopped.wait(self._every)


class FiguresCollector(Collector):
    """Measures on every scrape through a fresh connection from ``connect``: all of it, or
    the live figures with ``history``'s last count."""

    def __init__(self, connect: ConnectionFactory, history: HistoryCounter | None = None) -> None:
        self._connect = connect
        self._history = history

    def collect(self) -> Iterator[Metric]:
        started = time.monotonic()
        try:
            with self._connect() as conn:
                measured = figures.measure(conn, history=self._history is None)
                destinations = list_destinations(conn)
        except (psycopg.Error, OSError, RuntimeFailure) as exc:
            # The failure is the figure: a scrape that errors out would hide it.
            yield _single("up", "1 when the last scrape could read the database, else 0.", 0)
            yield _scrape_error(exc)
            return
        yield _single("up", "1 when the last scrape could read the database, else 0.", 1)
        if self._history is not None:
            latest = self._history.latest()
            if latest is not None:
                history, age = latest
                measured = figures.with_history(measured, history)
                yield _single(
                    "history_age_seconds",
                    "Seconds since the succeeded deliveries and the attempts by outcome were "
                    "last counted (every --history-every seconds).",
                    age,
                )
        yield from figure_metrics(measured, destinations)
        yield _single(
            "scrape_duration_seconds",
            "Time this scrape spent measuring.",
            time.monotonic() - started,
        )


def _scrape_error(exc: Exception) -> GaugeMetricFamily:
    family = _gauge("scrape_error", "1 with the kind of error the last scrape met.", ("kind",))
    family.add_metric([type(exc).__name__], 1)
    return family


def registry_for(
    connect: ConnectionFactory, history: HistoryCounter | None = None
) -> CollectorRegistry:
    """A registry holding only the figures (no process or platform metrics of this exporter);
    the history from ``history``'s counts, or counted at each scrape without one."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FiguresCollector(connect, history))
    return registry
