"""Every job, schedule, sensor and resource of media_hooks, on one screen.

Loaded by ``workspace.yaml`` (``dagster dev``, the webserver and daemon) and by
``media-hooks run``. Deployment differences are environment variables, read by the resources
and the schedule timezone, not branches here.
"""

from __future__ import annotations

import warnings

from dagster import BetaWarning, Definitions, JobDefinition

from media_hooks.orchestration.jobs import deliver_webhooks, discard_dead, requeue_cohort, retention
from media_hooks.orchestration.outbox_asset import build_outbox_checks_sensor, outbox, outbox_checks
from media_hooks.orchestration.resources import DeliverySettingsResource, PostgresResource
from media_hooks.orchestration.resources.step_outputs import postgres_step_outputs
from media_hooks.orchestration.schedules import build_daily_schedule
from media_hooks.orchestration.sensors import build_delivery_lag_sensor, build_run_failure_release

# run_failure_sensor passes a beta parameter to Dagster's own SensorDefinition; the warning
# would repeat in every step process's log.
warnings.filterwarnings("ignore", category=BetaWarning, message="Parameter `owners`")

nightly_delivery = build_daily_schedule(
    deliver_webhooks,
    name="nightly_delivery",
    cron="0 2 * * *",
    description="The recovery clock: a full delivery run every night at 02:00 "
    "(MEDIA_HOOKS_SCHEDULE_TIMEZONE, default UTC), whatever the sensors did.",
)
daily_retention = build_daily_schedule(
    retention,
    name="daily_retention",
    cron="30 3 * * *",
    description="Purges terminal deliveries past the retention window, keeping tombstones.",
)

delivery_lag_sensor = build_delivery_lag_sensor(deliver_webhooks)
delivery_run_failure_sensor = build_run_failure_release(deliver_webhooks)
outbox_checks_sensor = build_outbox_checks_sensor()

defs = Definitions(
    # The outbox in the catalog: materialized by every delivery run, its checks evaluated after
    # each run and every few minutes (media_hooks/orchestration/outbox_asset.py).
    assets=[outbox],
    asset_checks=[outbox_checks],
    jobs=[deliver_webhooks, requeue_cohort, discard_dead, retention],
    schedules=[nightly_delivery, daily_retention],
    sensors=[delivery_lag_sensor, delivery_run_failure_sensor, outbox_checks_sensor],
    resources={
        "postgres": PostgresResource(),
        "delivery_settings": DeliverySettingsResource(),
        # Step outputs in PostgreSQL: a run's steps may execute on different hosts (Celery).
        "io_manager": postgres_step_outputs,
    },
)


def deliver_webhooks_job() -> JobDefinition:
    """The job with its resources bound: what ``reconstructable`` rebuilds in each step process."""
    return defs.resolve_job_def("deliver_webhooks")
