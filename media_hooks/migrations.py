"""Applies ``sql/migrations`` in order, each in its own transaction, under an advisory lock.

Each applied file is recorded with its SHA-256 in ``schema_migrations``; a file whose content
changed after it was applied is refused rather than silently diverging from the database.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import psycopg
from psycopg.rows import tuple_row

from media_hooks.errors import RuntimeFailure
from media_hooks.sqlfiles import migrations as migration_files

# One fixed key: every migrating process in this database serializes on it.
_LOCK_KEY = 0x6D656469615F686F  # "media_ho"

_CREATE_LEDGER = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    checksum    text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
)
"""


@dataclass(frozen=True)
class MigrationResult:
    applied: list[str]
    already_applied: int


def checksum(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _applied(conn: psycopg.Connection) -> dict[int, tuple[str, str]]:
    with conn.cursor(row_factory=tuple_row) as cur:
        (exists,) = cur.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
        if not exists:
            return {}
        rows = cur.execute("SELECT version, name, checksum FROM schema_migrations").fetchall()
    return {version: (name, digest) for version, name, digest in rows}


def _check_unchanged(applied: dict[int, tuple[str, str]]) -> None:
    files = {version: (name, checksum(text)) for version, name, text in migration_files()}
    for version, (name, digest) in sorted(applied.items()):
        if version not in files:
            raise RuntimeFailure(
                f"the database has migration {version:04d} ({name}) that this code does not know: "
                "it was migrated by a newer media_hooks"
            )
        file_name, file_digest = files[version]
        if file_digest != digest:
            raise RuntimeFailure(
                f"migration {file_name} changed after it was applied (checksum differs); "
                "never edit an applied migration: add a new one"
            )


def migrate(conn: psycopg.Connection) -> MigrationResult:
    """Apply every pending migration. ``conn`` must be in autocommit mode."""
    conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
    try:
        conn.execute(_CREATE_LEDGER)
        applied = _applied(conn)
        _check_unchanged(applied)
        done = []
        for version, name, text in migration_files():
            if version in applied:
                continue
            with conn.transaction():
                conn.execute(text.encode("utf-8"))
                conn.execute(
                    "INSERT INTO schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                    (version, name, checksum(text)),
                )
            done.append(name)
        return MigrationResult(applied=done, already_applied=len(applied))
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))


def require_current(conn: psycopg.Connection) -> None:
    """Refuse to run on a missing, older or diverged schema, naming the fix."""
    applied = _applied(conn)
    _check_unchanged(applied)
    missing = [name for version, name, _ in migration_files() if version not in applied]
    if missing:
        what = (
            "no media_hooks schema" if not applied else f"pending migrations ({', '.join(missing)})"
        )
        raise RuntimeFailure(f"the database has {what}: run `media-hooks db migrate`")
