"""What `media-hooks db status` reports: which server, whether it runs, where, how big, and
how its largest tables fare under autovacuum.

On the embedded default everything is read from its data folder and, when it runs, from the
server itself; nothing here starts it. A configured server is asked directly. URLs are shown
with the password left out (``db.without_password``): a password is never printed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from media_hooks.core.config import Settings
from media_hooks.core.errors import RuntimeFailure
from media_hooks.store import db, embedded, migrations
from media_hooks.store.sqlfiles import migrations as migration_files
from media_hooks.store.sqlfiles import query

# How many of the database's tables `db status` lists, the largest first.
TABLES_SHOWN = 8


@dataclass(frozen=True)
class TableHealth:
    """One table as autovacuum sees it (pg_stat_user_tables; rows are estimates)."""

    name: str
    total_bytes: int
    index_bytes: int
    live_rows: int
    dead_rows: int
    vacuumed_at: datetime | None
    vacuumed_seconds_ago: float | None
    # Since the server's statistics were last reset.
    updates: int
    heap_only_updates: int
    # PostgreSQL 16 on; None before.
    new_page_updates: int | None


@dataclass(frozen=True)
class DatabaseStatus:
    embedded: bool
    # The embedded server's postmaster runs / the configured server answered.
    running: bool
    url: str | None
    password_omitted: bool
    data_folder: Path | None
    # The embedded server's whole data folder; a configured server's one database.
    size_bytes: int | None
    # The running server's version; for a stopped embedded server, its data folder's major.
    server_version: str | None
    pid: int | None = None
    started_at: datetime | None = None
    other_sessions: int | None = None
    # Whether the server compresses the full-page images of its WAL, and whether its pages
    # carry checksums (then a hint bit set after a checkpoint logs its page too).
    wal_compression: str | None = None
    data_checksums: str | None = None
    schema: str | None = None
    log: Path | None = None
    # The database's largest tables, the largest first.
    tables: list[TableHealth] | None = None
    # Why a server that should answer did not: the report is incomplete.
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        document = asdict(self)
        for key in ("data_folder", "log"):
            document[key] = None if document[key] is None else str(document[key])
        return document


def _schema(conn) -> str:
    try:
        deferred = migrations.require_current(conn)
    except RuntimeFailure as exc:
        return str(exc)
    if deferred:
        return (
            f"current ({len(migration_files()) - len(deferred)} migrations; "
            f"{', '.join(deferred)} waits for the releases before it to go)"
        )
    return f"current ({len(migration_files())} migrations)"


def _ask(url: str) -> dict[str, Any]:
    """The server's facts and the schema's state, or {'error': why} when it does not answer."""
    try:
        with db.connect(url, autocommit=True) as conn:
            facts = dict(conn.execute(query("server_facts")).fetchone())
            facts["schema"] = _schema(conn)
            tables = conn.execute(query("table_health"), {"limit": TABLES_SHOWN}).fetchall()
            facts["tables"] = [TableHealth(**row) for row in tables]
    except RuntimeFailure as exc:
        return {"error": str(exc)}
    return facts


def _embedded(settings: Settings) -> DatabaseStatus:
    folder = embedded.data_folder(settings.home)
    size = embedded.size_on_disk(folder) if folder.exists() else None
    running = embedded.postmaster(settings.home)
    version = embedded.data_version(settings.home)
    if running is None:
        return DatabaseStatus(
            embedded=True,
            running=False,
            url=None,
            password_omitted=False,
            data_folder=folder,
            size_bytes=size,
            server_version=version,
            log=folder / "log" if version else None,
        )
    facts = (
        _ask(running.url())
        if running.status == "ready"
        else {"error": f"the server is {running.status}, not ready"}
    )
    return DatabaseStatus(
        embedded=True,
        running=True,
        url=db.without_password(running.url()),
        password_omitted=False,
        data_folder=folder,
        size_bytes=size,
        server_version=facts.get("server_version", version),
        pid=running.pid,
        started_at=running.started_at,
        other_sessions=facts.get("other_sessions"),
        wal_compression=facts.get("wal_compression"),
        data_checksums=facts.get("data_checksums"),
        schema=facts.get("schema"),
        log=folder / "log",
        tables=facts.get("tables"),
        error=facts.get("error"),
    )


def _configured(settings: Settings) -> DatabaseStatus:
    url = db.resolve_url(settings)
    facts = _ask(url)
    return DatabaseStatus(
        embedded=False,
        running="error" not in facts,
        url=db.without_password(url),
        password_omitted=db.password(url) is not None,
        data_folder=None,
        size_bytes=facts.get("database_bytes"),
        server_version=facts.get("server_version"),
        other_sessions=facts.get("other_sessions"),
        wal_compression=facts.get("wal_compression"),
        data_checksums=facts.get("data_checksums"),
        schema=facts.get("schema"),
        tables=facts.get("tables"),
        error=facts.get("error"),
    )


def describe(settings: Settings) -> DatabaseStatus:
    """The database media_hooks uses, as it is now; starts nothing."""
    return _embedded(settings) if settings.embedded else _configured(settings)
