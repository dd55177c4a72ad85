"""Reading EXPLAIN (ANALYZE, FORMAT JSON) plans in tests: what a statement really read."""

from __future__ import annotations


def rows_read(plan: dict, relation: str) -> int:
    """Rows a plan's scans of ``relation`` fetched, the ones its filters removed included."""
    read = 0
    if plan.get("Relation Name") == relation:
        loops = plan.get("Actual Loops", 1)
        read += (plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)) * loops
    return read + sum(rows_read(child, relation) for child in plan.get("Plans", []))
