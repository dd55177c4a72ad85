"""The reconciler: claims due deliveries into the outbox for a run, page by page.

A delivery run finds the destinations with due work (``due_destinations``) and each one's
worker claims its pages as it needs them (``claim_destination_page``, see
``media_hooks.engine.pages``): a page is one transaction and one statement, memory stays
bounded by the page size whatever the backlog, and no destination waits behind another's.
Runs claiming at once divide the rows (SKIP LOCKED).
"""

from __future__ import annotations

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
    returns its outbox messages (not yet published). A page refused by a lock or a timeout
    is rolled back and claimed again (``media_hooks.store.db.retrying``)."""

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


def run_dispatched(conn: psycopg.Connection, run_id: str) -> bool:
    """Whether ``run_id`` has outbox rows in this database."""
    row = conn.execute(query("run_dispatched"), {"run_id": run_id}).fetchone()
    return bool(row["dispatched"])
