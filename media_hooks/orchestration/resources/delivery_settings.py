"""DeliverySettingsResource: the engine's Settings plus the job's sizing defaults."""

from __future__ import annotations

import dataclasses

from dagster import ConfigurableResource
from pydantic import Field

from media_hooks.core.config import Settings


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

    def settings(self) -> Settings:
        settings = Settings.from_env()
        overrides = {
            "lease_seconds": self.lease_seconds,
            "enqueue_timeout_seconds": self.enqueue_timeout_seconds,
        }
        return dataclasses.replace(
            settings, **{k: v for k, v in overrides.items() if v is not None}
        )
