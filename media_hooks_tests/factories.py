"""Test data written straight into the tables (bulk, fast), for state-machine tests."""

from __future__ import annotations

import json

import psycopg


def add_destination(
    conn: psycopg.Connection, destination_id: str, url: str = "http://127.0.0.1:9/", **limits
) -> None:
    columns = ["destination_id", "url", *limits]
    values = [destination_id, url, *limits.values()]
    placeholders = ", ".join(["%s"] * len(values))
    conn.execute(
        f"INSERT INTO webhook_destination ({', '.join(columns)}) VALUES ({placeholders})",  # noqa: S608
        values,
    )


def add_deliveries(
    conn: psycopg.Connection,
    destination_id: str,
    count: int,
    *,
    prefix: str = "d",
    event_type: str = "transcode.completed",
    due_in_seconds: float = -1.0,
) -> list[str]:
    """``count`` pending deliveries, due ``due_in_seconds`` from now (negative: already due)."""
    conn.execute(
        """
        INSERT INTO webhook_delivery
            (delivery_id, destination_id, asset_id, event_type, payload, body, next_attempt_at)
        SELECT %(prefix)s::text || '-' || g, %(destination_id)s::text, 'asset-' || g, %(event_type)s::text,
               jsonb_build_object('n', g),
               convert_to(json_build_object('type', %(event_type)s::text, 'asset_id', 'asset-' || g,
                                            'data', json_build_object('n', g))::text, 'UTF8'),
               now() + make_interval(secs => %(due)s)
        FROM generate_series(1, %(count)s) AS g
        """,
        {
            "prefix": f"{prefix}-{destination_id}",
            "destination_id": destination_id,
            "event_type": event_type,
            "count": count,
            "due": due_in_seconds,
        },
    )
    return [f"{prefix}-{destination_id}-{i}" for i in range(1, count + 1)]


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
