"""``media-hooks db migrate``."""

from __future__ import annotations

import argparse
import sys

from media_hooks import db, migrations, numeric
from media_hooks.cli.output import print_json
from media_hooks.config import Settings

MIGRATE_DESCRIPTION = """\
Applies the pending migrations of sql/migrations in order, under an advisory lock (safe to run
concurrently, idempotent). No statement waits longer than --lock-timeout for a lock, so producers
and workers never queue behind the migration for longer than that: a statement that times out is
rolled back and tried again with backoff, and each wait is reported on stderr with what it waited
for (the relation, and the sessions holding it: pid, application_name, how long idle). A released
migration whose file changed is refused (sql/migrations/manifest.toml holds their checksums)."""


def register(commands: argparse._SubParsersAction) -> None:
    group = commands.add_parser("db", help="database schema")
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
    migrate.add_argument("--json", action="store_true", help="print one JSON document")
    migrate.set_defaults(handler=run_migrate)


def _progress(line: str) -> None:
    print(f"media-hooks: {line}", file=sys.stderr, flush=True)


def run_migrate(args: argparse.Namespace) -> int:
    policy = migrations.LockPolicy(
        lock_timeout_seconds=args.lock_timeout,
        max_wait_seconds=args.max_wait,
        statement_timeout_seconds=args.statement_timeout,
    )
    url = db.resolve_url(Settings.from_env())
    with db.connect(url, autocommit=True) as conn:
        result = migrations.migrate(conn, policy=policy, report=_progress)
    if args.json:
        print_json(
            {
                "applied": result.applied,
                "already_applied": result.already_applied,
                "lock_timeouts": result.lock_timeouts,
            }
        )
    elif result.applied:
        print(f"applied {len(result.applied)} migration(s): {', '.join(result.applied)}")
    else:
        print(f"schema is current ({result.already_applied} migration(s) applied)")
    return 0
