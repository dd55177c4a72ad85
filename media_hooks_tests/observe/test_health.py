"""What must not read green (media_hooks.observe.health): each writer of a disabled reason, run
for real, is named by its cause; the operator's own reason is the operator's."""

from __future__ import annotations

import dataclasses

import pytest

from media_hooks.core.config import Settings
from media_hooks.devtools.receiver import Receiver, Reply
from media_hooks.engine.delivery_run import deliver_due
from media_hooks.observe import figures, health
from media_hooks.outbox.destinations import disable_destination
from media_hooks.outbox.maintenance import sweeps
from media_hooks_tests.factories import add_attempts, add_deliveries, add_destination


def _disabled(conn) -> dict[str, tuple[str, int]]:
    return {
        d.destination_id: (d.cause, d.waiting)
        for d in health.disabled_destinations(figures.measure(conn))
    }


def test_the_guard_a_410_and_out_of_range_settings_are_named_by_what_disabled_them(
    conn, pool, settings
):
    guarded = dataclasses.replace(settings, allow_private_urls=False)
    with Receiver(reply=Reply(status=410)) as gone:
        add_destination(conn, "local", url=gone.url + "local", max_in_flight=1)
        add_deliveries(conn, "local", 2)
        deliver_due(pool, "run-guarded", guarded)
        add_destination(conn, "gone", url=gone.url + "gone", max_in_flight=1)
        add_destination(conn, "odd", url=gone.url + "odd", rate_per_second=1e-300)
        add_deliveries(conn, "gone", 2)
        add_deliveries(conn, "odd", 1)
        deliver_due(pool, "run-open", settings)
    # The 410's delivery is dead; the other waits with the guard's and the settings' own.
    assert _disabled(conn) == {
        "local": ("ssrf_guard", 2),
        "gone": ("gone", 1),
        "odd": ("settings", 1),
    }


def test_the_circuit_breaker_and_an_operator_are_named(conn):
    add_destination(conn, "flaky")
    add_deliveries(conn, "flaky", 1)
    # Thirty failed attempts over 30 hours, one every 58 minutes.
    started_ago = [30 * 3600 - g * 58 * 60 for g in range(1, 31)]
    add_attempts(conn, "d-flaky-1", [(s, 0, "retryable") for s in started_ago], error="HTTP 500")
    assert sweeps.trip_circuit_breakers(conn, Settings.from_env())
    add_destination(conn, "paused-by-hand")
    disable_destination(conn, "paused-by-hand", "publisher's maintenance window")
    found = health.disabled_destinations(figures.measure(conn))
    assert [(d.destination_id, d.cause) for d in found] == [
        ("flaky", "circuit_breaker"),
        ("paused-by-hand", "operator"),
    ]
    assert found[1].describe() == (
        "destination paused-by-hand disabled by an operator, 0 delivery(ies) waiting"
    )
    assert health.attention(figures.measure(conn)) == [d.describe() for d in found]
    # A run for named destinations hears only of those.
    assert health.attention(figures.measure(conn), ["flaky"]) == [found[0].describe()]
    assert health.attention(figures.measure(conn), ["another"]) == []


@pytest.mark.parametrize(
    ("reason", "cause"),
    [
        (None, "operator"),
        ("configuration: a stored secret is unusable (bad padding)", "configuration"),
        ("configuration: refused by the SSRF guard: connecting to 10.0.0.1: ...", "ssrf_guard"),
    ],
)
def test_reasons_without_a_writer_here(reason, cause):
    assert health.disabled_cause(reason)[0] == cause
