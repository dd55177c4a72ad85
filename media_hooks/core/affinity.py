"""One CPU for a delivery's threads (``MEDIA_HOOKS_DELIVERY_CPU``).

CPython runs one thread at a time, and delivery threads hand that turn over at every socket
and database wait, several times per request. When the threads are spread over several CPUs,
each hand-over wakes a thread on another CPU. Against a fast receiver that costs about as much
CPU as the requests themselves. On 2 CPUs, ``bench/http_send.py`` measured four threads
sharing a sender at 2,060 requests/s spread out and 3,110/s on one CPU, and
The delivery benchmark (``python -m bench``) measured a run at about 900 deliveries/s unpinned and 1,100-1,500 pinned.
On one CPU the hand-overs stay local. The process gives up only what CPython does outside the
interpreter in parallel (TLS, libpq), which is what ``off`` is for.

Only a delivery's own threads are pinned, and only while it runs: the calling thread gets its
affinity back afterwards, and threads it started before keep theirs. ``auto`` pins a delivery
that runs several destinations (or batches) in one process (the engine's ``deliver_due`` and the
job's delivery step) to the CPU it started on, where the scheduler placed it. It leaves a lone
one alone: processes that each deliver one destination at once (overlapping runs, the
multiprocess executor's steps), fixed each to one CPU, cannot even out when the CPUs are
oversubscribed (the former ``bench/dagster_overhead.py``: 600/s pinned against 750/s left to
the scheduler). A CPU number pins both.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from media_hooks.core.errors import UserError

AUTO = "auto"
OFF = "off"
ENV = "MEDIA_HOOKS_DELIVERY_CPU"


def parse(raw: str | None) -> str:
    """The setting as given: ``auto`` (default), ``off`` or a CPU this process may run on.

    Checked when the configuration is read, so a command refuses it before it claims anything.
    """
    value = (raw or AUTO).strip().lower()
    if value in (AUTO, OFF):
        return value
    if not value.isdigit():
        raise UserError(f"{ENV} must be 'auto', 'off' or a CPU number, got {raw!r}")
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    if int(value) not in allowed:
        raise UserError(f"{ENV}={value} is not a CPU this process may run on: {sorted(allowed)}")
    return value


def resolve(setting: str, *, batches: int) -> int | None:
    """The CPU a delivery of ``batches`` batches in this process runs its threads on, or None
    to leave them where they are."""
    if setting == OFF or not hasattr(os, "sched_setaffinity"):
        return None
    allowed = os.sched_getaffinity(0)
    if setting == AUTO:
        if batches < 2 or len(allowed) < 2:
            return None  # a lone batch, or already on one CPU (an enclosing delivery's)
        current = _current_cpu()
        return current if current in allowed else min(allowed)
    # Checked by parse; should the CPU have gone since, pinned() leaves the threads be.
    return int(setting)


def _current_cpu() -> int | None:
    try:
        with open("/proc/thread-self/stat") as stat:
            # Field 39, "processor"; the fields after the command name start at field 3.
            return int(stat.read().rsplit(")", 1)[1].split()[36])
    except (OSError, IndexError, ValueError):
        return None


@contextmanager
def pinned(cpu: int | None) -> Iterator[None]:
    """Run the block, and every thread started inside it, on ``cpu`` (None: unchanged)."""
    if cpu is None:
        yield
        return
    # On Linux, pid 0 is the calling thread: other threads of the process are untouched.
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {cpu})
    except OSError:
        # A container may forbid it, or the CPU went offline: pinning only saves CPU time,
        # so the delivery goes ahead where it is.
        yield
        return
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
