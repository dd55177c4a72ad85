"""Configuration → a connection (pool), and the errors a user sees when that fails.

``MEDIA_HOOKS_DATABASE_URL`` when set; otherwise the embedded server (``media_hooks.embedded``).
Errors never echo a password: URLs are shown redacted, driver messages are reduced to their
first line (libpq does not put passwords in them).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote, urlencode

import psycopg
from psycopg import conninfo
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from media_hooks import embedded, migrations
from media_hooks.config import Settings
from media_hooks.errors import RuntimeFailure, UserError, first_line


def redact(url: str) -> str:
    """The URL with any password replaced, for messages and logs."""
    try:
        params = conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "<unparseable database URL>"
    if "password" in params:
        params["password"] = "***"
    return conninfo.make_conninfo(**params)


def password(url: str) -> str | None:
    """The password in ``url``, if any: for ``PGPASSWORD``, never to be printed."""
    return conninfo.conninfo_to_dict(url).get("password") or None


def _single(value: str | None) -> bool:
    return bool(value) and "," not in value


def without_password(url: str) -> str:
    """``url`` (a URL or a key=value string) as a ``postgresql://`` URL with any password left
    out: safe to print, and usable by another tool, which then takes the password from
    ``PGPASSWORD`` or ``~/.pgpass``. A socket folder or several hosts go in the query string."""
    params = {k: v for k, v in conninfo.conninfo_to_dict(url).items() if k != "password"}
    user = params.pop("user", None)
    dbname = params.pop("dbname", None)
    host, port = params.get("host"), params.get("port")
    authority = ""
    if _single(host) and not host.startswith("/") and (port is None or _single(port)):
        del params["host"]
        authority = f"[{host}]" if ":" in host else quote(host, safe="")
        if port is not None:
            authority += f":{params.pop('port')}"
    userinfo = f"{quote(user, safe='')}@" if user else ""
    path = f"/{quote(dbname or '', safe='')}" if dbname or params else ""
    query = f"?{urlencode(params, quote_via=quote, safe='/,:')}" if params else ""
    return f"postgresql://{userinfo}{authority}{path}{query}"


def with_database(url: str, name: str) -> str:
    """The same server and credentials, another database."""
    params = conninfo.conninfo_to_dict(url)
    params["dbname"] = name
    return conninfo.make_conninfo(**params)


def resolve_url(settings: Settings) -> str:
    """The libpq URL to use: the configured one, or the embedded server's (started if needed)."""
    if settings.database_url is not None:
        try:
            conninfo.conninfo_to_dict(settings.database_url)
        except psycopg.ProgrammingError:
            raise UserError(
                "MEDIA_HOOKS_DATABASE_URL is not a valid PostgreSQL URL "
                "(expected postgresql://user@host:port/dbname)"
            ) from None
        return settings.database_url
    return embedded.embedded_url(settings.home)


def _unreachable(url: str, exc: Exception) -> RuntimeFailure:
    return RuntimeFailure(f"cannot connect to PostgreSQL at {redact(url)}: {first_line(exc)}")


@contextmanager
def connect(url: str, **kwargs) -> Iterator[psycopg.Connection]:
    """One connection, with connection failures turned into a clear RuntimeFailure."""
    try:
        conn = psycopg.connect(url, row_factory=dict_row, connect_timeout=10, **kwargs)
    except psycopg.OperationalError as exc:
        raise _unreachable(url, exc) from None
    with conn:
        yield conn


def open_pool(url: str, *, max_size: int = 8, name: str = "media_hooks") -> ConnectionPool:
    """A pool whose connections return rows as dicts; fails fast and clearly if unreachable."""
    pool = ConnectionPool(
        url,
        min_size=1,
        max_size=max_size,
        kwargs={"row_factory": dict_row, "connect_timeout": 10},
        name=name,
        open=False,
    )
    try:
        pool.open(wait=True, timeout=15)
    except Exception as exc:
        pool.close()
        # The pool swallows the driver error; one direct attempt names the cause.
        try:
            psycopg.connect(url, connect_timeout=10).close()
        except psycopg.OperationalError as direct:
            raise _unreachable(url, direct) from None
        raise _unreachable(url, exc) from None
    return pool


def ready_url(settings: Settings | None = None) -> str:
    """The database URL with a current schema behind it.

    On the embedded default the schema is migrated automatically (a new user has nothing to
    set up); on a configured server the operator migrates explicitly, and a missing or older
    schema is a clear error naming the command.
    """
    settings = settings or Settings.from_env()
    url = resolve_url(settings)
    with connect(url, autocommit=True) as conn:
        if settings.embedded:
            migrations.migrate(conn)
        else:
            migrations.require_current(conn)
    return url
