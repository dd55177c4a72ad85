"""The sensors through build_sensor_context with a real instance, and the schedules.

The sensors read the instance's run history (runs in flight, failed, dead), so each test has
an instance of its own (``own_instance``)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psutil
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

from media_hooks.core.errors import UserError
from media_hooks.engine.delivery_run import deliver_due
from media_hooks.observe import figures
from media_hooks.orchestration import definitions, run_workers, schedules, sensors
from media_hooks.orchestration.definitions import deliver_webhooks_job
from media_hooks.orchestration.jobs import deliver_webhooks
from media_hooks.orchestration.recovery import RELEASED_TAG
from media_hooks.orchestration.resources import DeliverySettingsResource, PostgresResource
from media_hooks.orchestration.sensors import build_delivery_lag_sensor
from media_hooks.outbox.cohort import Cohort
from media_hooks.outbox.destinations import enable_destination
from media_hooks.outbox.emit import Event, emit
from media_hooks_tests.factories import add_deliveries, add_destination, claim_all, states
from media_hooks_tests.interleaving import snapshot_held, wait_for
from media_hooks_tests.orchestration.conftest import hold_pool_slot, slot_holders

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


def _tick(
    instance,
    database_url: str,
    cursor: str | None = None,
    sensor=lag_sensor,
    settings: DeliverySettingsResource | None = None,
):
    with build_sensor_context(
        instance=instance,
        cursor=cursor,
        resources={
            "postgres": PostgresResource(database_url=database_url),
            "delivery_settings": settings or DeliverySettingsResource(),
        },
    ) as context:
        result = sensor(context)
    return result


def _health(result) -> str:
    return json.loads(result.cursor)["health"]


@pytest.fixture
def in_flight_run(own_instance):
    """A deliver_webhooks run the instance believes is running (its worker unknown)."""

    def make() -> str:
        run = own_instance.create_run_for_job(
            deliver_webhooks_job(), run_id=str(uuid.uuid4()), status=DagsterRunStatus.STARTED
        )
        return run.run_id

    return make


def test_backlog_requests_one_run_and_none_while_one_is_in_flight(
    own_instance, database_url, conn, in_flight_run
):
    add_destination(conn, "live", "http://127.0.0.1:9/live")
    add_deliveries(conn, "live", 5, due_seconds_ago=30)

    first = _tick(own_instance, database_url)
    assert len(first.run_requests) == 1
    request = first.run_requests[0]
    assert isinstance(request, RunRequest)
    assert request.run_key == "catch-up:after:none"
    assert request.tags["media_hooks/work"].startswith("deliveries due (oldest 3")
    assert _health(first).startswith("catch-up run requested (deliveries due")
    # Another tick on the same backlog asks with the same key: Dagster starts it once.
    again = _tick(own_instance, database_url, first.cursor)
    assert [r.run_key for r in again.run_requests] == [request.run_key]

    in_flight_run()
    waiting = _tick(own_instance, database_url, first.cursor)
    assert waiting.run_requests == []
    assert "a delivery run is queued or in progress" in waiting.skip_reason.skip_message
    assert "pending 5" in waiting.skip_reason.skip_message


def test_healthy_skip_reason_and_cursor_name_the_figures(own_instance, database_url, conn):
    add_destination(conn, "live", "http://127.0.0.1:9/live")
    add_deliveries(conn, "live", 2, state="succeeded")
    add_deliveries(conn, "live", 1, due_seconds_ago=-3600)  # due in an hour: not late
    result = _tick(own_instance, database_url)
    assert result.run_requests == []
    message = result.skip_reason.skip_message
    assert message.startswith("healthy; ")
    for figure in ("pending 1", "oldest due none", "relay lag none", "expired leases 0"):
        assert figure in message
    # The sensor page shows each tick's cursor (its skip reason only as a tooltip).
    assert _health(result) == message
    assert json.loads(result.cursor)["in_incident"] is False


def test_a_destination_the_guard_disabled_is_never_healthy_and_is_alerted_once(
    own_instance, database_url, conn, pool, settings, inbox, monkeypatch
):
    """A run with the guard on disables a destination on 127.0.0.1 (issue 35's first webhook):
    the tick names it instead of "healthy", the alert names it and its reason once, and its
    enabling is said once."""
    monkeypatch.setenv("MEDIA_HOOKS_ALERT_URL", inbox.url)
    add_destination(conn, "mine", "http://127.0.0.1:9/hook", max_in_flight=1)
    add_deliveries(conn, "mine", 3)
    deliver_due(pool, "run-guarded", dataclasses.replace(settings, allow_private_urls=False))

    first = _tick(own_instance, database_url)
    line = _health(first)
    assert first.run_requests == []
    assert line.startswith(
        "attention: destination mine disabled by the SSRF guard, 3 delivery(ies) waiting; "
    ), line
    assert "healthy" not in line
    assert first.skip_reason.skip_message == line
    (alert,) = inbox.texts
    assert alert.startswith("media_hooks: destination mine disabled by the SSRF guard, 3 ")
    assert "127.0.0.1" in alert and "media-hooks destination enable mine" in alert

    again = _tick(own_instance, database_url, first.cursor)
    assert len(inbox.texts) == 1 and _health(again) == line
    enable_destination(conn, "mine")
    _tick(own_instance, database_url, again.cursor)
    assert (
        inbox.texts[1] == "media_hooks: destination mine is enabled again; its deliveries go out."
    )


def _fail_as_the_daemon_would(instance, request: RunRequest) -> str:
    """The requested run, created as the sensor daemon creates it, then failed before it ran
    (as a run interrupted while launching is)."""
    run = instance.create_run_for_job(
        deliver_webhooks_job(),
        run_id=str(uuid.uuid4()),
        tags={**request.tags, "dagster/run_key": request.run_key},
        status=DagsterRunStatus.NOT_STARTED,
    )
    instance.report_run_failed(run, "interrupted while launching")
    return run.run_id


def test_a_failed_catch_up_run_never_blocks_the_next(own_instance, database_url, conn, monkeypatch):
    add_destination(conn, "live", "http://127.0.0.1:9/live")
    add_deliveries(conn, "live", 3, due_seconds_ago=30)
    first = _tick(own_instance, database_url).run_requests[0]
    failed = _fail_as_the_daemon_would(own_instance, first)

    backing_off = _tick(own_instance, database_url)
    assert backing_off.run_requests == []
    assert "backing off: the last catch-up run failed" in backing_off.skip_reason.skip_message

    monkeypatch.setattr(sensors, "FAILURE_BACKOFF_SECONDS", 0.2)
    deadline = time.monotonic() + 10
    while not (retried := _tick(own_instance, database_url)).run_requests:
        assert time.monotonic() < deadline, retried.skip_reason.skip_message
        time.sleep(0.1)  # the backoff passes on the wall clock
    # A new key: Dagster does not skip it as "already requested", as it did the oldest-due key.
    assert retried.run_requests[0].run_key == f"catch-up:after:{failed}"
    assert retried.run_requests[0].run_key != first.run_key


def test_backoff_doubles_while_runs_keep_failing(own_instance, database_url, conn):
    add_destination(conn, "live", "http://127.0.0.1:9/live")
    add_deliveries(conn, "live", 1, due_seconds_ago=30)
    request = _tick(own_instance, database_url).run_requests[0]
    for _ in range(3):
        _fail_as_the_daemon_would(own_instance, request)
    recent = sensors.recent_runs_of(own_instance, deliver_webhooks.name)
    until = sensors.failure_backoff_until(recent, "delivery_lag_sensor")
    assert until.timestamp() == pytest.approx(recent[0].end_time + 4 * 30, abs=0.01)


def test_expired_leases_and_stale_enqueues_are_work(own_instance, database_url, conn):
    add_destination(conn, "live", "http://127.0.0.1:9/live")
    leased = add_deliveries(conn, "live", 2, state="leased")
    conn.execute(
        "UPDATE webhook_delivery_all SET lease_until = now() - interval '1 minute' "
        "WHERE delivery_id = ANY(%s)",
        (leased,),
    )
    expired = _tick(own_instance, database_url).run_requests
    assert [r.tags["media_hooks/work"] for r in expired] == ["2 expired lease(s)"]

    conn.execute(
        "UPDATE webhook_delivery_all SET state = 'succeeded', lease_until = NULL, lease_token = NULL"
    )
    add_deliveries(conn, "live", 3, prefix="q")
    claim_all(conn, "a-run-that-vanished", Cohort())
    quick = DeliverySettingsResource(enqueue_timeout_seconds=60)
    assert _tick(own_instance, database_url, settings=quick).run_requests == []
    conn.execute(
        "UPDATE webhook_delivery_all SET updated_at = now() - interval '2 minutes' WHERE state = 'enqueued'"
    )
    stale = _tick(own_instance, database_url, settings=quick).run_requests
    assert [r.tags["media_hooks/work"] for r in stale] == ["stale enqueues (oldest 120s)"]


def test_a_parked_delivery_left_heading_its_queue_is_woken_and_caught_up(
    own_instance, database_url, conn
):
    """A delivery born parked whose head settled while it was being recorded (the trigger could
    not see it): nothing else is due, yet the next tick makes it due and asks for a run."""
    add_destination(conn, "ordered", "http://127.0.0.1:9/ordered", ordering="asset")
    head, second = (
        emit(conn, Event("ordered", "a1", "rights.updated", {"revision": n})).delivery_id
        for n in (1, 2)
    )
    # Its head leaves the queue without waking it, as when the trigger could not see it (the
    # interleaving itself: test_ordering_born_parked.py).
    conn.execute("ALTER TABLE delivery_state DISABLE TRIGGER delivery_state_left_queue")
    conn.execute(
        "UPDATE webhook_delivery_all SET state = 'succeeded' WHERE delivery_id = %s", (head,)
    )
    conn.execute("ALTER TABLE delivery_state ENABLE TRIGGER delivery_state_left_queue")

    result = _tick(own_instance, database_url)
    assert [
        r.tags["media_hooks/work"].startswith("deliveries due") for r in result.run_requests
    ] == [True]
    assert _health(result).startswith("woke 1 parked delivery(ies) heading their asset's queue; ")
    due = conn.execute(
        "SELECT next_attempt_at <= now() AS due FROM webhook_delivery_all WHERE delivery_id = %s",
        (second,),
    ).fetchone()
    assert due["due"]


@pytest.fixture
def dead_worker() -> run_workers.Worker:
    """A real process, killed: the worker a dead run recorded."""
    process = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    started = psutil.Process(process.pid).create_time()
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    host = run_workers.this_process("").host
    return run_workers.Worker(run_id="", host=host, pid=process.pid, started=started)


def test_the_lag_sensor_fails_a_dead_run_frees_its_slots_and_catches_up_its_rows(
    own_instance, database_url, conn, dead_worker
):
    add_destination(conn, "live", "http://127.0.0.1:9/live")
    add_deliveries(conn, "live", 4)
    run_id = str(uuid.uuid4())
    worker = run_workers.Worker(run_id, dead_worker.host, dead_worker.pid, dead_worker.started)
    own_instance.create_run_for_job(
        deliver_webhooks_job(), run_id=run_id, tags=worker.tag(), status=DagsterRunStatus.STARTED
    )
    claim_all(conn, run_id, Cohort())
    storage = own_instance.event_log_storage
    hold_pool_slot(storage, run_id)

    result = _tick(own_instance, database_url)

    run = own_instance.get_run_by_id(run_id)
    assert run.status == DagsterRunStatus.FAILURE
    assert run.tags[RELEASED_TAG] == "4"
    failure = own_instance.get_records_for_run(run_id, of_type=DagsterEventType.RUN_FAILURE)
    assert f"worker process (pid {dead_worker.pid} on" in failure.records[0].event_log_entry.message
    assert slot_holders(storage) == []
    assert states(conn) == {"pending": 4}
    assert [r.run_key for r in result.run_requests] == [f"catch-up:after:{run_id}"]
    assert _health(result).startswith("recovered 1 dead run(s), 4 delivery(ies) due again; ")
    # The daemon's failure sensor sees the run fail next: nothing left to do, nothing miscounted.
    assert "0 delivery(ies) due again" in _on_failure(own_instance, run, database_url).skip_message
    assert own_instance.get_run_by_id(run_id).tags[RELEASED_TAG] == "4"


def test_a_live_run_is_left_alone(own_instance, database_url, conn):
    add_destination(conn, "live", "http://127.0.0.1:9/live")
    add_deliveries(conn, "live", 2)
    run_id = str(uuid.uuid4())
    me = run_workers.this_process(run_id)
    own_instance.create_run_for_job(
        deliver_webhooks_job(), run_id=run_id, tags=me.tag(), status=DagsterRunStatus.STARTED
    )
    claim_all(conn, run_id, Cohort())
    result = _tick(own_instance, database_url)
    assert own_instance.get_run_by_id(run_id).status == DagsterRunStatus.STARTED
    assert states(conn) == {"enqueued": 2}
    assert result.run_requests == []


def test_one_alert_per_incident_then_one_recovery(
    own_instance, database_url, conn, inbox, monkeypatch, in_flight_run
):
    monkeypatch.setenv("MEDIA_HOOKS_ALERT_URL", inbox.url)
    monkeypatch.setenv("MEDIA_HOOKS_ALERT_OLDEST_DUE_SECONDS", "60")
    add_destination(conn, "live", "http://127.0.0.1:9/live")
    late = add_deliveries(conn, "live", 3, due_seconds_ago=600)
    in_flight_run()  # keeps the catch-up request out of the way

    cursor = None
    for _ in range(3):
        cursor = _tick(own_instance, database_url, cursor).cursor
    assert len(inbox.texts) == 1
    assert "delivery incident" in inbox.texts[0]
    assert "oldest due delivery is 6" in inbox.texts[0]

    conn.execute(
        "UPDATE webhook_delivery_all SET state = 'succeeded' WHERE delivery_id = ANY(%s)", (late,)
    )
    for _ in range(2):
        cursor = _tick(own_instance, database_url, cursor).cursor
    assert len(inbox.texts) == 2
    assert inbox.texts[1].startswith("media_hooks: recovered")


def test_a_transaction_left_open_is_alerted_naming_its_session(
    own_instance, database_url, conn, inbox, monkeypatch
):
    monkeypatch.setenv("MEDIA_HOOKS_ALERT_URL", inbox.url)
    monkeypatch.setenv("MEDIA_HOOKS_ALERT_OLDEST_SNAPSHOT_SECONDS", "0.25")
    with snapshot_held(database_url, "nightly-report") as pid:
        wait_for(
            lambda: (figures.measure(conn).oldest_snapshot_age_seconds or 0) >= 0.25,
            "the open transaction to pass the threshold",
        )
        cursor = _tick(own_instance, database_url).cursor
    assert len(inbox.texts) == 1
    assert inbox.texts[0].startswith("media_hooks: delivery incident: a transaction open for ")
    assert (
        f"(pid {pid}, application_name 'nightly-report', idle in transaction)" in (inbox.texts[0])
    )
    assert "holds back vacuum (threshold 0s)" in inbox.texts[0]
    _tick(own_instance, database_url, cursor)
    assert inbox.texts[1].startswith("media_hooks: recovered")


def test_an_alert_that_did_not_get_through_is_sent_on_the_next_tick(
    own_instance, database_url, conn, inbox, monkeypatch, in_flight_run
):
    monkeypatch.setenv("MEDIA_HOOKS_ALERT_URL", "http://127.0.0.1:9/nowhere")
    monkeypatch.setenv("MEDIA_HOOKS_ALERT_OLDEST_DUE_SECONDS", "60")
    add_destination(conn, "live", "http://127.0.0.1:9/live")
    add_deliveries(conn, "live", 1, due_seconds_ago=600)
    in_flight_run()
    cursor = _tick(own_instance, database_url).cursor
    monkeypatch.setenv("MEDIA_HOOKS_ALERT_URL", inbox.url)
    _tick(own_instance, database_url, cursor)
    assert len(inbox.texts) == 1


def _on_failure(instance, run, database_url: str) -> SkipReason:
    """The run-failure sensor's evaluation for ``run``."""
    event = DagsterEvent(
        event_type_value=DagsterEventType.RUN_FAILURE.value, job_name="deliver_webhooks"
    )
    with build_run_status_sensor_context(
        sensor_name="delivery_run_failure_sensor",
        dagster_event=event,
        dagster_instance=instance,
        dagster_run=run,
        resources={"postgres": PostgresResource(database_url=database_url)},
    ) as context:
        return failure_sensor(context.for_run_failure())


def test_failure_sensor_releases_exactly_the_failed_runs_rows_and_frees_its_slots(
    own_instance, database_url, conn
):
    add_destination(conn, "a", "http://127.0.0.1:9/a")
    add_destination(conn, "b", "http://127.0.0.1:9/b")
    add_deliveries(conn, "a", 4)
    add_deliveries(conn, "b", 3)
    failed = own_instance.create_run_for_job(
        deliver_webhooks_job(), run_id=str(uuid.uuid4()), status=DagsterRunStatus.FAILURE
    )
    other = str(uuid.uuid4())
    claim_all(conn, failed.run_id, Cohort(destination_ids=("a",)))
    claim_all(conn, other, Cohort(destination_ids=("b",)))
    storage = own_instance.event_log_storage
    for run_id in (failed.run_id, other):
        hold_pool_slot(storage, run_id)
    result = _on_failure(own_instance, failed, database_url)

    assert isinstance(result, SkipReason)
    assert "4 delivery(ies) due again, 1 pool slot(s) freed" in result.skip_message
    states = conn.execute(
        "SELECT destination_id, state, count(*) AS n FROM webhook_delivery_all GROUP BY 1, 2 ORDER BY 1"
    ).fetchall()
    assert [(r["destination_id"], r["state"], r["n"]) for r in states] == [
        ("a", "pending", 4),
        ("b", "enqueued", 3),
    ]
    assert slot_holders(storage) == [other]
    assert own_instance.get_run_by_id(failed.run_id).tags[RELEASED_TAG] == "4"


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
