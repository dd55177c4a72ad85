"""Configuration → a connection (pool), and the errors a user sees when that fails.

``MEDIA_HOOKS_DATABASE_URL`` when set; otherwise the embedded server (``media_hooks.store.embedded``).
Errors never echo a password: URLs are shown redacted, driver messages are reduced to their
first line (libpq does not put passwords in them).

Roles. Every connection the project opens is for one role, and carries that role's bounds as
session settings: ``statement_timeout``, ``lock_timeout`` and
``idle_in_transaction_session_timeout`` (and ``application_name`` ``media_hooks:<role>:g<N>``, so
an operator sees who is who in ``pg_stat_activity``: ``N`` is the release's schema generation,
the version of its newest migration, which tells the releases of a rolling upgrade apart). One
stuck session (an operator's open psql transaction, a hung client) then delays a statement of
ours by at most the lock timeout, never indefinitely. The bounds come from
``MEDIA_HOOKS_LOCK_TIMEOUT_SECONDS`` (every role) and ``MEDIA_HOOKS_STATEMENT_TIMEOUT_SECONDS``
scaled per role (``bounds``). A connection opened with ``connect`` gets them at connect time; a
pooled one when it is borrowed (``borrow``), since one pool serves several roles.

A statement that meets a lock or a timeout is an ordinary event: ``retrying`` runs it again with
a growing, jittered pause, logging each retry, and gives up with ``DatabaseBusy``, one line, after
``BUSY_TRIES`` tries. What it would have changed is rolled back each time, so nothing is lost
and nothing is half written; the row protocol makes every statement safe to run again.
"""

from __future__ import annotations

import enum
import logging
import random
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import quote, urlencode

import psycopg
from psycopg import conninfo, errors
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from media_hooks.core.config import Settings
from media_hooks.core.errors import RuntimeFailure, UserError, first_line
from media_hooks.store import embedded, migrations, sessions

log = logging.getLogger("media_hooks")
T = TypeVar("T")


class Role(enum.Enum):
    """Who a connection works for; each has its own bounds (``bounds``)."""

    WORKER = "worker"  # delivery batches: claim, lease, record, defer, permits
    RECONCILER = "reconciler"  # finding due destinations and claiming their pages
    SWEEPS = "sweeps"  # expired leases, stale enqueues, run release, breaker, retention
    OPERATOR = "operator"  # the CLI's commands and the operator jobs (requeue, status, ...)
    PRODUCER = "producer"  # `media-hooks emit` (a producer's own connection is the producer's)
    MIGRATION = "migration"  # `db migrate`: a migration takes as long as its data


# Each role's statement timeout, in units of MEDIA_HOOKS_STATEMENT_TIMEOUT_SECONDS (60 s by
# default). The engine's statements are bounded pages; an operator's requeue or a producer's
# bulk file is one statement over a whole cohort or file; a migration is not bounded at all.
_STATEMENT_SCALE = {
    Role.WORKER: 1,
    Role.RECONCILER: 1,
    Role.SWEEPS: 2,
    Role.OPERATOR: 5,
    Role.PRODUCER: 10,
    Role.MIGRATION: 0,
}


@dataclass(frozen=True)
class Bounds:
    statement_seconds: float  # 0: no bound
    lock_seconds: float
    idle_in_transaction_seconds: float


def bounds(role: Role, settings: Settings) -> Bounds:
    """A role's bounds. A transaction of ours never idles: one left open (by a client that
    hung between statements) ends after as long as a statement of its role may run."""
    base = settings.statement_timeout_seconds
    statement = base * _STATEMENT_SCALE[role]
    return Bounds(statement, settings.lock_timeout_seconds, statement or base)


def _milliseconds(seconds: float) -> str:
    return str(max(round(seconds * 1000), 1) if seconds else 0)


def _session_settings(role: Role, settings: Settings) -> dict[str, str]:
    limits = bounds(role, settings)
    return {
        "statement_timeout": _milliseconds(limits.statement_seconds),
        "lock_timeout": _milliseconds(limits.lock_seconds),
        "idle_in_transaction_session_timeout": _milliseconds(limits.idle_in_transaction_seconds),
        "application_name": sessions.session_name(role.value),
    }


def _connect_options(url: str, role: Role, settings: Settings) -> dict[str, str]:
    """libpq parameters that start a session in ``role`` (added to any the URL has)."""
    given = conninfo.conninfo_to_dict(url)
    wanted = _session_settings(role, settings)
    options = " ".join(
        f"-c {name}={value}" for name, value in wanted.items() if name != "application_name"
    )
    result = {"options": f"{given['options']} {options}" if given.get("options") else options}
    if "application_name" not in given:
        result["application_name"] = wanted["application_name"]
    return result


# The role each connection's session is in, so borrowing it for the same role costs nothing.
_roles: weakref.WeakKeyDictionary[psycopg.Connection, tuple] = weakref.WeakKeyDictionary()


def use_role(conn: psycopg.Connection, role: Role, settings: Settings) -> None:
    """Put an autocommit connection's session in ``role`` (one round trip, when it was not)."""
    wanted = _session_settings(role, settings)
    key = tuple(sorted(wanted.items()))
    if _roles.get(conn) == key:
        return
    if not conn.autocommit:
        raise ValueError("a role is set on a connection in autocommit mode")
    conn.execute(
        "SELECT " + ", ".join(f"set_config('{name}', %s, false)" for name in wanted),
        list(wanted.values()),
    )
    _roles[conn] = key


@contextmanager
def borrow(
    pool: ConnectionPool, role: Role, settings: Settings | None = None
) -> Iterator[psycopg.Connection]:
    """A pooled connection in autocommit mode (what the engine's functions expect), in
    ``role`` for as long as it is borrowed."""
    with pool.connection() as conn:
        conn.autocommit = True
        use_role(conn, role, settings or Settings.from_env())
        yield conn


class DatabaseBusy(RuntimeFailure):
    """A statement kept meeting a lock held elsewhere or its timeout, and was given up."""


BUSY_TRIES = 5
_FIRST_PAUSE_SECONDS = 0.1
_LONGEST_PAUSE_SECONDS = 2.0


def busy_cause(exc: BaseException) -> str | None:
    """Why a statement was refused, when the cause is another session or a bound: words for
    the log and the error; None for any other failure (not retried)."""
    if isinstance(exc, errors.LockNotAvailable):
        return "a lock held by another session outlasted lock_timeout"
    if isinstance(exc, errors.QueryCanceled) and "statement timeout" in str(exc):
        return "the statement outlasted statement_timeout"
    if isinstance(exc, errors.DeadlockDetected):
        return "a deadlock with another session"
    if isinstance(exc, errors.SerializationFailure):
        return "a serialization conflict with another session"
    return None


def retrying(
    what: str, action: Callable[[], T], *, changes: bool = False, until: float | None = None
) -> T:
    """Run ``action`` (one statement, or one transaction it opens and ends) until it is not
    refused by a lock, a timeout or a conflict: up to ``BUSY_TRIES`` times, or for as long as
    ``until`` (a ``time.monotonic()`` instant) allows when that is longer, pausing longer each
    time (0.1 s doubling up to 2 s, jittered) and logging each retry. Then DatabaseBusy, one line
    naming ``what`` and the cause (``changes``: say that nothing was changed)."""
    pause = _FIRST_PAUSE_SECONDS
    attempt = 1
    while True:
        try:
            return action()
        except errors.Error as exc:
            cause = busy_cause(exc)
            if cause is None:
                raise
            wait = pause * random.uniform(0.8, 1.2)
            more_time = until is not None and time.monotonic() + wait < until
            if attempt >= BUSY_TRIES and not more_time:
                undone = "; nothing was changed" if changes else ""
                raise DatabaseBusy(
                    f"{what}: {cause}, {attempt} times; gave up{undone} (try again, or look "
                    "for a long transaction in pg_stat_activity)"
                ) from exc
        log.warning("%s: %s; retrying in %.2f s (try %d)", what, cause, wait, attempt)
        time.sleep(wait)
        attempt += 1
        pause = min(pause * 2, _LONGEST_PAUSE_SECONDS)


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
def connect(
    url: str, *, role: Role = Role.OPERATOR, settings: Settings | None = None, **kwargs
) -> Iterator[psycopg.Connection]:
    """One connection in ``role``, with connection failures turned into a clear RuntimeFailure,
    and a statement that met a lock or a timeout (after the caller's retries) into one line."""
    options = _connect_options(url, role, settings or Settings.from_env())
    try:
        conn = psycopg.connect(url, row_factory=dict_row, connect_timeout=10, **options, **kwargs)
    except psycopg.OperationalError as exc:
        raise _unreachable(url, exc) from None
    with conn:
        try:
            yield conn
        except errors.Error as exc:
            cause = busy_cause(exc)
            if cause is None:
                raise
            raise DatabaseBusy(
                f"{cause} (try again, or look for a long transaction in pg_stat_activity)"
            ) from None


def open_pool(
    url: str,
    *,
    max_size: int = 8,
    name: str = "media_hooks",
    role: Role = Role.OPERATOR,
    settings: Settings | None = None,
) -> ConnectionPool:
    """A pool whose connections return rows as dicts and start in ``role`` (``borrow`` puts
    one in another); fails fast and clearly if unreachable."""
    options = _connect_options(url, role, settings or Settings.from_env())
    pool = ConnectionPool(
        url,
        min_size=1,
        max_size=max_size,
        kwargs={"row_factory": dict_row, "connect_timeout": 10, **options},
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
    with connect(url, autocommit=True, role=Role.MIGRATION, settings=settings) as conn:
        if settings.embedded:
            migrations.migrate(conn)
        else:
            migrations.require_current(conn)
    return url
