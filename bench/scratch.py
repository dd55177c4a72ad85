"""Shared by the benchmarks: a scratch database, migrated, on the configured server.

The server is ``MEDIA_HOOKS_DATABASE_URL`` when set, otherwise the embedded default under
``MEDIA_HOOKS_HOME``. The database is created fresh and dropped afterwards.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from media_hooks import db, embedded, migrations
from media_hooks.config import Settings
from media_hooks.delivery_run import deliver_due

RESULTS = Path(__file__).resolve().parent / "results"


def server_url(settings: Settings | None = None) -> str:
    settings = settings or Settings.from_env()
    if settings.database_url:
        return settings.database_url
    return embedded.embedded_url(settings.home, "postgres")


@contextmanager
def scratch_database(prefix: str = "mh_bench") -> Iterator[str]:
    """A fresh, migrated database; yields its URL and drops it afterwards."""
    server = server_url()
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = db.with_database(server, name)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            migrations.migrate(conn)
        yield url
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


SEED_DESTINATIONS = """
INSERT INTO webhook_destination (destination_id, url, rate_per_second, burst, max_in_flight)
SELECT 'dest-' || n, %(url)s || 'dest-' || n, 1e6, 10000, %(in_flight)s
FROM generate_series(1, %(destinations)s) AS n
"""
SEED_DELIVERIES = """
INSERT INTO webhook_delivery (delivery_id, destination_id, asset_id, event_type, payload, body)
SELECT %(prefix)s || g, 'dest-' || (1 + g %% %(destinations)s), 'asset-' || g,
       'transcode.completed', jsonb_build_object('n', g, 'rendition', '1080p'),
       convert_to(json_build_object('type', 'transcode.completed', 'asset_id', 'asset-' || g,
                  'data', json_build_object('n', g, 'rendition', '1080p'))::text, 'UTF8')
FROM generate_series(1, %(rows)s) AS g
"""


def add_unlimited_destinations(url: str, receiver_url: str, count: int, in_flight: int) -> None:
    """Destinations dest-1..dest-N on ``receiver_url`` whose start rate never binds."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            SEED_DESTINATIONS, {"url": receiver_url, "in_flight": in_flight, "destinations": count}
        )


def add_due_deliveries(url: str, prefix: str, rows: int, destinations: int) -> None:
    """``rows`` due deliveries spread evenly over dest-1..dest-N, then fresh statistics."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            SEED_DELIVERIES, {"prefix": prefix, "rows": rows, "destinations": destinations}
        )
        conn.execute("VACUUM ANALYZE")


def machine() -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }


def write_results(name: str, figures: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **figures}, indent=2, default=str) + "\n")
    return path


def engine_rate(
    url: str, settings: Settings, rows: int, destinations: int, batch_size: int
) -> float:
    """Deliveries/s of one whole engine run (``deliver_due``) delivering ``rows`` due deliveries."""
    with db.open_pool(url, max_size=destinations + 4) as pool:
        start = time.perf_counter()
        report = deliver_due(pool, "bench-engine", settings, page_size=1000, batch_size=batch_size)
        seconds = time.perf_counter() - start
    assert report.totals.succeeded == rows, report.totals
    return rows / seconds
