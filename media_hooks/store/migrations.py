"""Applies ``sql/migrations`` in order, under an advisory lock, without stopping producers.

A migration that waits for a table lock is dangerous in a way its own duration is not: every
producer's ``emit`` that needs the table queues behind it, for as long as the session in its
way stays (an idle transaction can stay for hours). So each statement runs under a short
``lock_timeout``: on a timeout the statement (a transactional file: its whole transaction)
is rolled back, which frees everything queued behind it, the runner reports what it waited
for (``media_hooks.store.lockwatch``: the relation, the sessions in the way, never their queries)
and tries again after a backoff, until ``max_wait_seconds`` have passed. Producers are then
never held up longer than the lock timeout.

A file marked ``-- migrate: no-transaction`` (``media_hooks.store.sqlfiles``) runs one statement at
a time outside a transaction, each retried on its own: ``CREATE INDEX CONCURRENTLY`` (which
cannot run in a transaction) and a constraint added ``NOT VALID`` in one statement and
validated in the next (validation scans the table under a lock that lets writes through). Its
statements are idempotent, and an index left invalid by an interrupted concurrent build is
dropped before it is built again. The file is recorded as applied after its last statement.

A file marked ``-- migrate: contract`` removes what only the releases before it use (an index
their statements read). It is applied only when no session of such a release is connected
(``media_hooks.store.sessions``: every session names its release's generation), else it and
the files after it are deferred, the report says whose sessions it waits for, and the next
``migrate`` tries again. This release counts the schema as current without it
(``require_current``). Applied early (the operator's ``previous_release_gone``), it breaks
nothing: a straggler of an earlier release runs, its reads slower.

Each applied file is recorded with its SHA-256 in ``schema_migrations``. A file whose content
differs from what the database applied is refused, unless the manifest of released migrations
(``sql/migrations/manifest.toml``) accepts that older checksum: then a later migration brings
the database to the current definitions. A released file whose content is not its released
checksum is refused before anything is applied.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg
from psycopg import conninfo, sql
from psycopg.rows import tuple_row

from media_hooks.core import backoff
from media_hooks.core.errors import RuntimeFailure, first_line
from media_hooks.store import sessions
from media_hooks.store.lockwatch import LockWatch
from media_hooks.store.sqlfiles import Migration, Released, concurrent_index_name
from media_hooks.store.sqlfiles import load_migrations as migration_files
from media_hooks.store.sqlfiles import manifest as released_manifest

# One fixed key: every migrating process in this database serializes on it.
_LOCK_KEY = 0x6D656469615F686F  # "media_ho"
APPLICATION_NAME = "media-hooks db migrate"

_CREATE_LEDGER = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    checksum    text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
)
"""
_RECORD = "INSERT INTO schema_migrations (version, name, checksum) VALUES (%s, %s, %s)"

Report = Callable[[str], None]


@dataclass(frozen=True)
class LockPolicy:
    """How a migration waits for locks (``media-hooks db migrate --help`` documents these)."""

    # The longest any statement waits for a lock, so the longest a producer queues behind it.
    lock_timeout_seconds: float = 2.0
    # How long to keep retrying a statement whose locks are not to be had before giving up.
    max_wait_seconds: float = 600.0
    # A statement that runs (not waits) longer is cancelled: index builds and validation
    # on large tables need time, a runaway statement does not get for ever.
    statement_timeout_seconds: float = 3600.0
    retry_base_seconds: float = 0.5
    retry_cap_seconds: float = 15.0


@dataclass(frozen=True)
class MigrationResult:
    applied: list[str]
    already_applied: int
    lock_timeouts: int = 0  # statements that gave up a lock wait and were tried again
    # Left pending: a contract migration whose earlier releases are still connected, and any
    # after it; ``waiting_for`` says whose sessions.
    deferred: list[str] = field(default_factory=list)
    waiting_for: str | None = None


def checksum(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _applied(conn: psycopg.Connection) -> dict[int, tuple[str, str]]:
    with conn.cursor(row_factory=tuple_row) as cur:
        (exists,) = cur.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
        if not exists:
            return {}
        rows = cur.execute("SELECT version, name, checksum FROM schema_migrations").fetchall()
    return {version: (name, digest) for version, name, digest in rows}


def _check_released(files: list[Migration], manifest: dict[str, Released]) -> None:
    for migration in files:
        released = manifest.get(migration.name)
        if released is not None and checksum(migration.text) != released.sha256:
            raise RuntimeFailure(
                f"migration {migration.name} is not the released file (its checksum differs "
                "from sql/migrations/manifest.toml); a released migration is never edited: "
                "add a new one"
            )


def _check_unchanged(
    applied: dict[int, tuple[str, str]],
    files: list[Migration],
    manifest: dict[str, Released],
) -> None:
    by_version = {m.version: m for m in files}
    newest_known = max(by_version, default=0)
    for version, (name, digest) in sorted(applied.items()):
        migration = by_version.get(version)
        if migration is None and version > newest_known:
            # The next release's schema, applied under this one (docs/upgrading.md: schema
            # first, then workers): migrations only add, so this code works on it unchanged,
            # and a rollback to it must too.
            continue
        if migration is None:
            raise RuntimeFailure(
                f"the database has migration {version:04d} ({name}) that this code does not know, "
                "numbered among the ones it knows: it was migrated by a diverged media_hooks"
            )
        released = manifest.get(migration.name)
        if digest == checksum(migration.text) or (released and digest in released.accepted):
            continue
        raise RuntimeFailure(
            f"migration {migration.name} changed after it was applied (checksum differs); "
            "never edit an applied migration: add a new one"
        )


def _checked_files(applied: dict[int, tuple[str, str]]) -> list[Migration]:
    files = migration_files()
    manifest = released_manifest()
    _check_released(files, manifest)
    _check_unchanged(applied, files, manifest)
    return files


def _setting(conn: psycopg.Connection, name: str) -> str:
    with conn.cursor(row_factory=tuple_row) as cur:
        return cur.execute("SELECT current_setting(%s)", (name,)).fetchone()[0]


def _set(conn: psycopg.Connection, name: str, value: str) -> None:
    conn.execute("SELECT set_config(%s, %s, false)", (name, value))


def _millis(seconds: float) -> str:
    return f"{max(int(seconds * 1000), 1)}ms"


def _try_lock(conn: psycopg.Connection) -> bool:
    with conn.cursor(row_factory=tuple_row) as cur:
        return cur.execute("SELECT pg_try_advisory_lock(%s)", (_LOCK_KEY,)).fetchone()[0]


def _lock_holder(conn: psycopg.Connection) -> str:
    with conn.cursor(row_factory=tuple_row) as cur:
        holder = cur.execute(
            """
            SELECT l.pid, coalesce(nullif(a.application_name, ''), 'no application_name')
            FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid
            WHERE l.locktype = 'advisory' AND l.granted
              AND l.objid = (%(key)s::bigint & 4294967295)::oid
              AND l.classid = ((%(key)s::bigint >> 32) & 4294967295)::oid
            """,
            {"key": _LOCK_KEY},
        ).fetchone()
    return f"pid {holder[0]}, {holder[1]!r}" if holder else "a session that just ended"


def _take_lock(conn: psycopg.Connection, report: Report) -> None:
    """The migration lock; says who holds it when this process has to wait.

    Polled rather than waited for in one statement: a statement waiting for the lock is a
    transaction with a snapshot, and the holder's ``CREATE INDEX CONCURRENTLY`` waits for every
    older snapshot to go, which would be a deadlock.
    """
    if _try_lock(conn):
        return
    report(f"another migration is running ({_lock_holder(conn)}); waiting for it to finish")
    attempt = 0
    while not _try_lock(conn):
        attempt += 1
        time.sleep(backoff.backoff_seconds(min(attempt, 4), 0.1, 1.0))


class _Runner:
    """Applies pending migrations on one autocommit connection, retrying lock timeouts."""

    def __init__(
        self, conn: psycopg.Connection, policy: LockPolicy, report: Report, watch: LockWatch
    ) -> None:
        self.conn = conn
        self.policy = policy
        self.report = report
        self.watch = watch
        self.lock_timeouts = 0

    def apply(self, migration: Migration) -> None:
        record = (migration.version, migration.name, checksum(migration.text))
        if migration.transactional:

            def whole_file() -> None:
                with self.conn.transaction():
                    self.conn.execute(migration.text.encode("utf-8"))
                    self.conn.execute(_RECORD, record)

            self._retrying(migration.name, whole_file)
            return
        for number, statement in enumerate(migration.statements, start=1):
            where = f"{migration.name}, statement {number} of {len(migration.statements)}"
            self._retrying(where, lambda statement=statement: self._one_statement(statement))
        self.conn.execute(_RECORD, record)

    def _one_statement(self, statement: str) -> None:
        index = concurrent_index_name(statement)
        if index is not None:
            self._drop_invalid_index(index)
        self.conn.execute(statement.encode("utf-8"))

    def _drop_invalid_index(self, name: str) -> None:
        """An interrupted ``CREATE INDEX CONCURRENTLY`` leaves an invalid index behind, which
        ``IF NOT EXISTS`` would keep: drop it so the build starts over."""
        with self.conn.cursor(row_factory=tuple_row) as cur:
            found = cur.execute(
                "SELECT NOT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", (name,)
            ).fetchone()
        if found and found[0]:
            self.report(f"dropping the invalid index {name} left by an interrupted build")
            self.conn.execute(
                sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(name))
            )

    def _retrying(self, where: str, action: Callable[[], None]) -> None:
        deadline = time.monotonic() + self.policy.max_wait_seconds
        attempt = 0
        while True:
            self.watch.forget()
            try:
                action()
                return
            except psycopg.errors.LockNotAvailable:
                attempt += 1
                self.lock_timeouts += 1
            except psycopg.Error as exc:
                raise RuntimeFailure(f"{where} failed: {first_line(exc)}") from None
            seen = self.watch.latest()
            why = seen.describe() if seen is not None else "waited for a lock"
            delay = backoff.backoff_seconds(
                attempt, self.policy.retry_base_seconds, self.policy.retry_cap_seconds
            )
            if time.monotonic() + delay > deadline:
                raise RuntimeFailure(
                    f"{where}: gave up after {attempt} lock timeout(s) over "
                    f"{self.policy.max_wait_seconds:g} s; last {why}. End that session "
                    "(or let it finish) and run `media-hooks db migrate` again"
                )
            self.report(
                f"{where}: {why}; gave up after the {self.policy.lock_timeout_seconds:g} s lock "
                f"timeout so nothing queues behind it; retrying in {delay:.1f} s "
                f"(attempt {attempt + 1})"
            )
            time.sleep(delay)


def _watch(conn: psycopg.Connection, policy: LockPolicy) -> LockWatch:
    params = {"password": conn.info.password} if conn.info.password else {}
    target = conninfo.make_conninfo(conn.info.dsn, **params)
    interval = min(0.25, policy.lock_timeout_seconds / 4)
    return LockWatch(target, conn.info.backend_pid, interval)


def _still_used(conn: psycopg.Connection, migration: Migration) -> str | None:
    """For a contract migration, the sessions of releases that do not know it, in words; None
    when none is connected (or it is not a contract migration)."""
    if not migration.contract:
        return None
    earlier = sessions.before(sessions.connected(conn), migration.version)
    return sessions.describe(earlier) if earlier else None


def _waiting(migration: Migration, waiting_for: str) -> str:
    return (
        f"{migration.name} removes what releases before it use, and waits while their "
        f"sessions are connected: {waiting_for}. This release runs without it; run "
        "`media-hooks db migrate` again once they have gone (--previous-release-gone if they "
        "have, under other application_names)"
    )


def _note_converging(applied: dict[int, tuple[str, str]], files: list[Migration], report: Report):
    manifest = released_manifest()
    for migration in files:
        released = manifest.get(migration.name)
        entry = applied.get(migration.version)
        if released and entry and entry[1] in released.accepted:
            report(
                f"{migration.name} was applied in an earlier, since edited version; "
                f"{released.converged_by or 'a later migration'} brings it up to date"
            )


def migrate(
    conn: psycopg.Connection,
    *,
    policy: LockPolicy | None = None,
    report: Report | None = None,
    up_to: int | None = None,
    previous_release_gone: bool = False,
) -> MigrationResult:
    """Apply every pending migration (up to version ``up_to``). ``conn`` must be in autocommit
    mode. ``report`` receives progress lines: waits for locks, retries, cleanups, and a
    contract migration left pending while sessions of the releases before it are connected
    (with it, the migrations after it). ``previous_release_gone`` applies it anyway: the
    operator says those releases are gone (their sessions named themselves otherwise)."""
    policy = policy or LockPolicy()
    report = report or (lambda line: None)
    saved = {
        name: _setting(conn, name)
        for name in ("lock_timeout", "statement_timeout", "application_name")
    }
    _set(conn, "application_name", APPLICATION_NAME)
    _set(conn, "lock_timeout", "0")
    _take_lock(conn, report)
    try:
        conn.execute(_CREATE_LEDGER)
        applied = _applied(conn)
        files = _checked_files(applied)
        pending = [
            m for m in files if m.version not in applied and (up_to is None or m.version <= up_to)
        ]
        if not pending:
            return MigrationResult(applied=[], already_applied=len(applied))
        _note_converging(applied, files, report)
        _set(conn, "lock_timeout", _millis(policy.lock_timeout_seconds))
        _set(conn, "statement_timeout", _millis(policy.statement_timeout_seconds))
        done: list[str] = []
        waiting_for = None
        with _watch(conn, policy) as watch:
            runner = _Runner(conn, policy, report, watch)
            for migration in pending:
                waiting_for = None if previous_release_gone else _still_used(conn, migration)
                if waiting_for is not None:
                    report(_waiting(migration, waiting_for))
                    break
                runner.apply(migration)
                done.append(migration.name)
        return MigrationResult(
            applied=done,
            already_applied=len(applied),
            lock_timeouts=runner.lock_timeouts,
            deferred=[m.name for m in pending[len(done) :]],
            waiting_for=waiting_for,
        )
    finally:
        if not (conn.closed or conn.broken):
            # (A lost connection released the lock with its session.)
            conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
            for name, value in saved.items():
                _set(conn, name, value)


def require_current(conn: psycopg.Connection) -> list[str]:
    """Refuse to run on a missing, older or diverged schema, naming the fix. Contract
    migrations still pending at the end (this release runs with or without them) are not
    missing: their names are returned."""
    applied = _applied(conn)
    files = _checked_files(applied)
    pending = [m for m in files if m.version not in applied]
    deferred = []
    while pending and pending[-1].contract and applied:
        deferred.insert(0, pending.pop().name)
    if not pending:
        return deferred
    if not applied:
        raise RuntimeFailure("the database has no media_hooks schema: run `media-hooks db migrate`")
    fix = "run `media-hooks db migrate`"
    held = next((m for m in pending if m.contract), None)
    if held is not None:
        # This release's own migrations come after a contract migration still waiting.
        fix += (
            f", which applies {held.name} and those after it once no session of a release "
            "before it is connected"
        )
    names = ", ".join(m.name for m in pending)
    raise RuntimeFailure(f"the database has pending migrations ({names}): {fix}")
