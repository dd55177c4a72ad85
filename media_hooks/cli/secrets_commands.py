"""``media-hooks secrets status | rekey | generate-key``: signing secrets at rest."""

from __future__ import annotations

import argparse

from media_hooks.cli.output import print_json, table
from media_hooks.outbox import destinations
from media_hooks.store import db
from media_hooks.store.secret_store import ENV, SecretBox, generate_key

DESCRIPTION = f"""\
Signing secrets are stored encrypted when {ENV} holds a key (Fernet; several keys
comma-separated: the first encrypts, all decrypt), and as they are when it is unset. To start
encrypting: set the key, then `rekey`. To rotate the key: put the new key first and the old one
after it, `rekey`, then drop the old key. `rekey --plaintext` stores them as given again (before
rolling back to a version without encryption)."""


def register(commands: argparse._SubParsersAction) -> None:
    group = commands.add_parser(
        "secrets",
        help="signing secrets at rest: status, re-encryption, keys",
        description=DESCRIPTION,
    )
    sub = group.add_subparsers(dest="secrets_command", required=True, parser_class=type(group))

    status = sub.add_parser("status", help="how each destination's secrets are stored (never them)")
    status.add_argument("--json", action="store_true", help="print one JSON document")
    status.set_defaults(handler=run_status)

    rekey = sub.add_parser(
        "rekey", help=f"store every secret again, encrypted under the first key of {ENV}"
    )
    rekey.add_argument(
        "--plaintext", action="store_true", help="store them as given instead (decrypt them all)"
    )
    rekey.add_argument(
        "--dry-run", action="store_true", help="check every secret opens; change nothing"
    )
    rekey.add_argument("--json", action="store_true", help="print one JSON document")
    rekey.set_defaults(handler=run_rekey)

    key = sub.add_parser("generate-key", help=f"print a new random key for {ENV}")
    key.set_defaults(handler=run_generate_key)


def run_status(args: argparse.Namespace) -> int:
    box = SecretBox.from_env()
    with db.connect(db.ready_url(), autocommit=True) as conn:
        inventory = destinations.secret_inventory(conn, box)
    if args.json:
        print_json({"setting": box.describe(), "keys": len(box.keys), "destinations": inventory})
        return 0
    print(box.describe())
    if not inventory:
        print("no destination has signing secrets")
        return 0
    rows = [
        [
            entry["destination_id"],
            entry["as_given"],
            ", ".join(f"key {n}: {count}" for n, count in entry["encrypted_by_key"].items()) or "-",
            entry["encrypted_by_no_configured_key"],
        ]
        for entry in inventory
    ]
    print(table(["destination", "as given", "encrypted", "under no configured key"], rows))
    return 0


def run_rekey(args: argparse.Namespace) -> int:
    box = SecretBox.from_env()
    with db.connect(db.ready_url(), autocommit=True) as conn:
        result = destinations.rekey_secrets(
            conn, box, to_plaintext=args.plaintext, dry_run=args.dry_run
        )
    if args.json:
        print_json(
            {
                "dry_run": args.dry_run,
                "plaintext": args.plaintext,
                "destinations": result.destinations,
                "secrets": result.secrets,
                "were_plaintext": result.were_plaintext,
            }
        )
        return 0
    how = (
        "as given (not encrypted)" if args.plaintext else f"encrypted under the first key of {ENV}"
    )
    verb = "would store" if args.dry_run else "stored"
    print(
        f"{verb} {result.secrets} secret(s) of {result.destinations} destination(s) {how} "
        f"({result.were_plaintext} were stored as given before)"
    )
    return 0


def run_generate_key(args: argparse.Namespace) -> int:
    print(generate_key())
    return 0
