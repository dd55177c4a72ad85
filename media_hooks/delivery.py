"""The delivery worker: one destination batch of a run, from the outbox to recorded outcomes.

For each page the relay hands over, the worker takes permits from the destination's global
limits, leases as many deliveries as it got permits, sends them from a bounded thread pool
(one pooled HTTP session per destination), and records the outcomes of whatever has finished
in one statement. No transaction is open while a request is in flight (invariant 7), and a
worker waiting for permits holds no lease (it leases only what it can send now).

A destination's failures are data: they are recorded and counted, never raised. Only
infrastructure faults (the database, a bug) raise, and then the run's failure handling and
the sweeps make the rows due again (invariant 3).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import (
    ALL_COMPLETED,
    FIRST_COMPLETED,
    Future,
    ThreadPoolExecutor,
    as_completed,
    wait,
)
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime, timedelta

import psycopg
from psycopg_pool import ConnectionPool

from media_hooks import affinity, backoff, crashpoints, leases, outcomes, rate_limits
from media_hooks.config import Settings
from media_hooks.destinations import Destination, disable_destination, get_destination
from media_hooks.leases import Lease, Message, Outcome
from media_hooks.reconciler import Batch
from media_hooks.sender import AttemptResult, Sender

# Margin a lease keeps beyond the longest a send can take, for recording the outcome.
LEASE_MARGIN_SECONDS = 2.0
# How long a worker waits for permits (rate, in-flight, a short pause) before it hands the
# rest of its batch back to pending for a later run.
DEFAULT_MAX_WAIT_SECONDS = 60.0
DEFAULT_PAGE_SIZE = 500
# Outcomes are recorded in batches of up to this many, and none waits longer than the delay
# (a 429 or 410 is recorded, and acted on, at once).
RECORD_BATCH = 100
RECORD_MAX_DELAY_SECONDS = 0.2
GATHER_SECONDS = 0.002


@dataclass
class DeliveryCounts:
    attempted: int = 0
    succeeded: int = 0
    retried: int = 0
    rate_limited: int = 0
    ambiguous: int = 0
    dead: int = 0
    skipped: int = 0
    deferred: int = 0

    def merge(self, other: DeliveryCounts) -> DeliveryCounts:
        return DeliveryCounts(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        )

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def count(self, outcome: str, state: str) -> None:
        """Count one recorded attempt by its outcome and the state it left the delivery in."""
        self.attempted += 1
        if state == "succeeded":
            self.succeeded += 1
        elif state == "dead":
            self.dead += 1
        elif outcome == outcomes.RATE_LIMITED:
            self.rate_limited += 1
        else:
            self.retried += 1
        if outcome == outcomes.AMBIGUOUS:
            self.ambiguous += 1


def tally(
    results: Iterable[tuple[str, DeliveryCounts]],
) -> tuple[DeliveryCounts, dict[str, DeliveryCounts]]:
    """Totals and per-destination counts of batch results given as (destination_id, counts)."""
    totals = DeliveryCounts()
    by_destination: dict[str, DeliveryCounts] = {}
    for destination_id, counts in results:
        totals = totals.merge(counts)
        by_destination[destination_id] = by_destination.get(destination_id, DeliveryCounts()).merge(
            counts
        )
    return totals, by_destination


def lease_seconds_for(destination: Destination, sender: Sender, settings: Settings) -> float:
    """The configured lease, stretched if this destination's sends could outlast it."""
    return max(settings.lease_seconds, sender.worst_case_seconds + LEASE_MARGIN_SECONDS)


def next_delay(lease: Lease, result: AttemptResult, destination: Destination) -> tuple[float, str]:
    """When to try again after this attempt, and why, in words an operator reads."""
    if result.outcome == outcomes.RATE_LIMITED:
        if result.retry_after_seconds is not None:
            return result.retry_after_seconds, (
                f"Retry-After {result.retry_after_seconds:.0f} s (HTTP {result.http_status})"
            )
        delay = destination.backoff_base_seconds
        return delay, f"rate limited (HTTP {result.http_status}, no Retry-After): {delay:.0f} s"
    delay = backoff.backoff_seconds(
        max(lease.budget_used, 1),
        destination.backoff_base_seconds,
        destination.backoff_cap_seconds,
    )
    return delay, f"backoff {delay:.0f} s after attempt {lease.attempt_no} ({result.outcome})"


def to_outcome(lease: Lease, result: AttemptResult, destination: Destination) -> Outcome:
    delay, reason = next_delay(lease, result, destination)
    return Outcome(
        lease=lease,
        outcome=result.outcome,
        http_status=result.http_status,
        error=result.error,
        response_excerpt=result.response_excerpt,
        delay_seconds=delay,
        delay_reason=reason,
        started_at=result.started_at,
        finished_at=result.finished_at,
    )


class _BatchWorker:
    """Delivers one batch; the state of one ``deliver_batch`` call."""

    def __init__(
        self,
        conn: psycopg.Connection,
        run_id: str,
        batch: Batch,
        destination: Destination,
        sender: Sender,
        settings: Settings,
        *,
        page_size: int,
        max_wait_seconds: float,
    ) -> None:
        self.conn = conn
        self.run_id = run_id
        self.batch = batch
        self.destination = destination
        self.sender = sender
        self.page_size = page_size
        self.max_wait_seconds = max_wait_seconds
        self.lease_seconds = lease_seconds_for(destination, sender, settings)
        # Every batch of a run holds its permits under the run's id, so the run's failure
        # handling can free them at once (sweeps.release_run) instead of waiting out the holds.
        self.holder = run_id
        self.counts = DeliveryCounts()
        self.waiting: deque[Message] = deque()
        self.after_message_id = ""
        self.pages_exhausted = False
        self.in_flight: dict[Future, tuple[Lease, int]] = {}
        # Finished requests whose outcomes are not recorded yet, and since when; and the
        # permits of finished requests, handed back with the next ask.
        self.finished: list[tuple[Lease, AttemptResult]] = []
        self.finished_since: float | None = None
        self.returned_slots: list[int] = []
        self.wait_started: float | None = None

    # The relay ---------------------------------------------------------------------------

    def _next_page(self) -> list[Message]:
        page = leases.publish_page(
            self.conn,
            run_id=self.batch.run_id,
            destination_id=self.batch.destination_id,
            after_message_id=self.after_message_id,
            last_message_id=self.batch.last_message_id,
            page_size=self.page_size,
        )
        if page:
            self.after_message_id = page[-1].message_id
            crashpoints.hit(crashpoints.AFTER_PUBLISH)
        else:
            self.pages_exhausted = True
        return page

    def _refill(self) -> None:
        if not self.waiting and not self.pages_exhausted:
            self.waiting.extend(self._next_page())

    # Sending -----------------------------------------------------------------------------

    def _step(self, executor: ThreadPoolExecutor) -> rate_limits.Grant:
        """Take permits and lease that many waiting messages (one round trip), and send them."""
        free = self.destination.max_in_flight - len(self.in_flight)
        offered = [self.waiting[i] for i in range(min(free, len(self.waiting)))]
        if not offered:
            return rate_limits.Grant()
        returned, self.returned_slots = self.returned_slots, []
        grant, taken = leases.lease_with_permits(
            self.conn,
            self.run_id,
            self.destination.destination_id,
            offered,
            holder=self.holder,
            lease_seconds=self.lease_seconds,
            release_slots=returned,
        )
        for _ in range(grant.granted):
            self.waiting.popleft()
        self.counts.skipped += grant.granted - len(taken)
        self.returned_slots.extend(grant.slots[len(taken) :])
        if taken:
            crashpoints.hit(crashpoints.AFTER_LEASE_BEFORE_REQUEST)
        for lease, slot in zip(taken, grant.slots, strict=False):
            future = executor.submit(self.sender.send, lease.delivery_id, lease.body)
            self.in_flight[future] = (lease, slot)
        return grant

    def _collect(self, timeout: float | None) -> None:
        """Wait for at least one request to finish (or ``timeout``) and take what finished.

        Their permits go back with the next ask; their outcomes are recorded in batches
        (``_record``), since one statement for many outcomes costs little more than for one.
        """
        done, pending = wait(list(self.in_flight), timeout=timeout, return_when=FIRST_COMPLETED)
        if done and pending:
            # Requests sent together tend to finish together: a moment's wait lets the next
            # ask take several permits in one round trip instead of one each.
            more, _ = wait(pending, timeout=GATHER_SECONDS, return_when=ALL_COMPLETED)
            done |= more
        for future in done:
            lease, slot = self.in_flight.pop(future)
            self.finished.append((lease, future.result()))
            self.returned_slots.append(slot)
        if done and self.finished_since is None:
            self.finished_since = time.monotonic()
        if self._record_due():
            self._record()

    def _record_due(self) -> bool:
        if not self.finished:
            return False
        idle = not self.in_flight and not self.waiting and self.pages_exhausted
        if idle or len(self.finished) >= RECORD_BATCH:
            return True
        # A destination's signal (429, 410) acts at once; no outcome waits long unrecorded.
        signal = any(
            r.outcome == outcomes.RATE_LIMITED or r.disable_destination for _, r in self.finished
        )
        return signal or time.monotonic() - self.finished_since >= RECORD_MAX_DELAY_SECONDS

    def _record(self) -> None:
        finished, self.finished, self.finished_since = self.finished, [], None
        crashpoints.hit(crashpoints.AFTER_RESPONSE_BEFORE_RECORD)
        recorded = leases.record(
            self.conn, [to_outcome(lease, result, self.destination) for lease, result in finished]
        )
        for lease, result in finished:
            state = recorded.get(lease.delivery_id)
            if state is None:
                self.counts.skipped += 1  # our lease expired and someone else owns it now
            else:
                self.counts.count(result.outcome, state)
        self._apply_destination_signals([result for _, result in finished])

    def _return_slots(self) -> None:
        if self.returned_slots:
            rate_limits.release(
                self.conn, self.destination.destination_id, self.returned_slots, self.holder
            )
            self.returned_slots = []

    def _apply_destination_signals(self, results: list[AttemptResult]) -> None:
        """A 429 / 503 + Retry-After pauses the destination; a 410 disables it."""
        pauses = [r for r in results if r.outcome == outcomes.RATE_LIMITED]
        if pauses:
            longest = max(pauses, key=lambda r: r.retry_after_seconds or 0.0)
            seconds = longest.retry_after_seconds
            why = f"HTTP {longest.http_status} with Retry-After {seconds:.0f} s"
            if seconds is None:
                seconds = self.destination.backoff_base_seconds
                why = f"HTTP {longest.http_status} without Retry-After: {seconds:.0f} s"
            if seconds > 0:
                rate_limits.pause_destination(
                    self.conn, self.destination.destination_id, seconds, why
                )
        gone = next((r for r in results if r.disable_destination), None)
        if gone is not None:
            disable_destination(
                self.conn,
                self.destination.destination_id,
                f"receiver answered HTTP {gone.http_status} (Gone) at {gone.finished_at:%Y-%m-%d %H:%M:%S} UTC",
            )

    # Deferring ---------------------------------------------------------------------------

    def _defer_rest(self, grant: rate_limits.Grant) -> None:
        """Hand every unsent message of the batch back to pending, due when worth trying."""
        due_at = datetime.now(UTC) + timedelta(seconds=grant.retry_in)
        reason = f"destination {self.destination.destination_id} {grant.reason or 'unavailable'}"
        if grant.reason and grant.reason.startswith("paused"):
            reason = f"waiting: destination {grant.reason}"
        while True:
            self._refill()
            if not self.waiting:
                return
            chunk = list(self.waiting)
            self.waiting.clear()
            self.counts.deferred += leases.defer(self.conn, chunk, due_at, reason)

    # The loop ----------------------------------------------------------------------------

    def _should_give_up(self, grant: rate_limits.Grant) -> bool:
        if grant.reason == "disabled":
            return True
        now = time.monotonic()
        if self.wait_started is None:
            self.wait_started = now
        return now + grant.retry_in > self.wait_started + self.max_wait_seconds

    def run(self) -> DeliveryCounts:
        with ThreadPoolExecutor(
            max_workers=self.destination.max_in_flight,
            thread_name_prefix=f"send-{self.destination.destination_id}"[:40],
        ) as executor:
            try:
                self._loop(executor)
            finally:
                # However the loop ended, what finished is recorded and no permit stays held.
                if self.finished:
                    self._record()
            self._return_slots()
        return self.counts

    def _loop(self, executor: ThreadPoolExecutor) -> None:
        while True:
            self._refill()
            if not self.waiting and not self.in_flight:
                return
            grant = self._step(executor)
            if grant.granted:
                self.wait_started = None
                continue
            if self.waiting and not self.in_flight and self._should_give_up(grant):
                self._defer_rest(grant)
                return
            if self.in_flight:
                # Asking again only pays once something finishes or a permit is due.
                timeout = grant.retry_in if self.waiting and grant.reason else None
                self._collect(timeout=timeout)
            else:
                if self.finished:
                    self._record()  # nothing is in flight: record while waiting for a permit
                time.sleep(max(grant.retry_in, 0.001))


def deliver_batch(
    pool: ConnectionPool,
    run_id: str,
    batch: Batch,
    settings: Settings,
    *,
    page_size: int = DEFAULT_PAGE_SIZE,
    max_wait_seconds: float = DEFAULT_MAX_WAIT_SECONDS,
) -> DeliveryCounts:
    """Deliver one batch of a run's outbox messages; ``run_id`` is the attempting run.

    ``batch.run_id`` names the run whose outbox rows these are; it differs from ``run_id``
    when a run is re-executed (the re-execution sends what its parent dispatched).
    """
    with (
        affinity.pinned(affinity.resolve(settings.delivery_cpu, batches=1)),
        pool.connection() as conn,
    ):
        conn.autocommit = True
        destination = get_destination(conn, batch.destination_id)
        with Sender(
            destination.url,
            destination.secrets,
            destination.timeout_seconds,
            settings.allow_private_urls,
            destination.max_in_flight,
        ) as sender:
            worker = _BatchWorker(
                conn,
                run_id,
                batch,
                destination,
                sender,
                settings,
                page_size=page_size,
                max_wait_seconds=max_wait_seconds,
            )
            return worker.run()


def deliver_batches(
    pool: ConnectionPool,
    run_id: str,
    batches: list[Batch],
    settings: Settings,
    **options,
) -> Iterator[tuple[Batch, DeliveryCounts]]:
    """Deliver batches concurrently, one thread per batch: a slow or rate-limited
    destination never holds up another's. Yields each batch's counts as it finishes."""
    if not batches:
        return
    with ThreadPoolExecutor(max_workers=len(batches), thread_name_prefix="batch") as executor:
        # Each submit starts a batch thread, which inherits the run's one CPU (and its
        # senders after it); the calling thread gets its own affinity back.
        with affinity.pinned(affinity.resolve(settings.delivery_cpu, batches=len(batches))):
            futures: dict[Future, Batch] = {
                executor.submit(deliver_batch, pool, run_id, batch, settings, **options): batch
                for batch in batches
            }
        for future in as_completed(futures):
            yield futures[future], future.result()
