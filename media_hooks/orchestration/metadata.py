"""What a run shows in the UI: Markdown tables, tags, "where are my rows"."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

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


def run_outcome(claimed: int, delivered: int) -> str:
    """A delivery run's result in one word for the run list. Only an infrastructure fault fails a
    run; what receivers answered is this."""
    if claimed == 0:
        return "nothing-due"
    if delivered == 0:
        return "nothing-delivered"
    return "all-delivered" if delivered >= claimed else "partly-delivered"


def outcome_tags(claimed: int, totals: Mapping[str, int]) -> dict[str, str]:
    delivered = totals.get("succeeded", 0)
    return {
        f"{TAG_PREFIX}outcome": run_outcome(claimed, delivered),
        f"{TAG_PREFIX}claimed": str(claimed),
        f"{TAG_PREFIX}delivered": str(delivered),
    }


def rows_of_run(run_id: str) -> str:
    """Markdown telling an operator how to get from this run to its rows."""
    return "\n".join(
        [
            "List this run's rows:",
            "",
            "```sql",
            "SELECT o.message_id, o.delivery_id, o.destination_id, o.published_at, d.state",
            "FROM dispatch_outbox o JOIN webhook_delivery d USING (delivery_id)",
            f"WHERE o.run_id = '{run_id}' ORDER BY o.destination_id, o.message_id;",
            "",
            "SELECT delivery_id, attempt_no, outcome, http_status, started_at, finished_at",
            f"FROM delivery_attempt WHERE run_id = '{run_id}' ORDER BY started_at;",
            "```",
            "",
            "One delivery's whole story (every dispatch with its run id, every attempt):",
            "`media-hooks inspect DELIVERY_ID`",
        ]
    )
