"""Test data written straight into the tables (bulk, fast): the state the engine reads."""

from __future__ import annotations

import json
import time
from collections import Counter

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row

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
    previous_release: bool = False,
) -> list[str]:
    """``count`` deliveries ``<prefix>-<destination>-<n>`` in ``state``, each with its identity
    row as emit writes it (a leased one holds a live lease), created ``age_seconds`` ago;
    pending ones became due ``due_seconds_ago`` (negative: due in the future). The prefix defaults to ``d`` for pending rows and to the
    state's name for others. Each has asset ``asset-<n>`` unless ``asset_id`` is given.
    ``previous_release``: written as the release before migration 0034 wrote them, in
    its table (webhook_delivery_v1 since 0034, whose sweeps move them; webhook_delivery before)."""
    prefix = f"{prefix or ('d' if state == 'pending' else state)}-{destination_id}"
    lean = _lean(conn) and not previous_release
    table = "webhook_delivery_all" if lean else previous_table(conn, "webhook_delivery")
    conn.execute(
        sql.SQL(
            """
        WITH inserted AS (
        INSERT INTO {table}
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
        RETURNING delivery_id, destination_id, created_at
        )
        -- Every delivery has its identity, as emit records it (migration 0005; complete since
        -- 0034, the delivery_id alone before).
        INSERT INTO delivery_identity (delivery_id, destination_id, created_at)
        SELECT delivery_id,
               CASE WHEN %(lean)s THEN destination_id END,
               CASE WHEN %(lean)s THEN created_at END
        FROM inserted
        """
        ).format(table=sql.Identifier(table)),
        {
            "prefix": prefix,
            "destination_id": destination_id,
            "asset_id": asset_id,
            "event_type": event_type,
            "state": state,
            "due": due_seconds_ago,
            "age": age_seconds,
            "count": count,
            "lean": lean,
        },
    )
    return [f"{prefix}-{i}" for i in range(1, count + 1)]


def previous_table(conn: psycopg.Connection, name: str) -> str:
    """The previous layout's table ``name`` (``webhook_delivery``, ``delivery_attempt``) by the
    name it has in this database: ``<name>_v1`` since 0034 renamed it, ``name`` before."""
    with conn.cursor(row_factory=tuple_row) as cur:
        (found,) = cur.execute("SELECT to_regclass(%s) IS NOT NULL", [f"{name}_v1"]).fetchone()
    return f"{name}_v1" if found else name


def _lean(conn: psycopg.Connection) -> bool:
    """Whether the database has this release's layout (migration 0034): a test that models an
    earlier release writes its tables as that release did."""
    with conn.cursor(row_factory=tuple_row) as cur:
        (lean,) = cur.execute("SELECT to_regclass('delivery_state') IS NOT NULL").fetchone()
    return lean


def add_dispatches(
    conn: psycopg.Connection,
    ids: list[str],
    *,
    run_id: str = "run-old",
    published: bool = True,
    previous_release: bool = False,
) -> None:
    """The next dispatch of each delivery in ``ids``, counted and written as a claim does (its
    message id ``delivery_id:n``), whatever the delivery's state. ``previous_release``: as the
    release before migration 0034 wrote them (``add_deliveries``)."""
    lean = _lean(conn) and not previous_release
    table = "webhook_delivery_all" if lean else previous_table(conn, "webhook_delivery")
    # This layout's dispatches are kept under their delivery's creation time (partitioned).
    outbox, column, value = (
        ("dispatch_outbox_v3", ", delivery_created_at", ", created_at")
        if lean
        else ("dispatch_outbox_v2", "", "")
    )
    conn.execute(
        sql.SQL(
            """
        WITH counted AS (
            UPDATE {table}
            SET dispatch_count = dispatch_count + 1,
                current_message_id = delivery_id || ':' || (dispatch_count + 1)
            WHERE delivery_id = ANY (%(ids)s)
            RETURNING delivery_id, destination_id, dispatch_count, current_message_id, created_at
        )
        INSERT INTO {outbox}
            (message_id, delivery_id, dispatch_no, destination_id, run_id, published_at{column})
        SELECT current_message_id, delivery_id, dispatch_count, destination_id, %(run_id)s,
               CASE WHEN %(published)s THEN now() END{value}
        FROM counted
        """
        ).format(
            table=sql.Identifier(table),
            outbox=sql.Identifier(outbox),
            column=sql.SQL(column),
            value=sql.SQL(value),
        ),
        {"ids": ids, "run_id": run_id, "published": published},
    )


def add_attempts(
    conn: psycopg.Connection,
    delivery_id: str,
    attempts: list[tuple[float, float, str]],
    *,
    error: str | None = None,
) -> None:
    """Ended attempts of ``delivery_id`` (a delivery of this release's layout, open or ended),
    each ``(started_seconds_ago, finished_seconds_ago, outcome)``, numbered on from its last, as
    this release records them: written once, under the delivery's creation time. An attempt in
    flight is no row of these but the delivery's lease (``add_deliveries(state="leased")``)."""
    cur = conn.execute(
        """
        INSERT INTO delivery_attempt_v2
            (delivery_id, attempt_no, destination_id, lease_token, delivery_created_at,
             started_at, finished_at, outcome, error)
        SELECT i.delivery_id,
               a.n + (SELECT coalesce(max(attempt_no), 0) FROM delivery_attempt_all
                      WHERE delivery_id = i.delivery_id),
               i.destination_id, gen_random_uuid(), i.created_at,
               now() - make_interval(secs => a.started), now() - make_interval(secs => a.finished),
               a.outcome, %(error)s
        -- The identity holds the delivery's destination and creation time from its emit.
        FROM delivery_identity AS i,
             unnest(%(started)s::float8[], %(finished)s::float8[], %(outcomes)s::text[])
                 WITH ORDINALITY AS a(started, finished, outcome, n)
        WHERE i.delivery_id = %(delivery_id)s
        """,
        {
            "delivery_id": delivery_id,
            "started": [started for started, _, _ in attempts],
            "finished": [finished for _, finished, _ in attempts],
            "outcomes": [outcome for _, _, outcome in attempts],
            "error": error,
        },
    )
    assert cur.rowcount == len(attempts), f"{delivery_id} has no identity of this layout"


def delivery(conn: psycopg.Connection, delivery_id: str) -> dict:
    return conn.execute(
        "SELECT * FROM webhook_delivery_all WHERE delivery_id = %s", (delivery_id,)
    ).fetchone()


def states(conn: psycopg.Connection) -> dict[str, int]:
    rows = conn.execute(
        "SELECT state, count(*) AS n FROM webhook_delivery_all GROUP BY state"
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
        "SELECT delivery_id, destination_id FROM webhook_delivery_all WHERE delivery_id = ANY (%s)",
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
