"""The Dagster resources, one class per file: the database and the delivery settings."""

from media_hooks.orchestration.resources.delivery_settings import DeliverySettingsResource
from media_hooks.orchestration.resources.postgres import PostgresResource

__all__ = ["DeliverySettingsResource", "PostgresResource"]
