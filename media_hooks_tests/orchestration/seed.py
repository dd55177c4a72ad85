"""Rows for tests, written straight into the schema (the figures and sweeps read them as-is)."""

from __future__ import annotations

import psycopg


def add_destination(conn: psycopg.Connection, destination_id: str, url: str, **limits) -> None:
    columns = {"destination_id": destination_id, "url": url, **limits}
    names = ", ".join(columns)
    values = ", ".join(f"%({name})s" for name in columns)
    conn.execute(
        f"INSERT INTO webhook_destination ({names}) VALUES ({values}) "
        "ON CONFLICT (destination_id) DO UPDATE SET url = EXCLUDED.url",
        columns,
    )


def add_deliveries(
    conn: psycopg.Connection,
    destination_id: str,
    count: int,
    *,
    prefix: str | None = None,
    state: str = "pending",
    due_seconds_ago: float = 60,
    event_type: str = "transcode.completed",
    asset_id: str = "asset-1",
    age_seconds: float = 0,
) -> list[str]:
    """``count`` deliveries in ``state``; pending ones became due ``due_seconds_ago``."""
    prefix = prefix or f"{destination_id}-{state}"
    rows = conn.execute(
        """
        INSERT INTO webhook_delivery
            (delivery_id, destination_id, asset_id, event_type, payload, body, state,
             next_attempt_at, lease_until, lease_token, created_at, updated_at)
        SELECT %(prefix)s || '-' || i, %(destination)s, %(asset)s, %(event_type)s,
               jsonb_build_object('n', i),
               convert_to(jsonb_build_object('n', i)::text, 'UTF8'),
               %(state)s,
               now() - make_interval(secs => %(due)s),
               CASE WHEN %(state)s = 'leased' THEN now() + interval '1 minute' END,
               CASE WHEN %(state)s = 'leased' THEN gen_random_uuid() END,
               now() - make_interval(secs => %(age)s),
               now() - make_interval(secs => %(age)s)
        FROM generate_series(1, %(count)s) AS i
        RETURNING delivery_id
        """,
        {
            "prefix": prefix,
            "destination": destination_id,
            "asset": asset_id,
            "event_type": event_type,
            "state": state,
            "due": due_seconds_ago,
            "age": age_seconds,
            "count": count,
        },
    ).fetchall()
    return [row["delivery_id"] for row in rows]
