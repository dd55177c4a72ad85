"""DeliverySettingsResource: the engine's Settings plus the job's sizing defaults."""

from __future__ import annotations

import dataclasses

from dagster import ConfigurableResource
from pydantic import Field

from media_hooks.core import numeric
from media_hooks.core.config import Settings, shards_from_env


class DeliverySettingsResource(ConfigurableResource):
    """Lease and enqueue timeouts default to the environment (MEDIA_HOOKS_LEASE_SECONDS,
    MEDIA_HOOKS_ENQUEUE_TIMEOUT_SECONDS); the job's sizing defaults are set here."""

    lease_seconds: float | None = Field(
        default=None, description="Override MEDIA_HOOKS_LEASE_SECONDS for this deployment."
    )
    enqueue_timeout_seconds: float | None = Field(
        default=None,
        description="Override MEDIA_HOOKS_ENQUEUE_TIMEOUT_SECONDS for this deployment.",
    )
    default_page_size: int = Field(
        default=250, description="Rows a destination claims per transaction."
    )
    default_max_rows: int | None = Field(
        default=None, description="Most rows one run claims; empty means no cap."
    )
    default_shards: int | None = Field(
        default=None,
        description="Delivery steps of a run whose config names none; empty: "
        "MEDIA_HOOKS_SHARDS, else one per Celery worker process, else one.",
    )

    def configured_shards(self) -> int | None:
        """The deployment's number of shards, when it sets one (a Kubernetes deployment, where
        no worker count is known, sets MEDIA_HOOKS_SHARDS)."""
        if self.default_shards is not None:
            return numeric.check(self.default_shards, "default_shards", numeric.COUNT)
        return shards_from_env()

    def settings(self) -> Settings:
        settings = Settings.from_env()
        overrides = {
            "lease_seconds": self.lease_seconds,
            "enqueue_timeout_seconds": self.enqueue_timeout_seconds,
        }
        return dataclasses.replace(
            settings, **{k: v for k, v in overrides.items() if v is not None}
        )
