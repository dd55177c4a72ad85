"""The SQL of ``sql/``: migrations in order, and the state machine's statements by name.

Statements live in ``sql/queries/*.sql`` as blocks headed ``-- name: query_name`` (and a
``-- description`` line); Python never builds SQL strings, it calls statements by name with
named parameters. ``media_hooks/sql`` links to the top-level ``sql/`` folder, and the wheel
ships the files inside the package, so both a checkout and an installed wheel find them.

Migrations are ``sql/migrations/NNNN_name.sql``; ``sql/migrations/manifest.toml`` holds the
checksums of the released ones. A migration whose leading comment block has the line
``-- migrate: no-transaction`` is applied statement by statement outside a transaction (for
``CREATE INDEX CONCURRENTLY`` and validating a constraint apart from adding it); every one of
its statements must be idempotent, since an interrupted run starts the file again. One with
``-- migrate: contract`` removes what only earlier releases use: ``db migrate`` applies it once
no session of a release that does not know it is connected, and until then this release runs
without it (``media_hooks.store.migrations``).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable

_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
_MIGRATION = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")
_DIRECTIVES = ("no-transaction", "contract")
_DIRECTIVE = re.compile(r"^--\s*migrate:\s*(.*?)\s*$")
# CREATE [UNIQUE] INDEX CONCURRENTLY IF NOT EXISTS name ...: the name is what a retry cleans up.
_CONCURRENT_INDEX = re.compile(
    r"^CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+(IF\s+NOT\s+EXISTS\s+)?(?!ON\b)([a-z_][a-z0-9_]*)?",
    re.IGNORECASE,
)
# A dollar-quote tag: $$ or $tag$ (a tag cannot start with a digit: $1 is a parameter).
_DOLLAR_TAG = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*)?\$")


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


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    text: str
    # False: applied statement by statement outside a transaction (``-- migrate: no-transaction``).
    transactional: bool
    statements: tuple[str, ...]
    # True: it removes what only releases before it use (``-- migrate: contract``), and waits
    # until none of their sessions is connected (``media_hooks.store.migrations``).
    contract: bool = False


def load_migrations() -> list[Migration]:
    """Every migration, in version order, with its directives read."""
    return list(_loaded_migrations())


@cache
def _loaded_migrations() -> tuple[Migration, ...]:
    # The files ship with the code: read and split once per process, not on every check that
    # the schema is current (a delivery run makes several).
    return tuple(migration(version, name, text) for version, name, text in migrations())


def generation() -> int:
    """This release's schema generation: the version of its newest migration. Its sessions
    name it (``media_hooks.store.sessions``)."""
    return _loaded_migrations()[-1].version


def migration(version: int, name: str, text: str) -> Migration:
    """A migration file's text with its directives read (ValueError for a malformed one)."""
    directives = set()
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if not stripped.startswith("--"):
            break  # directives live in the leading comment block only
        directive = _DIRECTIVE.match(stripped)
        if directive is None:
            continue
        if directive.group(1) not in _DIRECTIVES:
            raise ValueError(f"{name}: unknown directive {directive.group(1)!r}")
        directives.add(directive.group(1))
    transactional = "no-transaction" not in directives
    statements = tuple(split_statements(text))
    if not transactional:
        for statement in statements:
            index = _CONCURRENT_INDEX.match(statement)
            if index is not None and not (index.group(1) and index.group(2)):
                raise ValueError(
                    f"{name}: a concurrent index build must be `CREATE INDEX CONCURRENTLY IF NOT "
                    "EXISTS name ...`, so that a retry after an interruption is idempotent"
                )
    return Migration(version, name, text, transactional, statements, "contract" in directives)


def concurrent_index_name(statement: str) -> str | None:
    """The index a ``CREATE INDEX CONCURRENTLY IF NOT EXISTS name`` statement builds."""
    index = _CONCURRENT_INDEX.match(statement)
    return index.group(2) if index is not None else None


def split_statements(text: str) -> list[str]:
    """The SQL statements of ``text``, in order, without their trailing ``;``.

    Knows comments (``--``, nested ``/* */``), quoted strings and identifiers, escape strings
    (``E'...'``) and dollar quotes (function bodies), so a ``;`` inside any of them does not
    end a statement. Statements that are only comments are dropped.
    """
    statements: list[str] = []
    start = i = 0
    n = len(text)
    meaningful = False  # the current statement holds more than comments and whitespace
    while i < n:
        ch = text[i]
        if ch == "-" and text.startswith("--", i):
            end = text.find("\n", i)
            i = n if end < 0 else end + 1
            continue
        if ch == "/" and text.startswith("/*", i):
            i = _block_comment_end(text, i)
            continue
        if ch == ";":
            if meaningful:
                statements.append(_without_comments_around(text[start:i]))
            start, i, meaningful = i + 1, i + 1, False
            continue
        if not ch.isspace():
            meaningful = True
        if ch in "'\"":
            escapes = ch == "'" and i > 0 and text[i - 1] in "Ee" and _starts_word(text, i - 1)
            i = _quoted_end(text, i, ch, escapes)
            continue
        if ch == "$":
            tag = _DOLLAR_TAG.match(text, i)
            if tag is not None and not (i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")):
                end = text.find(tag.group(0), tag.end())
                if end < 0:
                    raise ValueError(f"unterminated dollar quote {tag.group(0)}")
                i = end + len(tag.group(0))
                continue
        i += 1
    if meaningful:
        statements.append(_without_comments_around(text[start:]))
    return statements


def _starts_word(text: str, i: int) -> bool:
    return i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")


def _block_comment_end(text: str, i: int) -> int:
    depth = 0
    while i < len(text):
        if text.startswith("/*", i):
            depth, i = depth + 1, i + 2
        elif text.startswith("*/", i):
            depth, i = depth - 1, i + 2
            if depth == 0:
                return i
        else:
            i += 1
    raise ValueError("unterminated /* comment")


def _quoted_end(text: str, i: int, quote: str, escapes: bool) -> int:
    i += 1
    while i < len(text):
        ch = text[i]
        if escapes and ch == "\\":
            i += 2
            continue
        if ch == quote:
            if text.startswith(quote * 2, i):
                i += 2  # a doubled quote stands for itself
                continue
            return i + 1
        i += 1
    raise ValueError(f"unterminated {quote} quote")


def _without_comments_around(statement: str) -> str:
    """The statement without the comment lines before it (what it does, for messages)."""
    lines = statement.strip().splitlines()
    while lines and (not lines[0].strip() or lines[0].lstrip().startswith("--")):
        lines.pop(0)
    return "\n".join(lines).strip()


@dataclass(frozen=True)
class Released:
    """A released migration's checksum, and older checksums a database may have applied."""

    sha256: str
    accepted: frozenset[str] = frozenset()
    converged_by: str | None = None


def manifest() -> dict[str, Released]:
    """``sql/migrations/manifest.toml``: file name -> its released checksum(s)."""
    text = sql_root().joinpath("migrations", "manifest.toml").read_text(encoding="utf-8")
    entries = tomllib.loads(text).get("migrations", {})
    return {
        name: Released(
            sha256=entry["sha256"],
            accepted=frozenset(a["sha256"] for a in entry.get("accepted", [])),
            converged_by=entry.get("converged_by"),
        )
        for name, entry in entries.items()
    }


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
