"""Test data written straight into the tables (bulk, fast): the state the engine reads."""

from __future__ import annotations

import json
import time
from collections import Counter

import psycopg
from psycopg import sql

from media_hooks.outbox.claims import ClaimFigures, claim_destination_page, due_destinations
from media_hooks.outbox.cohort import Cohort
from media_hooks.outbox.leases import (
    Classified,
    Lease,
    Message,
    lease_with_permits,
)

# Limits that never hold back a test's leases: for tests of the row protocol, leasing through the
# worker's step (``lease_all``) as often as they like; what the limits do is tested on its own.
ROOMY = {"rate_per_second": 1000.0, "burst": 1000, "max_in_flight": 1000}


def add_destination(
    conn: psycopg.Connection, destination_id: str, url: str = "http://127.0.0.1:9/", **columns
) -> None:
    """A destination with the schema's defaults but for the ``columns`` given."""
    values = {"destination_id": destination_id, "url": url, **columns}
    conn.execute(
        sql.SQL("INSERT INTO webhook_destination ({}) VALUES ({})").format(
            sql.SQL(", ").join(map(sql.Identifier, values)),
            sql.SQL(", ").join(map(sql.Placeholder, values)),
        ),
        values,
    )


def add_deliveries(
    conn: psycopg.Connection,
    destination_id: str,
    count: int,
    *,
    prefix: str | None = None,
    state: str = "pending",
    event_type: str = "transcode.completed",
    asset_id: str | None = None,
    due_seconds_ago: float = 1.0,
    age_seconds: float = 0.0,
) -> list[str]:
    """``count`` deliveries ``<prefix>-<destination>-<n>`` in ``state``, each with its identity
    row as emit writes it (a leased one holds a live lease), created ``age_seconds`` ago;
    pending ones became due ``due_seconds_ago`` (negative: due in the future). The prefix defaults to ``d`` for pending rows and to the
    state's name for others. Each has asset ``asset-<n>`` unless ``asset_id`` is given."""
    prefix = f"{prefix or ('d' if state == 'pending' else state)}-{destination_id}"
    conn.execute(
        """
        WITH inserted AS (
        INSERT INTO webhook_delivery
            (delivery_id, destination_id, asset_id, event_type, payload, body, state,
             next_attempt_at, lease_until, lease_token, created_at, updated_at)
        SELECT %(prefix)s::text || '-' || g, %(destination_id)s::text,
               coalesce(%(asset_id)s::text, 'asset-' || g), %(event_type)s::text,
               jsonb_build_object('n', g),
               convert_to(json_build_object('type', %(event_type)s::text,
                                            'asset_id', coalesce(%(asset_id)s::text, 'asset-' || g),
                                            'data', json_build_object('n', g))::text, 'UTF8'),
               %(state)s,
               now() - make_interval(secs => %(due)s),
               CASE WHEN %(state)s = 'leased' THEN now() + interval '1 minute' END,
               CASE WHEN %(state)s = 'leased' THEN gen_random_uuid() END,
               now() - make_interval(secs => %(age)s),
               now() - make_interval(secs => %(age)s)
        FROM generate_series(1, %(count)s) AS g
        RETURNING delivery_id
        )
        -- Every delivery has its identity, as emit records it (migration 0005).
        INSERT INTO delivery_identity (delivery_id) SELECT delivery_id FROM inserted
        """,
        {
            "prefix": prefix,
            "destination_id": destination_id,
            "asset_id": asset_id,
            "event_type": event_type,
            "state": state,
            "due": due_seconds_ago,
            "age": age_seconds,
            "count": count,
        },
    )
    return [f"{prefix}-{i}" for i in range(1, count + 1)]


def add_dispatches(
    conn: psycopg.Connection, ids: list[str], *, run_id: str = "run-old", published: bool = True
) -> None:
    """The next dispatch of each delivery in ``ids``, counted and written as a claim does (its
    message id ``delivery_id:n``), whatever the delivery's state."""
    conn.execute(
        """
        WITH counted AS (
            UPDATE webhook_delivery
            SET dispatch_count = dispatch_count + 1,
                current_message_id = delivery_id || ':' || (dispatch_count + 1)
            WHERE delivery_id = ANY (%(ids)s)
            RETURNING delivery_id, destination_id, dispatch_count, current_message_id
        )
        INSERT INTO dispatch_outbox_v2
            (message_id, delivery_id, dispatch_no, destination_id, run_id, published_at)
        SELECT current_message_id, delivery_id, dispatch_count, destination_id, %(run_id)s,
               CASE WHEN %(published)s THEN now() END
        FROM counted
        """,
        {"ids": ids, "run_id": run_id, "published": published},
    )


def delivery(conn: psycopg.Connection, delivery_id: str) -> dict:
    return conn.execute(
        "SELECT * FROM webhook_delivery WHERE delivery_id = %s", (delivery_id,)
    ).fetchone()


def states(conn: psycopg.Connection) -> dict[str, int]:
    rows = conn.execute(
        "SELECT state, count(*) AS n FROM webhook_delivery GROUP BY state"
    ).fetchall()
    return {row["state"]: row["n"] for row in rows}


def body_json(row: dict) -> dict:
    return json.loads(bytes(row["body"]))


def claim_all(
    conn: psycopg.Connection,
    run_id: str,
    cohort: Cohort | None = None,
    *,
    page_size: int = 250,
    max_rows: int | None = None,
) -> ClaimFigures:
    """Claims a cohort's due deliveries for ``run_id`` the way a delivery run does: each due
    destination's pages (``claim_destination_page``) until one comes back short, at most
    ``max_rows`` rows in all (``claim_messages`` returns the messages)."""
    cohort = cohort or Cohort()
    claimed: Counter = Counter()
    pages = 0
    for destination_id in due_destinations(conn, cohort):
        while max_rows is None or claimed.total() < max_rows:
            size = page_size if max_rows is None else min(page_size, max_rows - claimed.total())
            page = claim_destination_page(conn, run_id, destination_id, cohort, size)
            pages += 1
            claimed[destination_id] += len(page)
            if len(page) < size:
                break
    return ClaimFigures(claimed=claimed.total(), pages=pages, by_destination=dict(+claimed))


def claim_messages(
    conn: psycopg.Connection, run_id: str, cohort: Cohort | None = None
) -> list[Message]:
    """Claims like ``claim_all``; the messages, as a worker holds them."""
    cohort = cohort or Cohort()
    messages: list[Message] = []
    for destination_id in due_destinations(conn, cohort):
        while page := claim_destination_page(conn, run_id, destination_id, cohort, 250):
            messages += page
    return messages


def lease_all(
    conn: psycopg.Connection, run_id: str, messages: list[Message], lease_seconds: float = 90.0
) -> list[Lease]:
    """Leases ``messages`` the way a worker does, through its step (``lease_with_permits``,
    holding a permit as ``run_id`` for each lease), one step per destination, in order; the
    leases of the offers still theirs to send. Each destination must admit every offer in that
    one step (enabled, not paused, slots and starts enough: ``ROOMY``)."""
    if not messages:
        return []
    rows = conn.execute(
        "SELECT delivery_id, destination_id FROM webhook_delivery WHERE delivery_id = ANY (%s)",
        ([m.delivery_id for m in messages],),
    ).fetchall()
    destination_of = {r["delivery_id"]: r["destination_id"] for r in rows}
    offers: dict[str, list[Message]] = {}
    for message in messages:
        offers.setdefault(destination_of[message.delivery_id], []).append(message)
    taken: list[Lease] = []
    for destination_id, offered in offers.items():
        step = lease_with_permits(
            conn,
            run_id,
            destination_id,
            offered,
            holder=run_id,
            lease_seconds=lease_seconds,
            release_slots=[],
        )
        assert step.examined == len(offered), (
            f"{destination_id} admitted {step.examined} of {len(offered)} offers "
            f"({step.grant.reason}): give the test's destination room (ROOMY)"
        )
        taken += step.leases
    return taken


def answer(
    lease: Lease,
    outcome: str,
    status: int | None = None,
    *,
    retry_after: float | None = None,
    attempted: bool = True,
    configuration_fault: bool = False,
    error: str | None = None,
) -> Classified:
    """The runtime's word on one attempt, as a worker classifies it; the database decides
    what follows (``record_classified``)."""
    return Classified(
        lease,
        outcome,
        status,
        retry_after,
        error if error is not None else (None if outcome == "success" else f"HTTP {status}"),
        None,
        time.monotonic(),
        attempted=attempted,
        configuration_fault=configuration_fault,
    )
