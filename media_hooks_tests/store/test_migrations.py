"""Migrations: from empty, twice, concurrently; released files never change; a database that
applied an earlier 0004 converges; and a migration never stops producers for longer than its
lock timeout (issue 11, part 1)."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import psycopg
import pytest

from media_hooks.core.errors import RuntimeFailure
from media_hooks.store import migrations, sessions, sqlfiles
from media_hooks_tests.conftest import REPO, run_cli, run_cli_together
from media_hooks_tests.factories import add_destination
from media_hooks_tests.fingerprints import schema_fingerprint
from media_hooks_tests.interleaving import open_session, wait_for, wait_until_gone

FIXTURES = Path(__file__).parent / "fixtures"
# A statement that defines a function, after the comment lines that may precede it.
FUNCTION_DEFINITION = re.compile(r"(\s*--[^\n]*\n)*\s*CREATE\s+(OR\s+REPLACE\s+)?FUNCTION\b")
EXPECTED_TABLES = {
    "webhook_destination",
    "webhook_delivery",
    "dispatch_outbox",
    "delivery_attempt",
    "schema_migrations",
}
# The migrations these tests take a database through: the last one that locks tables (it adds
# and validates a constraint and builds an index concurrently), and every one after it.
LAST = next(
    m for m in sqlfiles.load_migrations() if m.name == "0008_secret_forms_and_attempt_window.sql"
)
_FROM_LAST = [m for m in sqlfiles.load_migrations() if m.version >= LAST.version]
FROM_LAST = [m.name for m in _FROM_LAST]
# What a release needs of them: all but the contract migrations at the end.
NEEDED_FROM_LAST = FROM_LAST[: 1 + max(i for i, m in enumerate(_FROM_LAST) if not m.contract)]


def _tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchall()
    return {name for (name,) in rows}


def _ledger(url: str) -> list[tuple]:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT version, checksum FROM schema_migrations ORDER BY 1").fetchall()


def _at_version(url: str, version: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        migrations.migrate(conn, up_to=version)


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
    # The no-transaction file builds an index concurrently, which waits for older snapshots:
    # the process waiting for the migration lock must not hold one (it would be a deadlock).
    env = dict(cli_env, MEDIA_HOOKS_DATABASE_URL=empty_database_url)
    results = run_cli_together("db", "migrate", env=env, count=3)
    assert [r.returncode for r in results] == [0, 0, 0], [r.stderr for r in results]
    assert EXPECTED_TABLES <= _tables(empty_database_url)
    assert len(_ledger(empty_database_url)) == len(sqlfiles.migrations())


def _edited(index: int) -> list[sqlfiles.Migration]:
    files = sqlfiles.load_migrations()
    m = files[index]
    files[index] = sqlfiles.migration(m.version, m.name, m.text + "\n-- edited\n")
    return files


def test_changed_migration_is_refused(database_url, monkeypatch):
    name = sqlfiles.load_migrations()[-1].name
    # As if the last one were not released yet: then the ledger's checksum is what refuses it.
    unreleased = {k: v for k, v in sqlfiles.manifest().items() if k != name}
    monkeypatch.setattr(migrations, "released_manifest", lambda: unreleased)
    monkeypatch.setattr(migrations, "migration_files", lambda: _edited(-1))
    with psycopg.connect(database_url, autocommit=True) as conn:
        with pytest.raises(RuntimeFailure, match=f"{name} changed after it was applied"):
            migrations.migrate(conn)
        with pytest.raises(RuntimeFailure, match="changed after it was applied"):
            migrations.require_current(conn)


def test_the_running_release_keeps_working_on_the_next_releases_schema(database_url, monkeypatch):
    """Schema first, then workers (docs/upgrading.md): after the next release's `db migrate`,
    the running release (here: the code without the newest file) still starts, and its own
    `db migrate` has nothing to do. (The soak's mid-run migration found it refusing to start.)"""
    files = sqlfiles.load_migrations()
    monkeypatch.setattr(migrations, "migration_files", lambda: files[:-1])
    with psycopg.connect(database_url, autocommit=True) as conn:
        migrations.require_current(conn)
        assert migrations.migrate(conn).applied == []
    assert [v for v, _ in _ledger(database_url)] == [m.version for m in files]


def test_an_unknown_migration_among_known_ones_is_refused(database_url, monkeypatch):
    files = sqlfiles.load_migrations()
    monkeypatch.setattr(migrations, "migration_files", lambda: files[:-2] + files[-1:])
    with psycopg.connect(database_url, autocommit=True) as conn:
        with pytest.raises(RuntimeFailure, match=f"{files[-2].name}.*diverged"):
            migrations.require_current(conn)


def test_an_edited_released_file_is_refused_before_anything_is_applied(
    empty_database_url, monkeypatch
):
    monkeypatch.setattr(migrations, "migration_files", lambda: _edited(1))
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        with pytest.raises(RuntimeFailure, match="0002_rate_limits.sql is not the released file"):
            migrations.migrate(conn)
    assert _tables(empty_database_url) == {"schema_migrations"}
    assert _ledger(empty_database_url) == []


def test_released_migrations_match_the_manifest():
    """Fails when a released migration is edited: add a new migration instead."""
    manifest = sqlfiles.manifest()
    files = {m.name: m for m in sqlfiles.load_migrations()}
    assert {"0001_initial.sql", "0004_hot_path.sql"} <= set(manifest)
    for name, released in manifest.items():
        assert name in files, f"released migration {name} is missing"
        assert migrations.checksum(files[name].text) == released.sha256, (
            f"{name} was edited after its release: restore it and add a new migration"
        )
        if released.accepted:
            assert released.converged_by in files, f"{name}: converged_by names no migration"
    newest_released = max(files[name].version for name in manifest)
    for name, m in files.items():
        if name not in manifest:
            assert m.version > newest_released, f"unreleased {name} is numbered among released"


@pytest.mark.parametrize("commit", ["30ab413", "10b2bc8"])
def test_the_historical_0004_fixtures_are_the_accepted_checksums(commit):
    text = (FIXTURES / f"0004_hot_path.{commit}.sql").read_text(encoding="utf-8")
    assert migrations.checksum(text) in sqlfiles.manifest()["0004_hot_path.sql"].accepted


@pytest.mark.parametrize("commit", ["30ab413", "10b2bc8"])
def test_a_database_migrated_at_an_earlier_0004_is_accepted_and_converges(
    empty_database_url, database_url, commit, cli_env
):
    old = (FIXTURES / f"0004_hot_path.{commit}.sql").read_text(encoding="utf-8")
    _at_version(empty_database_url, 3)
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        with conn.transaction():
            conn.execute(old.encode())
            conn.execute(
                "INSERT INTO schema_migrations (version, name, checksum) VALUES (4, %s, %s)",
                ("0004_hot_path.sql", migrations.checksum(old)),
            )
    with psycopg.connect(database_url) as fresh:
        expected = schema_fingerprint(fresh)
    with psycopg.connect(empty_database_url) as conn:
        assert schema_fingerprint(conn) != expected, "the old 0004 really differs"

    env = dict(cli_env, MEDIA_HOOKS_DATABASE_URL=empty_database_url)
    done = run_cli("db", "migrate", env=env)
    assert done.returncode == 0, done.stderr
    assert "0004_hot_path.sql was applied in an earlier, since edited version" in done.stderr
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        assert schema_fingerprint(conn) == expected
        migrations.require_current(conn)


def test_commands_on_a_configured_server_without_schema_name_the_fix(empty_database_url):
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        with pytest.raises(RuntimeFailure, match="run `media-hooks db migrate`"):
            migrations.require_current(conn)


def test_migrations_are_additive():
    """No migration drops or rewrites committed rows: a code rollback keeps the audit trail.
    (A function's body is what runs when it is called, not when the migration is applied: the
    outbox's triggers of 0027 delete what the previous release's purge deletes.)"""
    forbidden = ("DROP TABLE", "DROP COLUMN", "TRUNCATE", "DELETE FROM", "ALTER COLUMN")
    for m in sqlfiles.load_migrations():
        for statement in m.statements:
            upper = statement.upper()
            if FUNCTION_DEFINITION.match(upper):
                continue
            for word in forbidden:
                assert word not in upper, f"{m.name} contains {word}"


def test_no_transaction_migrations_are_idempotent_statement_by_statement(empty_database_url):
    """What lets an interrupted no-transaction file start over: every statement again changes
    nothing and fails on nothing."""
    files = [m for m in sqlfiles.load_migrations() if not m.transactional]
    assert files, "0008 is applied outside a transaction"
    for m in files:
        _at_version(empty_database_url, m.version)
        with psycopg.connect(empty_database_url, autocommit=True) as conn:
            before = schema_fingerprint(conn)
            for statement in m.statements:
                conn.execute(statement.encode())
            assert schema_fingerprint(conn) == before, m.name


def test_no_transaction_files_keep_constraints_not_valid_apart_from_validation():
    (m,) = [m for m in sqlfiles.load_migrations() if m.name == LAST.name]
    steps = [" ".join(s.split()).upper() for s in m.statements]
    adds = [i for i, s in enumerate(steps) if "ADD CONSTRAINT" in s]
    assert adds and all("NOT VALID" in steps[i] for i in adds)
    assert any("VALIDATE CONSTRAINT" in s for s in steps[adds[-1] + 1 :])
    assert all("CONCURRENTLY IF NOT EXISTS" in s for s in steps if "CREATE INDEX" in s)


# The running release's emit, as the migrations after LAST run under it: the schema goes first
# and the code follows, so this release's emit (which writes 0011's emission order) does not
# run on the schema before it. Its locks on the tables are the same.
RUNNING_RELEASE_EMIT = """
WITH identity AS (
    INSERT INTO delivery_identity (delivery_id) VALUES (%(delivery_id)s) RETURNING delivery_id
)
INSERT INTO webhook_delivery (delivery_id, destination_id, asset_id, event_type, payload, body)
SELECT delivery_id, 'pub', %(asset_id)s, 'transcode.completed', '{}', '\\x7b7d' FROM identity
"""


class _Producers:
    """Producer threads emitting in a loop, each emit timed (the latency a migration adds)."""

    def __init__(self, url: str, threads: int = 2) -> None:
        self.url = url
        self.stop = threading.Event()
        self.latencies: list[tuple[float, float]] = []  # (started, seconds)
        self.errors: list[BaseException] = []
        self.threads = [
            threading.Thread(target=self._run, args=(n,), daemon=True) for n in range(threads)
        ]

    def _run(self, n: int) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True, application_name="producer") as conn:
                i = 0
                while not self.stop.is_set():
                    i += 1
                    row = {"delivery_id": f"d-{n}-{i}", "asset_id": f"asset-{n}-{i}"}
                    started = time.monotonic()
                    conn.execute(RUNNING_RELEASE_EMIT, row)
                    self.latencies.append((started, time.monotonic() - started))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(exc)

    def __enter__(self) -> _Producers:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)


def test_migrate_while_producers_emit_and_an_idle_reader_holds_a_lock(empty_database_url, cli_env):
    """The issue's scene: the last no-transaction migration pending, producers emitting, a reader idle in a
    transaction. Producers are never held up longer than the lock timeout; the migration says
    what it waits for (never the reader's query) and completes once the reader goes."""
    url = empty_database_url
    _at_version(url, LAST.version - 1)
    with psycopg.connect(url, autocommit=True) as conn:
        add_destination(conn, "pub")
    lock_timeout = 0.5
    reader = psycopg.connect(url, application_name="nightly-report")
    reader.execute("SELECT count(*) FROM webhook_destination WHERE url <> 'reader-secret-marker'")
    reader_pid = reader.info.backend_pid
    env = dict(cli_env, MEDIA_HOOKS_DATABASE_URL=url)
    stderr_lines: list[str] = []
    with _Producers(url) as producers:
        wait_for(lambda: len(producers.latencies) > 20, "producers to start", 30)
        migrate = subprocess.Popen(
            [sys.executable, "-m", "media_hooks.cli", "db", "migrate"]
            + ["--lock-timeout", str(lock_timeout)],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        collector = threading.Thread(
            target=lambda: stderr_lines.extend(migrate.stderr), daemon=True
        )
        collector.start()
        try:
            wait_for(
                lambda: sum("retrying" in line for line in stderr_lines) >= 2,
                "the migration to time out twice on the reader's lock",
                60,
            )
            emitted_while_blocked = len(producers.latencies)
            reader.commit()  # the reader goes
            out, _ = migrate.communicate(timeout=120)
            collector.join(timeout=10)
        finally:
            if migrate.poll() is None:
                migrate.kill()
            reader.close()
        emitted_after = len(producers.latencies)
    assert producers.errors == []
    assert migrate.returncode == 0, "".join(stderr_lines)
    assert out.strip() == f"applied {len(FROM_LAST)} migration(s): {', '.join(FROM_LAST)}"
    report = "".join(stderr_lines)
    assert "waited for AccessExclusiveLock on webhook_destination" in report
    assert f"pid {reader_pid} (application_name 'nightly-report', idle in transaction for" in report
    assert "reader-secret-marker" not in report, "another session's query is never shown"
    worst = max(seconds for _, seconds in producers.latencies)
    assert worst < lock_timeout + 1.0, f"a producer waited {worst:.2f} s"
    assert emitted_while_blocked > 20 and emitted_after > emitted_while_blocked
    with psycopg.connect(url, autocommit=True) as conn:
        migrations.require_current(conn)


def _blocker(url: str, table: str, mode: str) -> psycopg.Connection:
    blocker = psycopg.connect(url, application_name="blocker")
    blocker.execute(f"LOCK TABLE {table} IN {mode} MODE")
    return blocker


def test_a_migration_that_cannot_get_its_lock_gives_up_naming_the_blocker(empty_database_url):
    _at_version(empty_database_url, LAST.version - 1)
    blocker = _blocker(empty_database_url, "webhook_destination", "ACCESS SHARE")
    lines: list[str] = []
    policy = migrations.LockPolicy(lock_timeout_seconds=0.2, max_wait_seconds=1.0)
    try:
        with psycopg.connect(empty_database_url, autocommit=True) as conn:
            with pytest.raises(RuntimeFailure) as refused:
                migrations.migrate(conn, policy=policy, report=lines.append)
            message = str(refused.value)
            assert message.startswith(f"{LAST.name}, statement 2 of ")
            assert (
                "gave up after" in message
                and "AccessExclusiveLock on webhook_destination" in message
            )
            assert f"pid {blocker.info.backend_pid} (application_name 'blocker'" in message
            assert any("retrying in" in line for line in lines)
            pending = re.escape(f"pending migrations ({', '.join(NEEDED_FROM_LAST)})")
            with pytest.raises(RuntimeFailure, match=pending):
                migrations.require_current(conn)
    finally:
        blocker.close()
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        assert migrations.migrate(conn).applied == FROM_LAST, "it starts over, idempotently"


def test_an_interrupted_concurrent_index_build_is_dropped_and_built_again(empty_database_url):
    _at_version(empty_database_url, LAST.version - 1)
    (statement,) = [s for s in LAST.statements if "CONCURRENTLY" in s]
    index = sqlfiles.concurrent_index_name(statement)
    # A writer idle in its transaction makes the build wait; its lock timeout interrupts it,
    # leaving the invalid index an interrupted build leaves.
    (table,) = re.findall(r"\bON\s+(\w+)", statement)
    writer = _blocker(empty_database_url, table, "ROW EXCLUSIVE")
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '200ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            conn.execute(statement.encode())
        writer.close()
        valid = "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)"
        assert conn.execute(valid, (index,)).fetchone() == (False,)
        lines: list[str] = []
        migrations.migrate(conn, report=lines.append, up_to=LAST.version)
        assert conn.execute(valid, (index,)).fetchone() == (True,)
    assert f"dropping the invalid index {index} left by an interrupted build" in lines


def test_migrate_options_are_checked(cli_env):
    for option, value in [
        ("--lock-timeout", "0"),
        ("--lock-timeout", "nan"),
        ("--max-wait", "-1"),
        ("--statement-timeout", "inf"),
    ]:
        done = run_cli("db", "migrate", option, value, env=cli_env)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and option in done.stderr


def test_split_statements_knows_quotes_comments_and_function_bodies():
    text = """
    -- a comment; with a semicolon
    SELECT 'a;b', "c;d", E'it\\'s;';
    /* block; /* nested; */ still; */ SELECT 2;
    CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $body$ SELECT 1; $body$;
    DO $$ BEGIN PERFORM 1; END $$;
    -- only a comment at the end;
    """
    assert sqlfiles.split_statements(text) == [
        "SELECT 'a;b', \"c;d\", E'it\\'s;'",
        "/* block; /* nested; */ still; */ SELECT 2",
        "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $body$ SELECT 1; $body$",
        "DO $$ BEGIN PERFORM 1; END $$",
    ]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("-- migrate: sometimes\nSELECT 1;", "unknown directive 'sometimes'"),
        ("-- migrate: no-transaction\nCREATE INDEX CONCURRENTLY i ON t (c);", "IF NOT EXISTS"),
        ("-- migrate: no-transaction\nCREATE INDEX CONCURRENTLY IF NOT EXISTS ON t (c);", "name"),
    ],
)
def test_malformed_migration_files_are_refused(text, problem):
    with pytest.raises(ValueError, match=problem):
        sqlfiles.migration(99, "0099_x.sql", text)


def test_the_directive_is_read_from_the_leading_comments_only():
    later = sqlfiles.migration(99, "0099_x.sql", "SELECT 1;\n-- migrate: no-transaction\n")
    assert later.transactional
    first = sqlfiles.migration(
        99, "0099_x.sql", "-- 0099\n--   migrate:  no-transaction \nSELECT 1;"
    )
    assert not first.transactional and first.statements == ("SELECT 1",)


def test_lock_policy_defaults_are_short_and_bounded():
    policy = migrations.LockPolicy()
    assert policy.lock_timeout_seconds <= 5 and policy.statement_timeout_seconds > 0
    assert dataclasses.replace(policy, max_wait_seconds=0).max_wait_seconds == 0


def test_the_contract_directive_is_read_beside_no_transaction():
    both = sqlfiles.migration(
        99, "0099_x.sql", "-- migrate: no-transaction\n-- migrate: contract\nDROP INDEX i;"
    )
    assert (both.transactional, both.contract) == (False, True)
    assert not sqlfiles.migration(99, "0099_x.sql", "SELECT 1;").contract


CONTRACT = next(m for m in sqlfiles.load_migrations() if m.contract)
FROM_CONTRACT = [m.name for m in sqlfiles.load_migrations() if m.version >= CONTRACT.version]


@contextmanager
def _release_of(last: sqlfiles.Migration) -> Iterator[None]:
    """This process as the release whose newest migration is ``last``."""
    files = [m for m in sqlfiles.load_migrations() if m.version <= last.version]
    with mock.patch.object(migrations, "migration_files", lambda: files):
        yield


# `media-hooks` as the release whose newest migration is the version given after the program.
RELEASE_OF = """
import sys
from media_hooks.store import sqlfiles
load, last = sqlfiles.load_migrations, int(sys.argv.pop(1))
sqlfiles.load_migrations = lambda: [m for m in load() if m.version <= last]
from media_hooks.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _run_as_release_of(
    last: sqlfiles.Migration, *args: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", RELEASE_OF, str(last.version), *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


@contextmanager
def _named(url: str, application_name: str) -> Iterator[psycopg.Connection]:
    """A session named as a program names itself, closed and waited out on the way out: the
    migration counts the sessions ``pg_stat_activity`` lists, a closed one among them until its
    backend has exited."""
    with open_session(url, autocommit=True, application_name=application_name) as session:
        pid = session.info.backend_pid
        yield session
    with psycopg.connect(url, autocommit=True) as observer:
        wait_until_gone(observer, pid)


def _index_exists(conn: psycopg.Connection, name: str) -> bool:
    return conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()[0]


def test_a_contract_migration_waits_while_a_release_before_it_is_connected(empty_database_url):
    """An earlier release's worker (named without a generation, as releases before 30 named
    themselves) and one of generation 29 (one migration short) hold the contract migration
    back: it and what comes after it stay pending, and the report says whose sessions it waits
    for. Sessions of this release and of other programs do not. The release whose migrations
    end with it runs meanwhile; a later one, with a migration of its own after it, waits for
    it and says so."""
    _at_version(empty_database_url, CONTRACT.version - 1)
    ours = sessions.session_name("worker")
    lines: list[str] = []
    with (
        _named(empty_database_url, "media_hooks:worker") as unnamed,
        _named(empty_database_url, f"media_hooks:sweeps:g{CONTRACT.version - 1}"),
        _named(empty_database_url, ours),
        _named(empty_database_url, "nightly-report"),
        psycopg.connect(empty_database_url, autocommit=True) as conn,
    ):
        result = migrations.migrate(conn, report=lines.append)
        assert (result.applied, result.deferred) == ([], FROM_CONTRACT)
        assert result.waiting_for == (
            f"worker 1 (generation unnamed); sweeps 1 (g{CONTRACT.version - 1})"
        )
        (line,) = lines
        assert line.startswith(f"{CONTRACT.name} removes what releases before it use")
        assert result.waiting_for in line and "--previous-release-gone" in line
        with _release_of(CONTRACT):
            assert migrations.require_current(conn) == [CONTRACT.name]
        with pytest.raises(RuntimeFailure, match=f"applies {CONTRACT.name} and those after"):
            migrations.require_current(conn)
        assert _index_exists(conn, "webhook_delivery_due")
        # One of them gone, the other still holds it.
        pid = unnamed.info.backend_pid
        unnamed.close()
        wait_until_gone(conn, pid)
        assert migrations.migrate(conn).waiting_for == f"sweeps 1 (g{CONTRACT.version - 1})"
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        with _named(empty_database_url, ours):
            assert migrations.migrate(conn).applied == FROM_CONTRACT
        assert migrations.require_current(conn) == []
        assert not _index_exists(conn, "webhook_delivery_due")
        assert not _index_exists(conn, "delivery_attempt_started")


# This release's newest migration, a contract one (0035), and the one before it. The release
# that brought a contract migration runs while it waits; this code can stand for the release of
# 0035 only (its statements read the schema up to 0034: as the release of an earlier contract
# migration, its status would read tables not there yet).
*_, BEFORE_OWN_CONTRACT, OWN_CONTRACT = sqlfiles.load_migrations()


def test_the_operator_can_say_the_previous_release_is_gone(empty_database_url, cli_env):
    """An earlier release's worker holds the contract migrations back: a release with a
    migration of its own after one of them refuses to run, and says why; the operator says
    that release is gone and they apply, up to this release's own, which waits again for the
    same worker while this release runs: its commands find the schema current, status says what
    waits and for whom, and the operator's word applies it too."""
    assert OWN_CONTRACT.contract
    env = dict(cli_env, MEDIA_HOOKS_DATABASE_URL=empty_database_url)
    _at_version(empty_database_url, CONTRACT.version - 1)
    with _named(empty_database_url, "media_hooks:worker"):
        held = run_cli("db", "migrate", env=env)
        assert held.returncode == 0, held.stderr
        assert held.stdout == (
            f"deferred {len(FROM_CONTRACT)} migration(s) until the releases before them have "
            f"gone: {', '.join(FROM_CONTRACT)}\n"
        )
        assert "worker 1 (generation unnamed)" in held.stderr
        status = _run_as_release_of(CONTRACT, "db", "status", "--json", env=env)
        assert status.returncode == 0, status.stderr
        assert f"{CONTRACT.name} waits for the releases before it" in status.stdout
        # A release with a migration of its own after it waits for it, and says why.
        refused = run_cli("status", env=env)
        assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
        assert f"applies {CONTRACT.name} and those after it once no session" in refused.stderr
        forced = _run_as_release_of(
            BEFORE_OWN_CONTRACT, "db", "migrate", "--previous-release-gone", "--json", env=env
        )
        assert forced.returncode == 0, forced.stderr
        document = json.loads(forced.stdout)
        assert (document["applied"], document["deferred"], document["waiting_for"]) == (
            FROM_CONTRACT[:-1],
            [],
            None,
        )
        # The release that brought the last contract migration runs meanwhile.
        assert run_cli("db", "migrate", env=env).stdout.startswith("deferred 1 migration(s)")
        status = run_cli("db", "status", "--json", env=env)
        assert status.returncode == 0, status.stderr
        assert f"{OWN_CONTRACT.name} waits for the releases before it" in status.stdout
        shown = run_cli("status", env=env)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.rstrip().endswith(
            "an earlier release (generation unnamed): worker 1\n"
            f"contract migrations pending: {OWN_CONTRACT.name}; `media-hooks db migrate` "
            "applies them once the earlier release has gone"
        )
        forced = run_cli("db", "migrate", "--previous-release-gone", "--json", env=env)
    assert forced.returncode == 0, forced.stderr
    document = json.loads(forced.stdout)
    assert (document["applied"], document["deferred"], document["waiting_for"]) == (
        [OWN_CONTRACT.name],
        [],
        None,
    )
