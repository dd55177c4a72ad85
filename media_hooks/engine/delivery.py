"""A run's deliveries: each destination's worker in a thread of its own, every request of the
run waiting on one event loop.

``deliver_destinations`` is what a delivery step and ``delivery_run.deliver_due`` call: each
destination claims its own pages as its worker runs out (round-robin: none waits behind
another's backlog), at most ``max_rows`` rows in all, and a slow or rate-limited destination
never holds up another. ``deliver_pages`` runs one worker over any source of pages in the
calling thread.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import ExitStack, contextmanager
from typing import TypeVar

from psycopg_pool import ConnectionPool

from media_hooks.core import affinity
from media_hooks.core.config import Settings
from media_hooks.engine.counts import DeliveryCounts, DestinationResult
from media_hooks.engine.pages import DuePages, Pages, RowBudget
from media_hooks.engine.worker import DEFAULT_MAX_WAIT_SECONDS, DestinationWorker
from media_hooks.http.send_loop import SendLoop
from media_hooks.outbox.cohort import Cohort
from media_hooks.store import db

T = TypeVar("T")


def deliver_pages(
    pool: ConnectionPool,
    run_id: str,
    pages: Pages,
    settings: Settings,
    *,
    max_wait_seconds: float = DEFAULT_MAX_WAIT_SECONDS,
    stop: threading.Event | None = None,
    sends: SendLoop | None = None,
) -> DeliveryCounts:
    """One destination's worker over ``pages`` in the calling thread; its requests on
    ``sends``, or on an event loop of its own (started here, closed when it ends) when it
    delivers alone."""
    with ExitStack() as stack:
        stack.enter_context(affinity.pinned(affinity.resolve(settings.delivery_cpu, batches=1)))
        if sends is None:
            sends = stack.enter_context(SendLoop())
        conn = stack.enter_context(db.borrow(pool, db.Role.WORKER, settings))
        worker = DestinationWorker(
            conn,
            run_id,
            pages,
            settings,
            max_wait_seconds=max_wait_seconds,
            stop=stop or threading.Event(),
            sends=sends,
        )
        return worker.run()


def deliver_destination(
    pool: ConnectionPool,
    run_id: str,
    destination_id: str,
    settings: Settings,
    *,
    cohort: Cohort,
    budget: RowBudget,
    claim_page_size: int,
    max_wait_seconds: float = DEFAULT_MAX_WAIT_SECONDS,
    stop: threading.Event | None = None,
    sends: SendLoop | None = None,
) -> DestinationResult:
    """Deliver a destination's due deliveries of ``cohort`` for ``run_id``, claiming a page at
    a time as the last one is sent (``DuePages``), until none is due or ``budget`` is spent."""
    started = time.monotonic()
    pages = DuePages(run_id, destination_id, cohort, claim_page_size, budget)
    counts = deliver_pages(
        pool, run_id, pages, settings, max_wait_seconds=max_wait_seconds, stop=stop, sends=sends
    )
    return DestinationResult(destination_id, pages.claimed, counts, time.monotonic() - started)


def deliver_destinations(
    pool: ConnectionPool,
    run_id: str,
    destination_ids: list[str],
    settings: Settings,
    *,
    cohort: Cohort,
    claim_page_size: int,
    max_rows: int | None = None,
    stop: threading.Event | None = None,
    **options,
) -> Iterator[DestinationResult]:
    """Deliver the due work of each destination concurrently, one thread each, every one
    claiming its own pages, at most ``max_rows`` rows in all. Yields each destination's result
    as it finishes."""
    stop = stop or threading.Event()
    budget = RowBudget(max_rows)

    def one(destination_id: str) -> Callable[[SendLoop], DestinationResult]:
        return lambda sends: deliver_destination(
            pool,
            run_id,
            destination_id,
            settings,
            cohort=cohort,
            budget=budget,
            claim_page_size=claim_page_size,
            stop=stop,
            sends=sends,
            **options,
        )

    yield from _in_threads(settings, [one(d) for d in destination_ids], stop)


def _in_threads(
    settings: Settings,
    work: list[Callable[[SendLoop], T]],
    stop: threading.Event,
) -> Iterator[T]:
    """Run each of ``work`` in a thread of its own, all sending on one event loop, yielding
    results as they finish. A failure of one does not stop the others: the first is raised
    once all have ended. An interrupt (a canceled run) sets ``stop`` so that every one hands
    back what it holds."""
    if not work:
        return
    failure: BaseException | None = None
    with ExitStack() as stack:
        stack.enter_context(_collector_frozen())
        # The event loop's thread and each submit's inherit the run's one CPU; the calling
        # thread gets its own affinity back. The loop closes after the last worker has ended.
        with affinity.pinned(affinity.resolve(settings.delivery_cpu, batches=len(work))):
            sends = stack.enter_context(SendLoop())
            executor = stack.enter_context(
                ThreadPoolExecutor(max_workers=len(work), thread_name_prefix="deliver")
            )
            futures = [executor.submit(one, sends) for one in work]
        try:
            for future in as_completed(futures):
                try:
                    result = future.result()
                except Exception as exc:
                    failure = failure or exc
                    continue
                yield result
        except BaseException:
            stop.set()
            raise
    if failure is not None:
        raise failure


@contextmanager
def _collector_frozen() -> Iterator[None]:
    """Keeps what exists when a run starts out of the collector's full passes until it ends.

    A full pass walks every tracked object (aiohttp's, psycopg's, the rest: 25-60 ms here) and
    holds up every thread meanwhile, so the starts due in it leave together, bunched against
    the destinations' rate envelopes. A process that froze its own objects is left as it is;
    otherwise they are unfrozen afterwards, so that nothing stays out of collection after the
    run.
    """
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
