"""Configuration to a database: the embedded default shared by processes, and clear errors."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

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
