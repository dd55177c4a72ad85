"""An asyncio event loop on a thread of its own: where a delivery run's requests wait.

A run has tens of destinations and hundreds of requests in flight, most of them waiting on a
slow receiver. Waiting in an event loop costs one ``epoll`` wake-up per answer; waiting in a
thread per request cost a GIL hand-over at every socket call, several per request, which on
two CPUs was a third of the run's CPU time (the CPU report of commit 18849cf, in git history
under bench/results/cpu-529c251). The destinations'
workers stay threads (each holds its database connection and blocks on it) and hand their
requests to the loop with ``submit``, which any thread may call.

A run starts its loop where its threads start, so that the loop's thread inherits the run's
CPU (media_hooks.core.affinity), and closes it once every worker has ended.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop where it is installed (every platform but Windows), else asyncio's own.

    On fifty slow publishers, in alternating runs of the same hour, a delivery cost 5-9% less
    of the machine's CPU on uvloop; where that CPU decided the rate, uvloop reached 0.88 of the
    sum of the limits against asyncio's 0.81 (paired runs of commit 8b1768c, in git history under
    bench/results/paired-uvloop-2026-12-04).
    """
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class SendLoop:
    """An event loop running in a daemon thread until ``close``."""

    def __init__(self, name: str = "send-loop") -> None:
        self._loop = new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> Future[T]:
        """Run ``coroutine`` on the loop; its future is the only strong reference to it that
        the caller needs to keep (the loop itself holds tasks weakly)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop and wait for its result."""
        return self.submit(coroutine).result()

    def close(self) -> None:
        """Stop the loop and its thread; idempotent. Requests still running are abandoned,
        so callers wait for theirs first."""
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        # DNS lookups ran in the loop's default executor: its threads end here too.
        self._loop.run_until_complete(self._loop.shutdown_default_executor())
        self._loop.close()

    def __enter__(self) -> SendLoop:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
