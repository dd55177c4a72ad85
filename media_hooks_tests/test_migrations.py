"""Migrations: from empty, twice, concurrently, and a changed file refused."""

from __future__ import annotations

import psycopg
import pytest

from media_hooks import migrations, sqlfiles
from media_hooks.errors import RuntimeFailure
from media_hooks_tests.conftest import run_cli, run_cli_together

EXPECTED_TABLES = {
    "webhook_destination",
    "webhook_delivery",
    "dispatch_outbox",
    "delivery_attempt",
    "schema_migrations",
}


def _tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        ).fetchall()
    return {name for (name,) in rows}


def _ledger(url: str) -> list[tuple]:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT version, checksum FROM schema_migrations ORDER BY 1").fetchall()


def test_migrate_from_empty_then_again_is_a_no_op(empty_database_url, cli_env):
    env = dict(cli_env, MEDIA_HOOKS_DATABASE_URL=empty_database_url)
    first = run_cli("db", "migrate", env=env)
    assert first.returncode == 0, first.stderr
    assert EXPECTED_TABLES <= _tables(empty_database_url)
    ledger = _ledger(empty_database_url)
    assert [v for v, _ in ledger] == [v for v, _, _ in sqlfiles.migrations()]

    second = run_cli("db", "migrate", "--json", env=env)
    assert second.returncode == 0, second.stderr
    assert '"applied": []' in second.stdout
    assert _ledger(empty_database_url) == ledger


def test_two_concurrent_migrations_leave_one_correct_schema(empty_database_url, cli_env):
    env = dict(cli_env, MEDIA_HOOKS_DATABASE_URL=empty_database_url)
    results = run_cli_together("db", "migrate", env=env)
    assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
    assert EXPECTED_TABLES <= _tables(empty_database_url)
    assert len(_ledger(empty_database_url)) == len(sqlfiles.migrations())


def test_changed_migration_is_refused(database_url, monkeypatch):
    real = sqlfiles.migrations()
    version, name, text = real[0]
    changed = [(version, name, text + "\n-- edited after it was applied\n")] + real[1:]
    monkeypatch.setattr(migrations, "migration_files", lambda: changed)
    with psycopg.connect(database_url, autocommit=True) as conn:
        with pytest.raises(RuntimeFailure, match=f"{name} changed after it was applied"):
            migrations.migrate(conn)
        with pytest.raises(RuntimeFailure, match="changed after it was applied"):
            migrations.require_current(conn)


def test_commands_on_a_configured_server_without_schema_name_the_fix(empty_database_url):
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        with pytest.raises(RuntimeFailure, match="run `media-hooks db migrate`"):
            migrations.require_current(conn)


def test_migrations_are_additive():
    """No migration drops or rewrites committed rows: a code rollback keeps the audit trail."""
    forbidden = ("DROP TABLE", "DROP COLUMN", "TRUNCATE", "DELETE FROM", "ALTER COLUMN")
    for _, name, text in sqlfiles.migrations():
        upper = text.upper()
        for word in forbidden:
            assert word not in upper, f"{name} contains {word}"
