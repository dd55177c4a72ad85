"""Shared by the benchmarks: a scratch database, migrated, on the configured server.

The server is ``MEDIA_HOOKS_DATABASE_URL`` when set, otherwise the embedded default under
``MEDIA_HOOKS_HOME``. The database is created fresh and dropped afterwards.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from media_hooks import db, embedded, migrations
from media_hooks.config import Settings

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
