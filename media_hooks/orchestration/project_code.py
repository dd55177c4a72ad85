"""The project's own code in a fork server: loaded once, kept by each child while current.

The warm run server (``run_server``) and the run launcher's zygote fork a child per run. A
child that imports the run's code itself (the command line, the definitions, the ops, the
engine) spends 0.1-0.2 s of CPU on it before its first delivery. So the server loads that code
with Dagster (``load``), and each child keeps it (``keep_or_forget``) when it is what the
child would import now:

- the package its import path finds is the one the server loaded;
- no file in it changed (each file's path, size and modification time, the SQL included);
- the variables the project reads as it loads (``LOAD_TIME_VARIABLES``) have the values they
  had then.

Otherwise the child drops the project's modules and imports them afresh, as a child of a
server that loaded none: a changed checkout, or a definitions reload in ``media-hooks dev``,
still reaches the next run. Comparing costs about a millisecond.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass

PACKAGE = "media_hooks"
# What a delivery run imports: `media-hooks run` (the command and its supervision), and the
# definitions (every job's ops, the engine under them) a launched run is rebuilt from.
RUN_MODULES = (
    "media_hooks.cli",
    "media_hooks.cli.run_commands",
    "media_hooks.cli.supervision",
    "media_hooks.orchestration.definitions",
)
# Read by the project's modules while they load (the schedules' timezone is part of their
# definitions). media_hooks_tests/orchestration/test_project_code.py checks that no other is.
LOAD_TIME_VARIABLES = ("MEDIA_HOOKS_SCHEDULE_TIMEZONE",)


@dataclass(frozen=True)
class Sources:
    """What a load of the project came from."""

    folder: str | None
    files: frozenset[tuple[str, int, int]]
    variables: tuple[str | None, ...]


_loaded: Sources | None = None


def _package_folder() -> str | None:
    """The package folder this process's import path finds now, whatever is loaded."""
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        spec = find_spec(PACKAGE, None) if find_spec is not None else None
        if spec is not None and spec.submodule_search_locations:
            return os.path.realpath(next(iter(spec.submodule_search_locations)))
    return None


def _files(folder: str) -> frozenset[tuple[str, int, int]]:
    found = set()
    # followlinks: media_hooks/sql links to the repository's sql/ folder.
    for parent, folders, names in os.walk(folder, followlinks=True):
        folders[:] = [name for name in folders if name != "__pycache__"]
        for name in names:
            path = os.path.join(parent, name)
            try:
                stat = os.stat(path)
            except FileNotFoundError:
                continue  # removed meanwhile (an editor's save), or a dangling link
            found.add((os.path.relpath(path, folder), stat.st_size, stat.st_mtime_ns))
    return frozenset(found)


def current() -> Sources:
    folder = _package_folder()
    return Sources(
        folder=folder,
        files=_files(folder) if folder is not None else frozenset(),
        variables=tuple(os.environ.get(name) for name in LOAD_TIME_VARIABLES),
    )


def load() -> None:
    """Imports the run's code into this (server) process and remembers what it came from.

    Code that fails to load (a checkout mid-edit, a setting its definitions refuse) is left
    unloaded, not raised: the server still starts, and each run imports the code itself and
    fails, or not, as it would in a process of its own."""
    global _loaded
    sources = current()
    try:
        for name in RUN_MODULES:
            importlib.import_module(name)
    except Exception:  # noqa: BLE001 - whatever the code raises, it is the runs' to report
        _forget()
        return
    _loaded = sources


def keep_or_forget() -> None:
    """In a forked child, once it has its caller's import path and environment: keeps the
    loaded project if it is what would be imported now, else drops it."""
    if _loaded is None or current() != _loaded:
        _forget()


def _forget() -> None:
    """Drops the project's modules: the next import loads them from their files."""
    for name in [n for n in sys.modules if n == PACKAGE or n.startswith(f"{PACKAGE}.")]:
        del sys.modules[name]
