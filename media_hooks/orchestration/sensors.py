"""Sensors, each built by a small factory: the lag sensor and the run-failure release."""

from __future__ import annotations

from datetime import UTC, datetime

from dagster import (
    DagsterInstance,
    DagsterRunStatus,
    DefaultSensorStatus,
    JobDefinition,
    RunFailureSensorContext,
    RunRecord,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    run_failure_sensor,
    sensor,
)

from media_hooks.observe import figures, health
from media_hooks.observe.figures import Figures
from media_hooks.orchestration import alerts, recovery
from media_hooks.orchestration.resources import DeliverySettingsResource, PostgresResource
from media_hooks.outbox.maintenance import sweeps

IN_FLIGHT = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]
# After a catch-up run of this sensor failed, the next waits this long, doubled for each further
# failed catch-up in a row, up to the cap: a fault that fails every run is not retried every
# tick. (A run that died with its worker, or failed otherwise, is caught up at once.)
FAILURE_BACKOFF_SECONDS = 30.0
FAILURE_BACKOFF_CAP_SECONDS = 600.0
TRIGGER_TAG = "media_hooks/trigger"
_RECENT_RUNS = 8
HEALTHY = "healthy"


def delivery_in_flight(context: SensorEvaluationContext, job_name: str) -> bool:
    records = context.instance.get_run_records(
        filters=RunsFilter(job_name=job_name, statuses=IN_FLIGHT), limit=1
    )
    return bool(records)


def recent_runs_of(instance: DagsterInstance, job_name: str) -> list[RunRecord]:
    """The newest delivery runs, newest first."""
    return list(instance.get_run_records(filters=RunsFilter(job_name=job_name), limit=_RECENT_RUNS))


def failure_backoff_until(recent: list[RunRecord], trigger: str) -> datetime | None:
    """When the next catch-up may start, after the newest runs were catch-ups of ``trigger``
    that failed in a row; None if the newest run is not one."""
    failed = 0
    for record in recent:
        run = record.dagster_run
        if run.status != DagsterRunStatus.FAILURE or run.tags.get(TRIGGER_TAG) != trigger:
            break
        failed += 1
    if not failed or recent[0].end_time is None:
        return None
    delay = min(FAILURE_BACKOFF_SECONDS * 2 ** (failed - 1), FAILURE_BACKOFF_CAP_SECONDS)
    return datetime.fromtimestamp(recent[0].end_time + delay, UTC)


def catch_up_request(recent: list[RunRecord], work: list[str], trigger: str) -> RunRequest:
    # Keyed by the newest delivery run, whatever became of it: a tick that asks again before
    # Dagster created the requested run asks with the same key (Dagster starts it once), and a
    # run that failed or was canceled never blocks the next catch-up.
    after = recent[0].dagster_run.run_id if recent else "none"
    return RunRequest(
        run_key=f"catch-up:after:{after}",
        tags={TRIGGER_TAG: trigger, "media_hooks/work": "; ".join(work)},
    )


def _send_alerts(context: SensorEvaluationContext, messages: list[str]) -> bool:
    url = alerts.alert_url()
    delivered = True
    for text in messages:
        context.log.warning(text)
        if url:
            delivered = alerts.post(url, text) and delivered
    return delivered


def _recover(context: SensorEvaluationContext, conn, job_name: str, settings) -> str:
    recovered = recovery.recover(
        context.instance,
        conn,
        job_name,
        window_seconds=recovery.window_seconds(settings.enqueue_timeout_seconds),
    )
    for done in recovered:
        context.log.warning(f"recovered {done.describe()}")
    if not recovered:
        return ""
    released = sum(done.released for done in recovered)
    return f"recovered {len(recovered)} dead run(s), {released} delivery(ies) due again; "


def _measure_waking_parked_heads(
    context: SensorEvaluationContext, conn, settings
) -> tuple[str, Figures]:
    """The figures, after making due the parked deliveries left heading their queue (born
    parked while the delivery before them settled), when no run would come for other work:
    they then wait a tick and a catch-up run, not for the nightly run. While there is other
    work, the run it brings wakes them in its sweeps, and the tick spares the walk."""
    measured = figures.measure(conn, history=False)
    if measured.work_waiting(settings.enqueue_timeout_seconds):
        return "", measured
    woken = sweeps.sweep_wake_parked_heads(conn)
    if not woken:
        return "", measured
    context.log.info(f"woke {woken} parked delivery(ies) heading their asset's queue")
    return f"woke {woken} parked delivery(ies) heading their asset's queue; ", figures.measure(
        conn, history=False
    )


def _decide(
    context: SensorEvaluationContext, job_name: str, f: figures.Figures, settings, trigger: str
) -> tuple[RunRequest | None, str]:
    """A catch-up run request, or why not, in words."""
    work = f.work_waiting(settings.enqueue_timeout_seconds)
    if not work:
        return None, HEALTHY
    if delivery_in_flight(context, job_name):
        return None, "waiting: a delivery run is queued or in progress"
    recent = recent_runs_of(context.instance, job_name)
    resume_at = failure_backoff_until(recent, trigger)
    if resume_at is not None and resume_at > datetime.now(UTC):
        return None, (
            f"backing off: the last catch-up run failed; next catch-up after "
            f"{resume_at:%H:%M:%S} UTC"
        )
    request = catch_up_request(recent, work, trigger)
    return request, "catch-up run requested (" + "; ".join(work) + ")"


def _with_attention(why: str, f: Figures) -> str:
    """``why``, never "healthy" while a destination is disabled: each is named after it."""
    look = health.attention(f)
    if not look:
        return why
    lead = "attention: " if why == HEALTHY else f"{why}; attention: "
    return lead + "; ".join(look)


def build_delivery_lag_sensor(
    job: JobDefinition, *, interval_seconds: int = 30, name: str = "delivery_lag_sensor"
) -> SensorDefinition:
    @sensor(
        name=name,
        job=job,
        minimum_interval_seconds=interval_seconds,
        default_status=DefaultSensorStatus.RUNNING,
        description="Recovers dead delivery runs; makes due a parked delivery left heading its "
        "asset's queue; measures oldest due age, relay lag, expired "
        "leases and dead letters; starts a catch-up run whenever there is work (due "
        "deliveries, expired leases, stale enqueues) and no delivery run is queued or in "
        "progress; alerts once per incident (MEDIA_HOOKS_ALERT_URL) and once when it clears, and "
        "once for each destination disabled. Each tick's health line is in its cursor: "
        "'healthy' only while no destination is disabled.",
    )
    def _lag_sensor(
        context: SensorEvaluationContext,
        postgres: PostgresResource,
        delivery_settings: DeliverySettingsResource,
    ):
        settings = delivery_settings.settings()
        with postgres.connection() as conn:
            recovered = _recover(context, conn, job.name, settings)
            woken, f = _measure_waking_parked_heads(context, conn, settings)
            recovered += woken
        previous = alerts.AlertState.loads(context.cursor)
        decision = alerts.decide(f, previous, alerts.Thresholds.from_env())
        delivered = _send_alerts(context, decision.messages)
        request, why = _decide(context, job.name, f, settings, trigger=name)
        line = f"{recovered}{_with_attention(why, f)}; {f.headline()}"
        context.log.info(line)
        # An alert that did not get through is tried again on the next tick.
        cursor = (decision.state if delivered else previous).dumps(line)
        if request is not None:
            return SensorResult(run_requests=[request], cursor=cursor)
        return SensorResult(skip_reason=SkipReason(line), cursor=cursor)

    return _lag_sensor


def build_run_failure_release(
    job: JobDefinition, *, name: str = "delivery_run_failure_sensor"
) -> SensorDefinition:
    @run_failure_sensor(
        name=name,
        monitored_jobs=[job],
        default_status=DefaultSensorStatus.RUNNING,
        description="When a delivery run fails, its enqueued and leased rows go back to "
        "pending at once (found through the outbox's run_id) and its delivery pool slots are "
        "freed, instead of waiting for the lease or enqueue timeout.",
    )
    def _release(context: RunFailureSensorContext, postgres: PostgresResource):
        with postgres.connection() as conn:
            done = recovery.release(context.instance, conn, context.dagster_run, reason=None)
        context.log.info(f"released {done.describe()}")
        return SkipReason(f"released {done.describe()}")

    return _release
