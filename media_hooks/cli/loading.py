"""Loading a command's code without the cyclic garbage collector.

Importing Dagster and opening its storage makes hundreds of thousands of objects that live as
long as the process; the collector runs many times while they are made and finds nothing to
free: about a fifth of the time `media-hooks run` spends before its first delivery. Paused
while they load and frozen afterwards, they also stay out of every later collection.

Only in a process of the command's own (the console script, ``python -m media_hooks.cli``):
a program that calls ``main(argv)`` keeps its collector as it was.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_own_process = False


def own_process() -> None:
    """The command runs in a process of its own, so what it loads may stay frozen."""
    global _own_process
    _own_process = True


@contextmanager
def collector_paused() -> Iterator[None]:
    """Imports and one-time setup inside run without collections; what they made is then
    frozen (kept out of later collections) and the collector resumes as it was."""
    if not _own_process:
        yield
        return
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
