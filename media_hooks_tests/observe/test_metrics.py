"""The Prometheus collector (media_hooks.observe.metrics) against a prepared database."""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial

import psycopg
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from media_hooks.observe.metrics import HistoryCounter, registry_for
from media_hooks.store import db
from media_hooks_tests.interleaving import open_session, wait_for
from media_hooks_tests.operator_data import prepare

SUCCEEDED = ("media_hooks_deliveries", (("destination_id", "alpha"), ("state", "succeeded")))
PENDING = ("media_hooks_deliveries", (("destination_id", "alpha"), ("state", "pending")))
AGE = ("media_hooks_history_age_seconds", ())


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


def test_the_connected_releases_are_gauges_by_release_generation_and_role(database_url):
    registry = registry_for(partial(db.connect, database_url, autocommit=True))
    assert not [key for key in samples(registry) if key[0] == "media_hooks_sessions"]
    with open_session(database_url, application_name="media_hooks:worker"):
        sessions = {k: v for k, v in samples(registry).items() if k[0] == "media_hooks_sessions"}
    labels = (("generation", "unnamed"), ("release", "earlier"), ("role", "worker"))
    assert sessions == {("media_hooks_sessions", labels): 1}


def test_an_unreadable_database_is_a_figure_not_an_error():
    @contextmanager
    def broken():
        raise psycopg.OperationalError("connection refused")
        yield

    found = samples(registry_for(broken))
    assert found[("media_hooks_up", ())] == 0
    assert found[("media_hooks_scrape_error", (("kind", "OperationalError"),))] == 1
    assert not any(name == "media_hooks_deliveries" for name, _ in found)


@contextmanager
def counting(connect, every: float):
    counter = HistoryCounter(connect, every)
    counter.start()
    try:
        yield counter
    finally:
        counter.stop()
        assert not counter._thread.is_alive()


def test_the_history_is_counted_on_its_own_schedule(conn, database_url):
    connect = partial(db.connect, database_url, autocommit=True)
    prepare(conn)
    with counting(connect, every=0.05) as counter:
        registry = registry_for(connect, counter)
        wait_for(lambda: samples(registry).get(SUCCEEDED) == 1, "the first count")
        conn.execute(
            "UPDATE webhook_delivery_all SET state = 'succeeded', updated_at = now()"
            " WHERE delivery_id = (SELECT min(delivery_id) FROM webhook_delivery_all"
            " WHERE destination_id = 'alpha' AND state = 'pending')"
        )
        wait_for(lambda: samples(registry).get(SUCCEEDED) == 2, "a later count")
        found = samples(registry)
    assert 0 <= found[AGE] < 5
    assert found[("media_hooks_attempts_finished_last_hour", (("outcome", "rejected"),))] == 2


def test_before_its_first_count_the_history_is_absent_not_zero(conn, database_url):
    @contextmanager
    def broken():
        raise psycopg.OperationalError("connection refused")
        yield

    prepare(conn)
    with counting(broken, every=0.05) as counter:
        found = samples(registry_for(partial(db.connect, database_url, autocommit=True), counter))
    # The live figures are there; what the counter could not count is not.
    assert found[("media_hooks_up", ())] == 1 and found[PENDING] >= 1
    assert SUCCEEDED not in found and AGE not in found
    assert not any(name.startswith("media_hooks_attempts_finished") for name, _ in found)
