"""Operator requeue: a cohort of dead (or stuck) deliveries made due now, same identity,
fresh retry budget, with an audit row saying who, why and which rows.

A delivery in flight (leased, its lease running) is never requeued: it is counted in
``in_flight`` and left alone, since making it sendable while its request may be on the wire
would let another run send it again with no recorded reason (invariant 9). An expired lease in
the cohort is ended first, its attempt closed as ambiguous, as the sweep would end it. The dry
run runs the same selection and reports the same figures.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import psycopg

from media_hooks.core.errors import UserError
from media_hooks.outbox.cohort import Cohort
from media_hooks.store import db
from media_hooks.store.sqlfiles import query

REQUEUABLE_STATES = ("pending", "enqueued", "leased", "dead")


@dataclass(frozen=True)
class RequeueResult:
    matched: int
    moved: int
    by_state: dict[str, int]
    requeue_id: int | None
    sample: list[str]
    # Deliveries of the cohort in flight, left alone.
    in_flight: int = 0


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
    params = {"states": list(states), "requested_by": requested_by, **cohort.params()}
    if dry_run:
        return _preview(conn, params)
    document = json.dumps({"states": list(states), **cohort.describe()})
    return db.retrying(
        "requeue",
        lambda: _requeue_once(conn, {**params, "reason": reason, "cohort": document}),
        changes=True,
    )


def _preview(conn: psycopg.Connection, params: dict) -> RequeueResult:
    rows = conn.execute(query("requeue_preview"), params).fetchall()
    by_state = {row["state"]: row["matched"] for row in rows}
    sample = [d for row in rows for d in row["sample"]][:10]
    in_flight = conn.execute(query("requeue_in_flight"), params).fetchone()["in_flight"]
    total = sum(by_state.values())
    return RequeueResult(total, 0, by_state, None, sample, in_flight)


def _requeue_once(conn: psycopg.Connection, params: dict) -> RequeueResult:
    """One attempt, in one transaction: end the cohort's expired leases, requeue, count what
    stays in flight."""
    with conn.transaction():
        ended = []
        if "leased" in params["states"]:
            ended = [
                r["delivery_id"] for r in conn.execute(query("requeue_end_expired_leases"), params)
            ]
        rows = conn.execute(query("requeue_cohort"), {**params, "ended_ids": ended}).fetchall()
        in_flight = conn.execute(query("requeue_in_flight"), params).fetchone()["in_flight"]
    by_state = {row["previous_state"]: row["moved"] for row in rows}
    moved = sum(by_state.values())
    requeue_id = rows[0]["requeue_id"] if rows else None
    sample = [d for row in rows for d in row["sample"]][:10]
    return RequeueResult(moved, moved, by_state, requeue_id, sample, in_flight)
