"""A deep history for the sustained benchmark: delivered deliveries already on disk.

The sustained runs start on empty tables and purge on a window of seconds, so the history the
hot path works beside stays at a few hundred thousand rows. A platform that keeps 30 days of
history at a million deliveries a day works beside 30 million. ``preload`` writes ``count``
deliveries as a delivery run leaves them when they succeed on the first attempt (the delivery
in history, succeeded, its body, its dispatch published, its attempt a success, its identity),
spread over the destinations the run delivers to and over the ``span_seconds`` before now, then
vacuums and analyzes the five tables and writes it all to disk (a checkpoint, then the
operating system's cache): old history is vacuumed history, long on disk, and the run's first
windows must not wait behind the write-back of gigabytes just written. Set-based, in chunks of
``CHUNK`` rows a transaction.
"""

from __future__ import annotations

import os
import time

import psycopg

CHUNK = 200_000
PAD = "x" * 250

# Rows lo..hi, one statement; ``at`` is when the delivery ended (a second after it was created),
# spread evenly over the span, oldest first. Ids and shapes as the producer and the engine make
# them; the dispatch, attempt and identity rows copy their delivery's.
STATEMENT = """
WITH n AS MATERIALIZED (
    SELECT 'history-' || g AS delivery_id,
           (%(destinations)s::text[])[1 + g %% %(n_destinations)s] AS destination_id,
           g, at - interval '1 second' AS created_at, at,
           jsonb_build_object('n', g, 'rendition', '1080p', 'pad', %(pad)s::text) AS payload
    FROM (
        SELECT g,
               now() - make_interval(
                   secs => %(span)s::float8 * (1 - g::float8 / %(count)s::float8)) AS at
        FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS g
    ) AS spread
),
identities AS (
    INSERT INTO delivery_identity (delivery_id, destination_id, created_at)
    SELECT delivery_id, destination_id, created_at FROM n
),
bodies AS (
    INSERT INTO delivery_body (delivery_id, created_at, payload, body)
    SELECT delivery_id, created_at, payload, convert_to(payload::text, 'UTF8') FROM n
),
dispatches AS (
    INSERT INTO dispatch_outbox_v3 (
        message_id, delivery_id, dispatch_no, destination_id, run_id, delivery_created_at,
        created_at, published_at)
    SELECT delivery_id || ':1', delivery_id, 1, destination_id, 'history', created_at,
           created_at, created_at
    FROM n
),
attempts AS (
    INSERT INTO delivery_attempt_v2 (
        delivery_id, attempt_no, destination_id, message_id, run_id, lease_token,
        delivery_created_at, started_at, finished_at, outcome, http_status)
    SELECT delivery_id, 1, destination_id, delivery_id || ':1', 'history', gen_random_uuid(),
           created_at, created_at, at, 'success', 200
    FROM n
)
INSERT INTO delivery_history (
    delivery_id, destination_id, asset_id, event_type, created_at, emit_seq, queued, state,
    attempt_count, budget_used, budget_started_at, dispatch_count, next_attempt_at,
    current_message_id, last_outcome, finished_at)
SELECT delivery_id, destination_id, 'asset-' || g %% 10007, 'transcode.completed', created_at,
       nextval('media_hooks_emit_seq'), false, 'succeeded', 1, 1, created_at, 1, created_at,
       delivery_id || ':1', 'success', at
FROM n
"""
TABLES = (
    "delivery_history",
    "delivery_body",
    "dispatch_outbox_v3",
    "delivery_attempt_v2",
    "delivery_identity",
)


def preload(url: str, count: int, destination_ids: list[str], span_seconds: float) -> float:
    """Write ``count`` delivered deliveries; returns the seconds it took."""
    started = time.monotonic()
    params = {
        "count": count,
        "span": span_seconds,
        "destinations": destination_ids,
        "n_destinations": len(destination_ids),
        "pad": PAD,
    }
    with psycopg.connect(url) as conn:
        for lo in range(1, count + 1, CHUNK):
            chunk = {**params, "lo": lo, "hi": min(lo + CHUNK - 1, count)}
            conn.execute(STATEMENT, chunk)
            conn.commit()
    with psycopg.connect(url, autocommit=True) as conn:
        for table in TABLES:
            conn.execute(f"VACUUM (ANALYZE) {table}")
        conn.execute("CHECKPOINT")
    os.sync()
    return round(time.monotonic() - started, 1)
