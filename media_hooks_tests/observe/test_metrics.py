"""The Prometheus collector (media_hooks.observe.metrics) against a prepared database."""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial

import psycopg
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from media_hooks.observe.metrics import registry_for
from media_hooks.store import db
from media_hooks_tests.operator_data import prepare


def samples(registry) -> dict[tuple[str, tuple], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_every_scrape_measures_afresh(conn, database_url):
    registry = registry_for(partial(db.connect, database_url, autocommit=True))
    before = samples(registry)
    assert before[("media_hooks_up", ())] == 1
    prepare(conn)
    after = samples(registry)
    assert after[("media_hooks_expired_leases", ())] == 1
    assert (
        after[("media_hooks_deliveries", (("destination_id", "alpha"), ("state", "leased")))] == 2
    )
    assert after[("media_hooks_destination_paused", (("destination_id", "beta"),))] == 1
    assert after[("media_hooks_destination_paused", (("destination_id", "alpha"),))] == 0
    assert after[("media_hooks_destination_disabled", (("destination_id", "gamma"),))] == 1
    # What disabled it (its receiver's 410); only disabled destinations have the series.
    cause = (("cause", "gone"), ("destination_id", "gamma"))
    assert after[("media_hooks_destination_disabled_cause", cause)] == 1
    assert [k for k in after if k[0] == "media_hooks_destination_disabled_cause"] == [
        ("media_hooks_destination_disabled_cause", cause)
    ]
    assert after[("media_hooks_dead_letters", (("destination_id", "alpha"),))] == 1
    assert after[("media_hooks_attempts_finished_last_hour", (("outcome", "rejected"),))] == 2
    assert after[("media_hooks_oldest_due_age_seconds", ())] > 0
    # No other session holds a transaction open.
    assert after[("media_hooks_oldest_snapshot_age_seconds", ())] == 0


def test_an_unreadable_database_is_a_figure_not_an_error():
    @contextmanager
    def broken():
        raise psycopg.OperationalError("connection refused")
        yield

    found = samples(registry_for(broken))
    assert found[("media_hooks_up", ())] == 0
    assert found[("media_hooks_scrape_error", (("kind", "OperationalError"),))] == 1
    assert not any(name == "media_hooks_deliveries" for name, _ in found)
