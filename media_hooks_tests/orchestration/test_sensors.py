"""The sensors through build_sensor_context with a real instance, and the schedules."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from dagster import (
    DagsterEvent,
    DagsterEventType,
    DagsterRunStatus,
    RunRequest,
    SkipReason,
    build_run_status_sensor_context,
    build_schedule_context,
    build_sensor_context,
)

from media_hooks import reconciler
from media_hooks.cohort import Cohort
from media_hooks.errors import UserError
from media_hooks.orchestration import definitions, schedules
from media_hooks.orchestration.definitions import deliver_webhooks_job
from media_hooks.orchestration.jobs import deliver_webhooks
from media_hooks.orchestration.resources import PostgresResource
from media_hooks.orchestration.sensors import build_delivery_lag_sensor
from media_hooks_tests.factories import add_deliveries, add_destination

lag_sensor = definitions.delivery_lag_sensor
failure_sensor = definitions.delivery_run_failure_sensor


class AlertInbox:
    """A local HTTP server that keeps every alert POSTed to it."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        inbox = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                inbox.texts.append(json.loads(body)["text"])
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alerts"


@pytest.fixture
def inbox() -> Iterator[AlertInbox]:
    box = AlertInbox()
    yield box
    box.server.shutdown()
    box.server.server_close()


def _tick(instance, database_url: str, cursor: str | None = None, sensor=lag_sensor):
    with build_sensor_context(
        instance=instance,
        cursor=cursor,
        resources={"postgres": PostgresResource(database_url=database_url)},
    ) as context:
        result = sensor(context)
    return result


@pytest.fixture
def in_flight_run(instance):
    """A deliver_webhooks run the instance believes is running."""
    created = []

    def make() -> str:
        run = instance.create_run_for_job(
            deliver_webhooks_job(), run_id=str(uuid.uuid4()), status=DagsterRunStatus.STARTED
        )
        created.append(run.run_id)
        return run.run_id

    yield make
    for run_id in created:
        instance.delete_run(run_id)


def test_backlog_requests_one_run_and_none_while_one_is_in_flight(
    instance, database_url, conn, in_flight_run
):
    add_destination(conn, "live", "http://127.0.0.1:9/live")
    add_deliveries(conn, "live", 5, due_seconds_ago=30)

    first = _tick(instance, database_url)
    assert len(first.run_requests) == 1
    request = first.run_requests[0]
    assert isinstance(request, RunRequest)
    assert request.run_key.startswith("catch-up:")
    # Another tick on the same backlog asks with the same key: Dagster starts it once.
    again = _tick(instance, database_url, first.cursor)
    assert [r.run_key for r in again.run_requests] == [request.run_key]

    in_flight_run()
    waiting = _tick(instance, database_url, first.cursor)
    assert waiting.run_requests == []
    assert "a delivery run is in flight" in waiting.skip_reason.skip_message
    assert "pending 5" in waiting.skip_reason.skip_message


def test_healthy_skip_reason_names_the_figures(instance, database_url, conn):
    add_destination(conn, "live", "http://127.0.0.1:9/live")
    add_deliveries(conn, "live", 2, state="succeeded")
    add_deliveries(conn, "live", 1, due_seconds_ago=-3600)  # due in an hour: not late
    result = _tick(instance, database_url)
    assert result.run_requests == []
    message = result.skip_reason.skip_message
    assert message.startswith("healthy; ")
    for figure in ("pending 1", "oldest due none", "relay lag none", "expired leases 0"):
        assert figure in message


def test_one_alert_per_incident_then_one_recovery(
    instance, database_url, conn, inbox, monkeypatch, in_flight_run
):
    monkeypatch.setenv("MEDIA_HOOKS_ALERT_URL", inbox.url)
    monkeypatch.setenv("MEDIA_HOOKS_ALERT_OLDEST_DUE_SECONDS", "60")
    add_destination(conn, "live", "http://127.0.0.1:9/live")
    late = add_deliveries(conn, "live", 3, due_seconds_ago=600)
    in_flight_run()  # keeps the catch-up request out of the way

    cursor = None
    for _ in range(3):
        cursor = _tick(instance, database_url, cursor).cursor
    assert len(inbox.texts) == 1
    assert "delivery incident" in inbox.texts[0]
    assert "oldest due delivery is 6" in inbox.texts[0]

    conn.execute(
        "UPDATE webhook_delivery SET state = 'succeeded' WHERE delivery_id = ANY(%s)", (late,)
    )
    for _ in range(2):
        cursor = _tick(instance, database_url, cursor).cursor
    assert len(inbox.texts) == 2
    assert inbox.texts[1].startswith("media_hooks: recovered")


def test_an_alert_that_did_not_get_through_is_sent_on_the_next_tick(
    instance, database_url, conn, inbox, monkeypatch, in_flight_run
):
    monkeypatch.setenv("MEDIA_HOOKS_ALERT_URL", "http://127.0.0.1:9/nowhere")
    monkeypatch.setenv("MEDIA_HOOKS_ALERT_OLDEST_DUE_SECONDS", "60")
    add_destination(conn, "live", "http://127.0.0.1:9/live")
    add_deliveries(conn, "live", 1, due_seconds_ago=600)
    in_flight_run()
    cursor = _tick(instance, database_url).cursor
    monkeypatch.setenv("MEDIA_HOOKS_ALERT_URL", inbox.url)
    _tick(instance, database_url, cursor)
    assert len(inbox.texts) == 1


def test_failure_sensor_releases_exactly_the_failed_runs_rows(instance, database_url, conn):
    add_destination(conn, "a", "http://127.0.0.1:9/a")
    add_destination(conn, "b", "http://127.0.0.1:9/b")
    add_deliveries(conn, "a", 4)
    add_deliveries(conn, "b", 3)
    failed = instance.create_run_for_job(
        deliver_webhooks_job(), run_id=str(uuid.uuid4()), status=DagsterRunStatus.FAILURE
    )
    other = str(uuid.uuid4())
    reconciler.claim_due(conn, failed.run_id, Cohort(destination_ids=("a",)))
    reconciler.claim_due(conn, other, Cohort(destination_ids=("b",)))
    event = DagsterEvent(
        event_type_value=DagsterEventType.RUN_FAILURE.value, job_name="deliver_webhooks"
    )
    with build_run_status_sensor_context(
        sensor_name="delivery_run_failure_sensor",
        dagster_event=event,
        dagster_instance=instance,
        dagster_run=failed,
        resources={"postgres": PostgresResource(database_url=database_url)},
    ) as context:
        result = failure_sensor(context.for_run_failure())

    assert isinstance(result, SkipReason)
    assert "released 4 delivery(ies)" in result.skip_message
    states = conn.execute(
        "SELECT destination_id, state, count(*) AS n FROM webhook_delivery GROUP BY 1, 2 ORDER BY 1"
    ).fetchall()
    assert [(r["destination_id"], r["state"], r["n"]) for r in states] == [
        ("a", "pending", 4),
        ("b", "enqueued", 3),
    ]
    instance.delete_run(failed.run_id)


def test_nightly_schedule_runs_at_two_in_the_configured_timezone(monkeypatch):
    monkeypatch.setenv("MEDIA_HOOKS_SCHEDULE_TIMEZONE", "Europe/Paris")
    nightly = schedules.build_daily_schedule(
        deliver_webhooks, name="nightly_delivery", cron="0 2 * * *", description="test"
    )
    assert nightly.execution_timezone == "Europe/Paris"
    assert nightly.cron_schedule == "0 2 * * *"
    at = datetime(2026, 3, 1, 1, 0, tzinfo=UTC)
    request = nightly.evaluate_tick(
        build_schedule_context(scheduled_execution_time=at)
    ).run_requests[0]
    assert request.tags["media_hooks/trigger"] == "nightly_delivery"
    assert request.tags["media_hooks/scheduled_for"].startswith("2026-03-01T01:00")
    default = definitions.nightly_delivery
    assert default.execution_timezone == "UTC"
    assert default.job_name == "deliver_webhooks"


def test_an_unknown_timezone_is_refused(monkeypatch):
    monkeypatch.setenv("MEDIA_HOOKS_SCHEDULE_TIMEZONE", "Mars/Olympus")
    with pytest.raises(UserError, match="MEDIA_HOOKS_SCHEDULE_TIMEZONE"):
        schedules.schedule_timezone()


def test_the_lag_sensor_factory_takes_its_interval():
    built = build_delivery_lag_sensor(deliver_webhooks, interval_seconds=5, name="fast_lag")
    assert (built.name, built.minimum_interval_seconds) == ("fast_lag", 5)
