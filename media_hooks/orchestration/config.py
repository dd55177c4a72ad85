"""Run config for the jobs: what the Launchpad shows as a form, with defaults and help."""

from __future__ import annotations

from datetime import datetime

from dagster import Config
from pydantic import Field

from media_hooks.core.config import run_runtime
from media_hooks.core.errors import UserError
from media_hooks.outbox.cohort import Cohort
from media_hooks.outbox.maintenance.retention import RetentionPolicy


class CohortConfig(Config):
    """Which deliveries: empty filters match everything; different filters combine with AND."""

    destination_ids: list[str] = Field(default=[], description="Only these destinations.")
    event_types: list[str] = Field(default=[], description="Only these event types.")
    asset_ids: list[str] = Field(default=[], description="Only these assets.")
    created_after: str | None = Field(
        default=None, description="Only deliveries recorded at or after this ISO 8601 time."
    )
    created_before: str | None = Field(
        default=None, description="Only deliveries recorded before this ISO 8601 time."
    )

    def cohort(self) -> Cohort:
        return Cohort(
            destination_ids=tuple(self.destination_ids),
            event_types=tuple(self.event_types),
            asset_ids=tuple(self.asset_ids),
            created_after=_instant("created_after", self.created_after),
            created_before=_instant("created_before", self.created_before),
        )


def _instant(name: str, value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise UserError(f"{name} must be an ISO 8601 time, got {value!r}") from None
    if parsed.tzinfo is None:
        raise UserError(f"{name} needs a UTC offset (e.g. {value}+00:00)")
    return parsed


class DeliverConfig(CohortConfig):
    """One delivery run: sweep, optionally requeue dead letters, then deliver each destination
    with due work, each claiming its deliveries a page at a time."""

    include_dead: bool = Field(
        default=False,
        description="First requeue the cohort's dead letters (fresh retry budget, audited).",
    )
    requeue_reason: str = Field(
        default="",
        description="Why the dead letters are requeued (required with include_dead).",
    )
    page_size: int | None = Field(
        default=None,
        description="Rows a destination claims per transaction, as it needs them; empty uses "
        "the deployment default (250).",
    )
    max_rows: int | None = Field(
        default=None,
        description="Most rows this run claims in all; empty uses the deployment default (no "
        "cap: each destination claims until none of its deliveries is due).",
    )
    shards: int | None = Field(
        default=None,
        description="Delivery steps the destinations are split into; empty: MEDIA_HOOKS_SHARDS, "
        "else one per Celery worker process serving the steps (the celery executor), else one. "
        "Each step delivers "
        "its destinations concurrently, in threads; with the in-process executor (the local "
        "default) steps run one after another, so more than one pays only with the "
        "multiprocess or celery executor (Launchpad: execution config) or to isolate "
        "destinations in separate steps.",
    )

    runtime: str | None = Field(
        default=None,
        description="Which program delivers: python (the engine, in the step's process) or "
        "node (the Node.js worker, node/, launched by the step through Dagster Pipes); empty: "
        "MEDIA_HOOKS_RUNTIME, else python. The node runtime delivers whole destinations: "
        "event_types, asset_ids and the created_ filters need python.",
    )

    def delivery_runtime(self) -> str:
        filtered = bool(
            self.event_types or self.asset_ids or self.created_after or self.created_before
        )
        return run_runtime(self.runtime, "runtime", filtered=filtered)

    def check(self) -> None:
        if self.include_dead and not self.requeue_reason.strip():
            raise UserError("include_dead needs a requeue_reason: it is kept in the audit trail")
        for name in ("page_size", "max_rows", "shards"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UserError(f"{name} must be at least 1, got {value}")


class RequeueConfig(CohortConfig):
    """Make a cohort due now: same delivery_id, fresh retry budget, audited."""

    states: list[str] = Field(default=["dead"], description="Which states to requeue.")
    reason: str = Field(description="Why: kept in the audit trail (delivery_requeue).")
    requested_by: str = Field(default="dagster", description="Who asked, for the audit trail.")
    dry_run: bool = Field(default=True, description="Count and sample only; move nothing.")


class DiscardConfig(Config):
    """Close dead deliveries unsent: an ordered queue's dead head lets its successors go."""

    delivery_ids: list[str] = Field(description="The dead deliveries to discard.")
    reason: str = Field(description="Why: kept with each delivery.")
    requested_by: str = Field(default="dagster", description="Who asked.")


class RetentionConfig(Config):
    """Purge terminal deliveries past the retention window; keep their ids as tombstones."""

    retain_days: float = Field(
        default=30, description="Keep succeeded and dead deliveries this many days."
    )
    tombstone_days: float = Field(
        default=400,
        description="Recognise a purged delivery_id this many days after its event "
        "(the duplicate window).",
    )
    batch_size: int = Field(
        default=RetentionPolicy.batch_size, description="Deliveries deleted per transaction."
    )
    max_batches: int = Field(
        default=RetentionPolicy.max_batches,
        description="Most batches one run deletes (the next run carries on): a safety bound "
        "far above a day's deliveries, so the daily run keeps up.",
    )
