"""A cohort: which deliveries a run, a requeue or a report is about."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class Cohort:
    """Empty filters match everything; filters of different kinds combine with AND."""

    destination_ids: tuple[str, ...] = ()
    event_types: tuple[str, ...] = ()
    asset_ids: tuple[str, ...] = ()
    created_after: datetime | None = None
    created_before: datetime | None = None

    def params(self) -> dict[str, Any]:
        """The named parameters of ``media_hooks_in_cohort`` in sql/queries."""
        return {
            "destination_ids": list(self.destination_ids),
            "event_types": list(self.event_types),
            "asset_ids": list(self.asset_ids),
            "created_after": self.created_after,
            "created_before": self.created_before,
        }

    def describe(self) -> dict[str, str]:
        """Short strings for run tags, metadata and audit rows; only the filters that are set."""
        described = {
            "destination_ids": ",".join(self.destination_ids),
            "event_types": ",".join(self.event_types),
            "asset_ids": ",".join(self.asset_ids),
            "created_after": self.created_after.isoformat() if self.created_after else "",
            "created_before": self.created_before.isoformat() if self.created_before else "",
        }
        return {key: value for key, value in described.items() if value}
