"""The SQL of ``sql/``: migrations in order, and the state machine's statements by name.

Statements live in ``sql/queries/*.sql`` as blocks headed ``-- name: query_name`` (and a
``-- description`` line); Python never builds SQL strings, it calls statements by name with
named parameters. ``media_hooks/sql`` links to the top-level ``sql/`` folder, and the wheel
ships the files inside the package, so both a checkout and an installed wheel find them.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable

_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
_MIGRATION = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


def sql_root() -> Traversable:
    return resources.files("media_hooks.sql")


def migrations() -> list[tuple[int, str, str]]:
    """(version, file name, text) of every migration, in version order."""
    found = []
    for entry in sql_root().joinpath("migrations").iterdir():
        match = _MIGRATION.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry.name, entry.read_text(encoding="utf-8")))
    found.sort()
    versions = [version for version, _, _ in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"two migrations share a version number: {sorted(versions)}")
    return found


def parse_queries(text: str) -> dict[str, str]:
    """Split a queries file into {name: statement}."""
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise RuntimeError(f"query {name!r} is defined twice")
        queries[name] = body.strip().rstrip(";")
    return queries


@cache
def queries() -> dict[str, str]:
    merged: dict[str, str] = {}
    folder = sql_root().joinpath("queries")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        for name, statement in parse_queries(entry.read_text(encoding="utf-8")).items():
            if name in merged:
                raise RuntimeError(f"query {name!r} is defined in two files")
            merged[name] = statement
    return merged


def query(name: str) -> str:
    return queries()[name]
