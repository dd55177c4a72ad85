"""Identifiers users choose: ``delivery_id`` and destination ids (docs/contract.md, "Identifiers").

1–200 characters of ASCII letters, digits, ``_``, ``-`` and ``:``. No ``.``: Standard Webhooks
reserves it. The schema holds the same rule as a check constraint; checking here first turns a
mistake into one clear line instead of a database error.
"""

from __future__ import annotations

import re

from media_hooks.core.errors import UserError

MAX_IDENTIFIER_LENGTH = 200
_ALLOWED = re.compile(r"[A-Za-z0-9_:-]+")
_FIRST_BAD = re.compile(r"[^A-Za-z0-9_:-]")


def validate_identifier(value: object, what: str) -> str:
    """``value`` if it is a valid identifier, else UserError naming ``what`` and why."""
    if not isinstance(value, str):
        raise UserError(f"{what} must be a string, got {type(value).__name__}")
    if not value:
        raise UserError(f"{what} must not be empty")
    if len(value) > MAX_IDENTIFIER_LENGTH:
        raise UserError(
            f"{what} is {len(value)} characters long; at most {MAX_IDENTIFIER_LENGTH} are allowed"
        )
    if not _ALLOWED.fullmatch(value):
        bad = _FIRST_BAD.search(value)
        char = bad.group(0) if bad else "?"
        raise UserError(
            f"{what} {value!r} contains {char!r}: only letters, digits, '_', '-' and ':' "
            "are allowed ('.' is reserved by Standard Webhooks)"
        )
    return value
