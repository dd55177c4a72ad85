"""What a run shows in the UI: Markdown tables, tags, "where are my rows"."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from media_hooks.observe.health import Disabled
from media_hooks.outbox.cohort import Cohort

TAG_PREFIX = "media_hooks/"
# Dagster caps tag values in strict mode; a long cohort is summarised, never rejected.
_TAG_VALUE_MAX = 63


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---" for _ in headers) + "|",
    ]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def counts_table(per_destination: Mapping[str, Mapping[str, int]], columns: Sequence[str]) -> str:
    rows = [
        [destination, *(counts.get(column, 0) for column in columns)]
        for destination, counts in sorted(per_destination.items())
    ]
    return markdown_table(["destination", *columns], rows)


def cohort_tags(cohort: Cohort) -> dict[str, str]:
    """Run tags naming the cohort (``all`` when no filter is set)."""
    described = cohort.describe() or {"filter": "all"}
    return {f"{TAG_PREFIX}cohort.{key}": _tag_value(value) for key, value in described.items()}


def _tag_value(value: str) -> str:
    if len(value) <= _TAG_VALUE_MAX:
        return value
    return value[: _TAG_VALUE_MAX - 12] + "…+" + hashlib.sha1(value.encode()).hexdigest()[:8]


# The run list shows a run's tags in key order, each cut to a short width: this one comes
# first and stays short, and only a run that needs a look has it.
ALERT_TAG = "alert"
NOTHING_DELIVERED = "nothing delivered"
DESTINATION_DISABLED = "destination disabled"


def run_outcome(claimed: int, delivered: int, due_unsendable: bool = False) -> str:
    """A delivery run's result in one word for the run list. Only an infrastructure fault fails a
    run; what receivers answered is this. ``due_unsendable``: deliveries were due when it ended,
    for paused or disabled destinations only."""
    if claimed == 0:
        return "nothing-sendable" if due_unsendable else "nothing-due"
    if delivered == 0:
        return "nothing-delivered"
    return "all-delivered" if delivered >= claimed else "partly-delivered"


def run_alert(claimed: int, delivered: int, disabled: Sequence[Disabled]) -> str | None:
    """What in a green run needs a look: it delivered nothing while work was due (claimed, or
    waiting for a disabled destination), or a destination is disabled; else None."""
    waiting = any(d.waiting for d in disabled)
    if delivered == 0 and (claimed or waiting):
        return NOTHING_DELIVERED
    return DESTINATION_DISABLED if disabled else None


def outcome_tags(
    claimed: int,
    totals: Mapping[str, int],
    *,
    due_unsendable: bool = False,
    disabled: Sequence[Disabled] = (),
) -> dict[str, str]:
    delivered = totals.get("succeeded", 0)
    tags = {
        f"{TAG_PREFIX}outcome": run_outcome(claimed, delivered, due_unsendable),
        f"{TAG_PREFIX}claimed": str(claimed),
        f"{TAG_PREFIX}delivered": str(delivered),
    }
    alert = run_alert(claimed, delivered, disabled)
    if alert is not None:
        tags[ALERT_TAG] = alert
    return tags


def rows_of_run(run_id: str) -> str:
    """Markdown telling an operator how to get from this run to its rows."""
    return "\n".join(
        [
            "List this run's rows:",
            "",
            "```sql",
            "SELECT o.message_id, o.delivery_id, o.destination_id, o.published_at, d.state",
            "FROM dispatch_outbox o JOIN webhook_delivery_all d USING (delivery_id)",
            f"WHERE o.run_id = '{run_id}' ORDER BY o.destination_id, o.message_id;",
            "",
            # From the run's dispatches to their attempts: both by index, however long the
            # history (no index has the attempts' run_id).
            "SELECT a.delivery_id, a.attempt_no, a.outcome, a.http_status, a.started_at,",
            "       a.finished_at",
            "FROM dispatch_outbox o JOIN delivery_attempt_all a ON a.delivery_id = o.delivery_id",
            "  AND a.message_id = o.message_id AND a.run_id = o.run_id",
            f"WHERE o.run_id = '{run_id}' ORDER BY a.started_at;",
            "```",
            "",
            "One delivery's whole story (every dispatch with its run id, every attempt):",
            "`media-hooks inspect DELIVERY_ID`",
        ]
    )
