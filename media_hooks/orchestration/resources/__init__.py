from media_hooks.orchestration.resources.delivery_settings import DeliverySettingsResource
from media_hooks.orchestration.resources.postgres import PostgresResource

__all__ = ["DeliverySettingsResource", "PostgresResource"]
