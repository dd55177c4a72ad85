"""What each delivery may be, learnt from what the sessions committed, set against the rows.

The rows are the truth the model is checked against, step by step: a delivery moves only the
ways a committed step allows (a success only by a recorded success, back from dead only by a
requeue, out of the table only by a retention purge, and never back), and what the workers were
granted is kept to check the limiter against its ceiling on the database's clock.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

TERMINAL = ("succeeded", "dead")


@dataclass(frozen=True)
class Row:
    delivery_id: str
    destination_id: str
    asset_id: str
    event_type: str
    state: str
    closed_reason: str | None
    emit_seq: int | None
    created_at: datetime

    @property
    def emitted(self) -> tuple[datetime, int, str]:
        """Emission order, as the protocol's statements read it."""
        return (self.created_at, self.emit_seq or 0, self.delivery_id)


@dataclass
class StepFacts:
    """What the step that just ran committed."""

    successes: list[str] = field(default_factory=list)
    requeued: bool = False
    purged: bool = False
    swept_superseded: bool = False


@dataclass
class Model:
    rows: dict[str, Row] = field(default_factory=dict)
    succeeded: set[str] = field(default_factory=set)
    purged: dict[str, str] = field(default_factory=dict)  # delivery_id -> destination_id
    grants: dict[str, list[datetime]] = field(default_factory=lambda: defaultdict(list))
    step: StepFacts = field(default_factory=StepFacts)

    def committed_successes(self, delivery_ids: list[str]) -> None:
        for delivery_id in delivery_ids:
            assert delivery_id not in self.succeeded, f"{delivery_id} recorded a second success"
            self.succeeded.add(delivery_id)
        self.step.successes += delivery_ids

    def committed_grants(self, grants: list[tuple[str, datetime]]) -> None:
        for destination_id, start_at in grants:
            self.grants[destination_id].append(start_at)

    def observe(self, rows: dict[str, Row]) -> None:
        """Check the step's move from the rows seen before to ``rows``, then keep them."""
        step, self.step = self.step, StepFacts()
        for delivery_id, before in self.rows.items():
            after = rows.get(delivery_id)
            if after is None:
                assert step.purged, f"{delivery_id} vanished without a retention purge"
                assert before.state in TERMINAL, f"{delivery_id} purged while {before.state}"
                self.purged[delivery_id] = before.destination_id
                continue
            if before.state == "succeeded":
                assert after.state == "succeeded", (
                    f"{delivery_id} left succeeded for {after.state} ({after.closed_reason})"
                )
            if before.state == "dead" and after.state != "dead":
                assert step.requeued, f"{delivery_id} left dead for {after.state} unrequeued"
        for delivery_id, after in rows.items():
            assert delivery_id not in self.purged, f"purged {delivery_id} is back"
            before = self.rows.get(delivery_id)
            if after.state == "succeeded" and (before is None or before.state != "succeeded"):
                assert delivery_id in step.successes, (
                    f"{delivery_id} succeeded without a recorded success"
                )
        self.rows = rows
