"""Configuration to a database: the embedded default shared by processes, and clear errors."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from psycopg import conninfo

from media_hooks.store import db, embedded
from media_hooks_tests.conftest import run_cli, run_cli_together


def _env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEDIA_HOOKS_")}
    env.update(overrides)
    return env


def _postmaster_pid(home: Path) -> int:
    return int((home / "pgdata" / "postmaster.pid").read_text().splitlines()[0])


def _stop(pid: int, deadline_seconds: float = 30.0) -> None:
    os.kill(pid, signal.SIGINT)  # PostgreSQL's fast shutdown
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    pytest.fail("the embedded server did not stop")


@pytest.mark.embedded_only
def test_concurrent_first_uses_share_one_embedded_server_and_later_commands_reuse_it():
    # Not under pytest's basetemp: the server runs as its own system user and needs to
    # traverse the path (pytest keeps its folders private).
    home = Path(tempfile.mkdtemp(prefix="media_hooks_home_"))
    env = _env(MEDIA_HOOKS_HOME=str(home))
    try:
        results = run_cli_together("db", "migrate", env=env)
        assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
        first = _postmaster_pid(home)

        later = run_cli("status", "--json", env=env)
        assert later.returncode == 0, later.stderr
        assert _postmaster_pid(home) == first  # reused, not restarted
        servers = subprocess.run(
            ["pgrep", "-f", "--", f"-D {home / 'pgdata'}"], capture_output=True, text=True
        )
        assert len(servers.stdout.split()) == 1
        _stop(first)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_an_unreachable_database_is_one_line_exit_1_and_no_password():
    env = _env(MEDIA_HOOKS_DATABASE_URL="postgresql://postgres:s3cret-pw@127.0.0.1:1/media_hooks")
    result = run_cli("destination", "list", env=env)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert "cannot connect to PostgreSQL" in result.stderr
    assert "s3cret-pw" not in result.stderr + result.stdout
    assert "Traceback" not in result.stderr


def test_a_malformed_database_url_is_a_usage_error():
    result = run_cli("status", env=_env(MEDIA_HOOKS_DATABASE_URL="host=a =b"))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "not a valid PostgreSQL URL" in result.stderr


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://postgres:@/media_hooks?host=/tmp/some%20home/pgdata",
        "postgresql://app:p%40ss@db.example.com:6543/media%20hooks?sslmode=require",
        "postgresql://u:pw@[::1]:5433,replica:5434/db?target_session_attrs=read-write&password=x",
        "host=db.example.com port=5432 user='we ird' password=pw dbname=x options='-c a=b'",
        "postgresql:///only_a_db",
        "dbname=x application_name='a&b=c?'",
    ],
)
def test_a_url_without_its_password_means_the_same_to_libpq(url):
    shown = db.without_password(url)
    assert shown.startswith("postgresql://")
    assert "pw" not in shown and "p%40ss" not in shown
    expected = {k: v for k, v in conninfo.conninfo_to_dict(url).items() if k != "password"}
    assert conninfo.conninfo_to_dict(shown) == expected


def _pidfile(home: Path, pid: int) -> None:
    folder = home / "pgdata"
    folder.mkdir(parents=True)
    lines = [str(pid), str(folder), "1700000000", "5433", "/run/sock", "", "0 1", "ready"]
    (folder / "postmaster.pid").write_text("\n".join(lines) + "\n")


def test_a_postmaster_pid_file_is_read_and_a_dead_servers_file_is_not_a_server(tmp_path):
    _pidfile(tmp_path / "live", os.getpid())
    live = embedded.postmaster(tmp_path / "live")
    assert live is not None
    assert (live.pid, live.port, live.socket_dir, live.status) == (
        os.getpid(),
        5433,
        "/run/sock",
        "ready",
    )
    assert conninfo.conninfo_to_dict(live.url()) == {
        "user": "postgres",
        "dbname": "media_hooks",
        "host": "/run/sock",
        "port": "5433",
    }

    dead_pid = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_pid.wait()
    _pidfile(tmp_path / "dead", dead_pid.pid)
    assert embedded.postmaster(tmp_path / "dead") is None
    assert embedded.postmaster(tmp_path / "never") is None
