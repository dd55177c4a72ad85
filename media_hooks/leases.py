"""The worker's side of the state machine: publish, lease, record, defer — all set-based.

Every function takes a connection in autocommit mode and runs one statement: no transaction
is ever held across an HTTP request (invariant 7).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

import psycopg

from media_hooks.sqlfiles import query


@dataclass(frozen=True)
class Message:
    message_id: str
    delivery_id: str


@dataclass(frozen=True)
class Lease:
    delivery_id: str
    message_id: str
    lease_token: uuid.UUID
    attempt_no: int
    # Attempts of the current retry budget, this one included: the backoff exponent.
    budget_used: int
    body: bytes


@dataclass(frozen=True)
class Outcome:
    """What one leased attempt came to, and when the delivery should be tried next."""

    lease: Lease
    outcome: str
    http_status: int | None
    error: str | None
    response_excerpt: str | None
    delay_seconds: float
    delay_reason: str | None
    started_at: datetime
    finished_at: datetime


def publish_page(
    conn: psycopg.Connection,
    *,
    run_id: str,
    destination_id: str,
    after_message_id: str,
    last_message_id: str,
    page_size: int,
) -> list[Message]:
    rows = conn.execute(
        query("publish_page"),
        {
            "run_id": run_id,
            "destination_id": destination_id,
            "after_message_id": after_message_id,
            "last_message_id": last_message_id,
            "page_size": page_size,
        },
    ).fetchall()
    return sorted(
        (Message(r["message_id"], r["delivery_id"]) for r in rows), key=lambda m: m.message_id
    )


def lease(
    conn: psycopg.Connection, run_id: str, messages: list[Message], lease_seconds: float
) -> list[Lease]:
    """Lease the deliveries of ``messages`` that are still theirs to send; skips the rest."""
    if not messages:
        return []
    rows = conn.execute(
        query("lease_deliveries"),
        {
            "run_id": run_id,
            "lease_seconds": lease_seconds,
            "delivery_ids": [m.delivery_id for m in messages],
            "message_ids": [m.message_id for m in messages],
        },
    ).fetchall()
    return [
        Lease(
            r["delivery_id"],
            r["message_id"],
            r["lease_token"],
            r["attempt_no"],
            r["budget_used"],
            bytes(r["body"]),
        )
        for r in rows
    ]


def record(conn: psycopg.Connection, outcomes: list[Outcome]) -> dict[str, str]:
    """Record outcomes; returns {delivery_id: new state} for the ones whose lease still held."""
    if not outcomes:
        return {}
    rows = conn.execute(
        query("record_outcomes"),
        {
            "delivery_ids": [o.lease.delivery_id for o in outcomes],
            "lease_tokens": [o.lease.lease_token for o in outcomes],
            "outcomes": [o.outcome for o in outcomes],
            "http_statuses": [o.http_status for o in outcomes],
            "errors": [o.error for o in outcomes],
            "excerpts": [o.response_excerpt for o in outcomes],
            "delays": [o.delay_seconds for o in outcomes],
            "delay_reasons": [o.delay_reason for o in outcomes],
            "started_at": [o.started_at for o in outcomes],
            "finished_at": [o.finished_at for o in outcomes],
        },
    ).fetchall()
    return {row["delivery_id"]: row["state"] for row in rows}


def defer(conn: psycopg.Connection, messages: list[Message], due_at: datetime, reason: str) -> int:
    """Hand dispatched, unsent deliveries back to pending (no retry budget used)."""
    if not messages:
        return 0
    rows = conn.execute(
        query("defer_deliveries"),
        {
            "delivery_ids": [m.delivery_id for m in messages],
            "message_ids": [m.message_id for m in messages],
            "due_at": due_at,
            "reason": reason,
        },
    ).fetchall()
    return len(rows)
