"""The operator's figures as Prometheus gauges (``media-hooks metrics``).

A custom collector: each scrape measures afresh with ``figures.measure`` (a few statements over
partial indexes) plus the destination list (a small table), and nothing is cached between
scrapes. Each figure costs what the backlog, the dead letters and the last day hold, but one:
the succeeded deliveries per destination, counted through their own index, as many as retention
keeps (about 0.1 s a million on PostgreSQL 15; ``scrape_duration_seconds`` shows it). Every figure is a gauge: they are
levels read from the tables, not counters kept by this process. Ages of nothing (no due row, no
unpublished outbox row) are 0. When the database cannot be read the scrape still answers, with
``media_hooks_up 0``, so an alert can fire on it. No Dagster here.
"""

from __future__ import annotations

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
    for name in names:
        by_state = measured.counts.get(name, {})
        for state in figures.COUNTED:
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
            "expired_leases",
            "Leased deliveries whose lease has expired (a sweep makes them due again).",
            measured.expired_leases,
        ),
        deliveries,
        dead,
        paused,
        disabled,
        disabled_by,
        hour,
        day,
    ]


class FiguresCollector(Collector):
    """Measures on every scrape through a fresh connection from ``connect``."""

    def __init__(self, connect: ConnectionFactory) -> None:
        self._connect = connect

    def collect(self) -> Iterator[Metric]:
        started = time.monotonic()
        try:
            with self._connect() as conn:
                measured = figures.measure(conn)
                destinations = list_destinations(conn)
        except (psycopg.Error, OSError, RuntimeFailure) as exc:
            # The failure is the figure: a scrape that errors out would hide it.
            yield _single("up", "1 when the last scrape could read the database, else 0.", 0)
            yield _scrape_error(exc)
            return
        yield _single("up", "1 when the last scrape could read the database, else 0.", 1)
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


def registry_for(connect: ConnectionFactory) -> CollectorRegistry:
    """A registry holding only the figures (no process or platform metrics of this exporter)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FiguresCollector(connect))
    return registry
