"""Operator requeue: a cohort of dead (or stuck) deliveries made due now, same identity,
fresh retry budget, with an audit row saying who, why and which rows."""

from __future__ import annotations

import json
from dataclasses import dataclass

import psycopg

from media_hooks.cohort import Cohort
from media_hooks.errors import UserError
from media_hooks.sqlfiles import query

REQUEUABLE_STATES = ("pending", "enqueued", "leased", "dead")


@dataclass(frozen=True)
class RequeueResult:
    matched: int
    moved: int
    by_state: dict[str, int]
    requeue_id: int | None
    sample: list[str]


def _check(states: tuple[str, ...], reason: str) -> None:
    unknown = [state for state in states if state not in REQUEUABLE_STATES]
    if unknown:
        raise UserError(
            f"cannot requeue state {unknown[0]!r}: choose from {', '.join(REQUEUABLE_STATES)} "
            "(a succeeded delivery is final)"
        )
    if not reason.strip():
        raise UserError("a requeue needs a --reason: it is kept in the audit trail")


def requeue(
    conn: psycopg.Connection,
    cohort: Cohort,
    *,
    states: tuple[str, ...] = ("dead",),
    reason: str,
    requested_by: str,
    dry_run: bool = False,
) -> RequeueResult:
    _check(states, reason)
    params = {"states": list(states), **cohort.params()}
    if dry_run:
        rows = conn.execute(query("requeue_preview"), params).fetchall()
        by_state = {row["state"]: row["matched"] for row in rows}
        sample = [d for row in rows for d in row["sample"]][:10]
        total = sum(by_state.values())
        return RequeueResult(total, 0, by_state, None, sample)
    document = json.dumps({"states": list(states), **cohort.describe()})
    with conn.transaction():
        rows = conn.execute(
            query("requeue_cohort"),
            {**params, "reason": reason, "requested_by": requested_by, "cohort": document},
        ).fetchall()
    by_state = {row["previous_state"]: row["moved"] for row in rows}
    moved = sum(by_state.values())
    requeue_id = rows[0]["requeue_id"] if rows else None
    sample = [d for row in rows for d in row["sample"]][:10]
    return RequeueResult(moved, moved, by_state, requeue_id, sample)
