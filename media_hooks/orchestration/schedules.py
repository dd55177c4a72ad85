"""Schedules: the nightly delivery run (a recovery clock) and daily retention."""

import os
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from dagster import (
    DefaultScheduleStatus,
    JobDefinition,
    RunRequest,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    schedule,
)

from media_hooks.core.errors import UserError

TIMEZONE_VARIABLE = "MEDIA_HOOKS_SCHEDULE_TIMEZONE"


def schedule_timezone() -> str:
    name = os.environ.get(TIMEZONE_VARIABLE) or "UTC"
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise UserError(f"{TIMEZONE_VARIABLE} is not a known timezone: {name!r}") from None
    return name


def build_daily_schedule(
    job: JobDefinition, *, name: str, cron: str, description: str
) -> ScheduleDefinition:
    @schedule(
        name=name,
        job=job,
        cron_schedule=cron,
        execution_timezone=schedule_timezone(),
        default_status=DefaultScheduleStatus.RUNNING,
        description=description,
    )
    def _daily(context: ScheduleEvaluationContext) -> RunRequest:
        return RunRequest(
            run_key=None,
            tags={
                "media_hooks/trigger": name,
                "media_hooks/scheduled_for": context.scheduled_execution_time.isoformat(),
            },
        )

    return _daily
