"""``media-hooks db migrate``."""

from __future__ import annotations

import argparse

from media_hooks import db, migrations
from media_hooks.cli.output import print_json
from media_hooks.config import Settings


def register(commands: argparse._SubParsersAction) -> None:
    group = commands.add_parser("db", help="database schema")
    sub = group.add_subparsers(dest="db_command", required=True, parser_class=type(group))
    migrate = sub.add_parser("migrate", help="apply the schema migrations (idempotent)")
    migrate.add_argument("--json", action="store_true", help="print one JSON document")
    migrate.set_defaults(handler=run_migrate)


def run_migrate(args: argparse.Namespace) -> int:
    url = db.resolve_url(Settings.from_env())
    with db.connect(url, autocommit=True, role=db.Role.MIGRATION) as conn:
        result = migrations.migrate(conn)
    if args.json:
        print_json({"applied": result.applied, "already_applied": result.already_applied})
    elif result.applied:
        print(f"applied {len(result.applied)} migration(s): {', '.join(result.applied)}")
    else:
        print(f"schema is current ({result.already_applied} migration(s) applied)")
    return 0
