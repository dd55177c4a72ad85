"""Who is connected: media_hooks's sessions, by release and role.

Every connection of a release names itself ``media_hooks:<role>:g<generation>`` in
``application_name`` (``media_hooks.store.db``), the generation being the version of the
release's newest migration (``sqlfiles.generation``); releases before generation 30 named the
role alone. ``pg_stat_activity`` shows that name to every role, so the sessions of two releases
connected during a rolling upgrade can be told apart: ``status`` and ``metrics`` count them,
and ``db migrate`` waits with a contract migration until no session of a release that does not
know it is left (``media_hooks.store.migrations``). A session whose URL set another
``application_name`` does not say whose it is, and is not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg.rows import tuple_row

from media_hooks.store.sqlfiles import generation, query

PREFIX = "media_hooks:"


def session_name(role: str) -> str:
    """What a session of this release in ``role`` calls itself."""
    return f"{PREFIX}{role}:g{generation()}"


@dataclass(frozen=True)
class SessionName:
    """A media_hooks session's name, read back: its role, and its release's generation (None
    for a release from before generations were named)."""

    role: str
    generation: int | None


def parse_session_name(name: str) -> SessionName | None:
    """``name`` as ``session_name`` (or an earlier release) writes it; None when it is not one."""
    if not name.startswith(PREFIX):
        return None
    role, _, named = name.removeprefix(PREFIX).partition(":")
    if not role:
        return None
    if not named:
        return SessionName(role, None)
    if named[:1] != "g" or not named[1:].isdigit():
        return None
    return SessionName(role, int(named[1:]))


def connected(conn: psycopg.Connection) -> dict[int | None, dict[str, int]]:
    """The other media_hooks sessions connected to this database: generation -> role -> count."""
    found: dict[int | None, dict[str, int]] = {}
    with conn.cursor(row_factory=tuple_row) as cur:
        for application_name, n in cur.execute(query("sessions_by_name")).fetchall():
            name = parse_session_name(application_name)
            if name is not None:
                roles = found.setdefault(name.generation, {})
                roles[name.role] = roles.get(name.role, 0) + n
    return found


def earlier(generation: int | None, than: int) -> bool:
    """Whether a release of ``generation`` predates migration ``than`` (one that named no
    generation predates every one that does)."""
    return generation is None or generation < than


def oldest_first(generation: int | None) -> int:
    """A sort key: releases from the oldest (unnamed) to the newest."""
    return -1 if generation is None else generation


def label(generation: int | None) -> str:
    """``g27``, or ``generation unnamed``."""
    return "generation unnamed" if generation is None else f"g{generation}"


def before(
    found: dict[int | None, dict[str, int]], version: int
) -> dict[int | None, dict[str, int]]:
    """The sessions of ``found`` whose release does not know migration ``version``."""
    return {g: roles for g, roles in found.items() if earlier(g, version)}


def describe(found: dict[int | None, dict[str, int]]) -> str:
    """``found`` in words: ``worker 2 (generation unnamed); sweeps 1 (g27)``."""
    return "; ".join(
        ", ".join(f"{role} {n}" for role, n in found[g].items()) + f" ({label(g)})"
        for g in sorted(found, key=oldest_first)
    )
