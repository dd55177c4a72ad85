"""A deep history for the sustained benchmark: delivered deliveries already on disk.

The sustained runs start on empty tables and purge on a window of seconds, so the history the
hot path works beside stays at a few hundred thousand rows. A platform that keeps 30 days of
history at a million deliveries a day works beside 30 million. ``preload`` writes ``count``
deliveries as a delivery run leaves them when they succeed on the first attempt (the delivery
row succeeded, its outbox row published, its attempt a success, its identity row), spread
over the destinations the run delivers to and over the ``span_seconds`` before now, then
vacuums and analyzes the four tables and writes it all to disk (a checkpoint, then the
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

# One statement per table for rows lo..hi; ``at`` is when the delivery ended (a second after
# it was created), spread evenly over the span, oldest first. Ids and shapes as the producer
# and the engine make them; the outbox, attempt and identity rows copy their delivery's.
NUMBERED = """
WITH n AS (
    SELECT g,
           now() - make_interval(secs => %(span)s::float8 * (1 - g::float8 / %(count)s::float8))
             AS at
    FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS g
)
"""
STATEMENTS = (
    NUMBERED
    + """
INSERT INTO webhook_delivery (
    delivery_id, destination_id, asset_id, event_type, payload, body, state, attempt_count,
    budget_used, budget_started_at, dispatch_count, next_attempt_at, current_message_id,
    last_outcome, created_at, updated_at, emit_seq)
SELECT 'history-' || g, (%(destinations)s::text[])[1 + g %% %(n_destinations)s],
       'asset-' || g %% 10007, 'transcode.completed', p.payload,
       convert_to(p.payload::text, 'UTF8'), 'succeeded', 1, 1, at - interval '1 second', 1,
       at - interval '1 second',
       'history-' || g || ':1', 'success', at - interval '1 second', at,
       nextval('media_hooks_emit_seq')
FROM n CROSS JOIN LATERAL (
    SELECT jsonb_build_object('n', g, 'rendition', '1080p', 'pad', %(pad)s::text) AS payload) AS p
""",
    NUMBERED
    + """
INSERT INTO dispatch_outbox_v2 (
    message_id, delivery_id, dispatch_no, destination_id, run_id, created_at, published_at)
SELECT d.current_message_id, d.delivery_id, 1, d.destination_id, 'history', d.created_at,
       d.created_at
FROM n JOIN webhook_delivery AS d ON d.delivery_id = 'history-' || g
""",
    NUMBERED
    + """
INSERT INTO delivery_attempt (
    delivery_id, attempt_no, destination_id, message_id, run_id, lease_token, started_at,
    finished_at, outcome, http_status)
SELECT d.delivery_id, 1, d.destination_id, d.current_message_id, 'history', gen_random_uuid(),
       d.created_at, d.updated_at, 'success', 200
FROM n JOIN webhook_delivery AS d ON d.delivery_id = 'history-' || g
""",
    NUMBERED
    + """
INSERT INTO delivery_identity (delivery_id, destination_id, created_at)
SELECT d.delivery_id, d.destination_id, d.created_at
FROM n JOIN webhook_delivery AS d ON d.delivery_id = 'history-' || g
""",
)
TABLES = ("webhook_delivery", "dispatch_outbox_v2", "delivery_attempt", "delivery_identity")


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
            for statement in STATEMENTS:
                conn.execute(statement, chunk)
            conn.commit()
    with psycopg.connect(url, autocommit=True) as conn:
        for table in TABLES:
            conn.execute(f"VACUUM (ANALYZE) {table}")
        conn.execute("CHECKPOINT")
    os.sync()
    return round(time.monotonic() - started, 1)
