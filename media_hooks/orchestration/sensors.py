"""Sensors, each built by a small factory: the lag sensor and the run-failure release."""

from dagster import (
    DagsterRunStatus,
    DefaultSensorStatus,
    JobDefinition,
    RunFailureSensorContext,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    run_failure_sensor,
    sensor,
)

from media_hooks import figures, sweeps
from media_hooks.orchestration import alerts
from media_hooks.orchestration.resources import PostgresResource

IN_FLIGHT = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
]


def delivery_in_flight(context: SensorEvaluationContext, job_name: str) -> bool:
    records = context.instance.get_run_records(
        filters=RunsFilter(job_name=job_name, statuses=IN_FLIGHT), limit=1
    )
    return bool(records)


def catch_up_request(f: figures.Figures) -> RunRequest:
    # Keyed by the oldest due row: a second tick on the same backlog never starts a second run,
    # and a run that took that row lets the next backlog get its own key.
    return RunRequest(
        run_key=f"catch-up:{f.oldest_due_at.isoformat()}",
        tags={"media_hooks/trigger": "delivery_lag_sensor"},
    )


def _send_alerts(context: SensorEvaluationContext, messages: list[str]) -> bool:
    url = alerts.alert_url()
    delivered = True
    for text in messages:
        context.log.warning(text)
        if url:
            delivered = alerts.post(url, text) and delivered
    return delivered


def build_delivery_lag_sensor(
    job: JobDefinition, *, interval_seconds: int = 30, name: str = "delivery_lag_sensor"
) -> SensorDefinition:
    @sensor(
        name=name,
        job=job,
        minimum_interval_seconds=interval_seconds,
        default_status=DefaultSensorStatus.RUNNING,
        description="Measures oldest due age, relay lag, expired leases and dead letters; "
        "starts a catch-up run when due work waits and no delivery run is queued or running; "
        "alerts once per incident (MEDIA_HOOKS_ALERT_URL) and once when it clears.",
    )
    def _lag_sensor(context: SensorEvaluationContext, postgres: PostgresResource):
        with postgres.connection() as conn:
            f = figures.measure(conn)
        previous = alerts.AlertState.loads(context.cursor)
        decision = alerts.decide(f, previous, alerts.Thresholds.from_env())
        delivered = _send_alerts(context, decision.messages)
        # An alert that did not get through is tried again on the next tick.
        cursor = (decision.state if delivered else previous).dumps()
        if f.due_work and not delivery_in_flight(context, job.name):
            return SensorResult(run_requests=[catch_up_request(f)], cursor=cursor)
        waiting = "a delivery run is in flight; " if f.due_work else "healthy; "
        return SensorResult(skip_reason=SkipReason(waiting + f.headline()), cursor=cursor)

    return _lag_sensor


def build_run_failure_release(
    job: JobDefinition, *, name: str = "delivery_run_failure_sensor"
) -> SensorDefinition:
    @run_failure_sensor(
        name=name,
        monitored_jobs=[job],
        default_status=DefaultSensorStatus.RUNNING,
        description="When a delivery run fails, its enqueued and leased rows go back to "
        "pending at once (found through the outbox's run_id), instead of waiting for the "
        "lease or enqueue timeout.",
    )
    def _release(context: RunFailureSensorContext, postgres: PostgresResource):
        run_id = context.dagster_run.run_id
        with postgres.connection() as conn:
            released = sweeps.release_run(conn, run_id)
        context.log.info(f"released {released} delivery(ies) of failed run {run_id}")
        return SkipReason(f"released {released} delivery(ies) of failed run {run_id}")

    return _release
