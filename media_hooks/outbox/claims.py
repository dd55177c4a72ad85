"""The reconciler: claims due deliveries into the outbox for a run, page by page.

A page is one transaction and one statement. ``claim_due`` claims a cohort's due pages
(``claim_due_page``) until nothing is due or the row cap is reached; a delivery run instead
claims each destination's pages as its worker needs them (``claim_destination_page``, see
media_hooks.engine.delivery), so memory stays bounded by the page size whatever the backlog and no
destination waits behind another's. Reconcilers running at once divide the rows (SKIP LOCKED).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import psycopg

from media_hooks.core import crashpoints
from media_hooks.outbox.cohort import Cohort
from media_hooks.outbox.leases import Message
from media_hooks.store import db
from media_hooks.store.sqlfiles import query


@dataclass(frozen=True)
class ClaimFigures:
    claimed: int
    pages: int
    by_destination: dict[str, int]


@dataclass(frozen=True)
class Batch:
    """A range of one run's outbox messages for one destination: a unit of delivery work."""

    run_id: str
    destination_id: str
    first_message_id: str
    last_message_id: str
    size: int


def claim_page(conn: psycopg.Connection, run_id: str, cohort: Cohort, page_size: int) -> Counter:
    """Claim one page in one transaction; returns the rows claimed per destination. A page
    refused by a lock or a timeout is rolled back and claimed again (media_hooks.store.db)."""

    def claim() -> list[dict]:
        with conn.transaction():
            if not cohort.destination_ids:
                # Nothing narrows the due rows by an index of its own, so reading the due index
                # in order is the best plan: a page reads a page of rows, where the planner
                # (with or without statistics) read every due row and sorted them.
                conn.execute(query("plan_by_index"))
            rows = conn.execute(
                query("claim_due_page"),
                {"run_id": run_id, "page_size": page_size, **cohort.params()},
            ).fetchall()
            crashpoints.hit(crashpoints.BEFORE_CLAIM_COMMIT)
        return rows

    rows = db.retrying("claim a page", claim)
    crashpoints.hit(crashpoints.AFTER_OUTBOX_COMMIT)
    return Counter({row["destination_id"]: row["claimed"] for row in rows})


def claim_due(
    conn: psycopg.Connection,
    run_id: str,
    cohort: Cohort,
    *,
    page_size: int = 250,
    max_rows: int | None = None,
) -> ClaimFigures:
    """Claim due pages until none is left or ``max_rows`` rows are claimed."""
    if page_size < 1:
        raise ValueError("page_size must be at least 1")
    total: Counter = Counter()
    pages = 0
    while max_rows is None or total.total() < max_rows:
        size = page_size if max_rows is None else min(page_size, max_rows - total.total())
        claimed = claim_page(conn, run_id, cohort, size)
        pages += 1
        total.update(claimed)
        if claimed.total() < size:
            break
    return ClaimFigures(claimed=total.total(), pages=pages, by_destination=dict(total))


def due_destinations(conn: psycopg.Connection, cohort: Cohort) -> list[str]:
    """The cohort's destinations with due deliveries that may be sent to now."""

    def find() -> list[dict]:
        with conn.transaction():
            conn.execute(query("plan_by_index"))
            return conn.execute(query("due_destinations"), cohort.params()).fetchall()

    return [row["destination_id"] for row in db.retrying("find due destinations", find)]


def claim_destination_page(
    conn: psycopg.Connection, run_id: str, destination_id: str, cohort: Cohort, page_size: int
) -> list[Message]:
    """Claim one page of one destination's due deliveries for ``run_id`` in one transaction;
    returns its outbox messages (not yet published). Retried as ``claim_page`` is."""

    def claim() -> list[dict]:
        with conn.transaction():
            conn.execute(query("plan_by_index"))
            rows = conn.execute(
                query("claim_destination_page"),
                {
                    "run_id": run_id,
                    "destination_id": destination_id,
                    "page_size": page_size,
                    **cohort.params(),
                },
            ).fetchall()
            crashpoints.hit(crashpoints.BEFORE_CLAIM_COMMIT)
        return rows

    rows = db.retrying("claim a page", claim)
    crashpoints.hit(crashpoints.AFTER_OUTBOX_COMMIT)
    return [Message(row["message_id"], row["delivery_id"]) for row in rows]


def plan_batches(conn: psycopg.Connection, run_id: str, *, batch_size: int = 1000) -> list[Batch]:
    """The run's outbox rows per destination, in ranges of at most ``batch_size`` messages."""
    rows = db.retrying(
        "plan batches",
        lambda: conn.execute(
            query("plan_batches"), {"run_id": run_id, "batch_size": batch_size}
        ).fetchall(),
    )
    return [Batch(run_id=run_id, **row) for row in rows]


def run_dispatched(conn: psycopg.Connection, run_id: str) -> bool:
    """Whether ``run_id`` has outbox rows in this database."""
    row = conn.execute(query("run_dispatched"), {"run_id": run_id}).fetchone()
    return bool(row["dispatched"])
