"""The delivery worker: one destination batch of a run, from the outbox to recorded outcomes.

For each page the relay hands over, the worker takes permits from the destination's global
limits, leases as many deliveries as it got permits, hands them to the run's event loop (one
pooled HTTP session per destination, media_hooks.http.send_loop), each at the moment its start was
granted for (the limiter may grant a start a little ahead), and records the outcomes of
whatever has finished in one statement. No transaction is open while a request is in flight (invariant 7), and a
worker waiting for permits holds no lease (it leases only what it can send now). An outcome
waits at most ``RECORD_MAX_DELAY_SECONDS`` to be recorded, however long its neighbours take.

The destination is read again at every page and at least every ``REFRESH_SECONDS``: a changed
URL, secret, timeout or limit takes effect then (a disabled or paused destination, and the
rate and in-flight limits, at the next permit: they are read by every grant). Settings the
engine cannot honour, and an address the SSRF guard refuses at connect time, are configuration
faults: the destination is disabled saying why, and its deliveries wait, pending, with their
retry budget intact.

A destination's failures are data: they are recorded and counted, never raised. Only
infrastructure faults (the database, a bug) raise, and then whatever the batch holds is handed
back first: every request in flight is waited for and its outcome recorded, a lease that was
never sent is recorded as not sent, and every permit is returned. A statement that meets a lock
or a timeout is retried (media_hooks.store.db.retrying); outcomes keep being retried for as long as
their leases hold. Outcomes the database refuses outright raise OutcomesNotRecorded, which must
not be retried (retrying the step would leave them to lease expiry and hide the failure).
"""

from __future__ import annotations

import gc
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, fields
from typing import TypeVar

import psycopg
from psycopg_pool import ConnectionPool

from media_hooks.core import affinity, backoff, crashpoints
from media_hooks.core.config import Settings
from media_hooks.http import outcomes
from media_hooks.http.send_loop import SendLoop
from media_hooks.http.sender import AttemptResult, Sender
from media_hooks.http.signing import InvalidSecret
from media_hooks.outbox import claims, destinations, leases, rate_limits
from media_hooks.outbox.claims import Batch
from media_hooks.outbox.cohort import Cohort
from media_hooks.outbox.destinations import Destination, disable_destination, get_destination
from media_hooks.outbox.leases import Lease, Message, Outcome
from media_hooks.store import db

log = logging.getLogger("media_hooks")
T = TypeVar("T")

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
# A running batch reads its destination again at every page and at least this often.
REFRESH_SECONDS = 5.0
# Outcomes are retried until this long before the first of their leases ends.
RECORD_DEADLINE_MARGIN_SECONDS = 5.0
ALLOW_PRIVATE_SETTING = "MEDIA_HOOKS_ALLOW_PRIVATE_URLS=1"
# No retry or pause is ever scheduled further out than the longest backoff cap allowed: a
# destination changed under a running batch cannot make a due time overflow.
LONGEST_DELAY_SECONDS = destinations.RANGES["backoff_cap_seconds"].allowed.high


class OutcomesNotRecorded(Exception):
    """Finished attempts whose outcomes the database would not record (not a passing lock or
    timeout: those are retried while the leases hold). Retrying the batch would not record
    them; their deliveries stay leased until their leases end, then are due again as
    ambiguous (the sweep, or the run-failure release)."""

    def __init__(self, delivery_ids: list[str], cause: BaseException) -> None:
        shown = ", ".join(delivery_ids[:5]) + (", ..." if len(delivery_ids) > 5 else "")
        first_line = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        super().__init__(
            f"could not record the outcomes of {len(delivery_ids)} attempt(s) ({shown}): "
            f"{first_line}; they stay leased until their leases end, then are due again as "
            "ambiguous"
        )
        self.delivery_ids = delivery_ids


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
    # Attempts the SSRF guard refused at connect time: nothing sent, budget kept, destination
    # disabled (a configuration fault).
    guard_refused: int = 0

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

    def count_spared(self, configuration_fault: bool) -> None:
        """Count an attempt that does not count against its delivery: nothing was sent (the
        SSRF guard refused the address, or the batch stopped between lease and send)."""
        if configuration_fault:
            self.guard_refused += 1
        else:
            self.deferred += 1


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


def bare_pause_seconds(destination: Destination) -> float:
    """How long a 429 without Retry-After pauses the destination: its backoff base (never
    beyond the longest delay the engine stores)."""
    return min(destination.backoff_base_seconds, LONGEST_DELAY_SECONDS)


def next_delay(lease: Lease, result: AttemptResult, destination: Destination) -> tuple[float, str]:
    """When to try again after this attempt, and why, in words an operator reads."""
    if result.outcome == outcomes.RATE_LIMITED:
        if result.retry_after_seconds is not None:
            return result.retry_after_seconds, (
                f"Retry-After {result.retry_after_seconds:.0f} s (HTTP {result.http_status})"
            )
        delay = bare_pause_seconds(destination)
        return delay, f"rate limited (HTTP {result.http_status}, no Retry-After): {delay:.0f} s"
    delay = backoff.backoff_seconds(
        max(lease.budget_used, 1),
        min(destination.backoff_base_seconds, LONGEST_DELAY_SECONDS),
        min(destination.backoff_cap_seconds, LONGEST_DELAY_SECONDS),
    )
    return delay, f"backoff {delay:.0f} s after attempt {lease.attempt_no} ({result.outcome})"


def to_outcome(lease: Lease, result: AttemptResult, destination: Destination) -> Outcome:
    if result.configuration_fault:
        # Not the delivery's failure: it keeps its budget and waits for its destination.
        return Outcome(
            lease=lease,
            outcome=result.outcome,
            http_status=None,
            error=result.error,
            response_excerpt=None,
            delay_seconds=0.0,
            delay_reason=f"waiting: destination {destination.destination_id} is disabled "
            "(configuration fault, see `media-hooks destination list`)",
            finished_monotonic=result.finished_monotonic,
            spare=True,
        )
    delay, reason = next_delay(lease, result, destination)
    return Outcome(
        lease=lease,
        outcome=result.outcome,
        http_status=result.http_status,
        error=result.error,
        response_excerpt=result.response_excerpt,
        delay_seconds=delay,
        delay_reason=reason,
        finished_monotonic=result.finished_monotonic,
    )


def not_sent(lease: Lease, why: BaseException) -> Outcome:
    """A lease whose request was never started (the batch stopped between lease and send)."""
    return Outcome(
        lease=lease,
        outcome=outcomes.RETRYABLE,
        http_status=None,
        error=f"not sent: the batch stopped first ({type(why).__name__}: {why})"[:500],
        response_excerpt=None,
        delay_seconds=0.0,
        delay_reason="due again: its batch stopped before sending it",
        finished_monotonic=time.monotonic(),
        spare=True,
    )


def _configuration_reason(result: AttemptResult) -> str:
    """A destination's disabled reason for an address the SSRF guard refused: which address,
    and which setting allows it."""
    reason = f"configuration: {result.error} (at connect time"
    if ALLOW_PRIVATE_SETTING not in (result.error or ""):
        reason += f"; {ALLOW_PRIVATE_SETTING} in the workers' environment allows private addresses"
    return reason + "); enable it once the URL or the setting is fixed"


class BatchPages:
    """A planned batch's outbox messages, page by page through the relay (``publish_page``).
    Its messages are claimed already: a worker that stops hands every one of them back."""

    def __init__(self, batch: Batch, page_size: int) -> None:
        self.batch = batch
        self.destination_id = batch.destination_id
        self.page_size = page_size
        self.after_message_id = ""

    def next_page(self, conn: psycopg.Connection) -> list[Message]:
        page = db.retrying(
            "publish page",
            lambda: leases.publish_page(
                conn,
                run_id=self.batch.run_id,
                destination_id=self.destination_id,
                after_message_id=self.after_message_id,
                last_message_id=self.batch.last_message_id,
                page_size=self.page_size,
            ),
        )
        if page:
            self.after_message_id = page[-1].message_id
        return page

    def stop(self) -> None:
        """Nothing to stop: the rest of the batch is the worker's to hand back."""


class RowBudget:
    """The most rows a run claims, shared by the workers of its destinations (None: no cap).

    A claim reserves up to a page of rows before it runs and settles afterwards, handing back
    what its page came back short by. A worker that finds the budget spent waits while claims
    are still reserving rows: one of them may hand rows back, and a worker that gave up at
    that moment would leave the run short of its cap while its destination still had work."""

    def __init__(self, rows: int | None) -> None:
        self._left = rows
        self._reserved = 0
        self._settled = threading.Condition()

    def take(self, wanted: int) -> int:
        """Reserve up to ``wanted`` rows for one claim (0: the budget is spent for good)."""
        with self._settled:
            if self._left is None:
                return wanted
            self._settled.wait_for(lambda: self._left > 0 or self._reserved == 0)
            granted = min(wanted, self._left)
            self._left -= granted
            self._reserved += granted
            return granted

    def settle(self, reserved: int, claimed: int) -> None:
        """A claim that reserved ``reserved`` rows ended having claimed ``claimed``."""
        with self._settled:
            if self._left is None:
                return
            self._reserved -= reserved
            self._left += reserved - claimed
            self._settled.notify_all()


class DuePages:
    """One destination's due deliveries, claimed for the run a page at a time as its worker
    runs out of messages (``claim_destination_page``), then published. Claiming stops at the
    first page that comes back short (nothing more was due), when the run's row budget is
    spent, or when the worker stops (it then hands back what it holds and claims nothing)."""

    def __init__(
        self,
        run_id: str,
        destination_id: str,
        cohort: Cohort,
        page_size: int,
        budget: RowBudget,
    ) -> None:
        self.run_id = run_id
        self.destination_id = destination_id
        self.cohort = cohort
        self.page_size = page_size
        self.budget = budget
        self.claimed = 0
        self.done = False

    def next_page(self, conn: psycopg.Connection) -> list[Message]:
        if self.done:
            return []
        size = self.budget.take(self.page_size)
        if size == 0:
            self.done = True
            return []
        page: list[Message] = []
        try:
            page = claims.claim_destination_page(
                conn, self.run_id, self.destination_id, self.cohort, size
            )
        finally:
            self.budget.settle(size, len(page))
        self.claimed += len(page)
        self.done = len(page) < size
        db.retrying("publish page", lambda: leases.publish_messages(conn, page))
        return page

    def stop(self) -> None:
        self.done = True


class _BatchWorker:
    """Delivers one destination's messages from ``pages``; the state of one delivery of a
    batch (``deliver_batch``) or of a destination's due work (``deliver_destination``)."""

    def __init__(
        self,
        conn: psycopg.Connection,
        run_id: str,
        pages: BatchPages | DuePages,
        settings: Settings,
        *,
        max_wait_seconds: float,
        stop: threading.Event,
        sends: SendLoop,
    ) -> None:
        self.conn = conn
        # The run's event loop, where every request of the batch is in flight.
        self.sends = sends
        self.run_id = run_id
        self.pages = pages
        self.destination_id = pages.destination_id
        self.settings = settings
        self.max_wait_seconds = max_wait_seconds
        # Set when the run is stopped (canceled): the worker hands back what it holds at once.
        self.stop = stop
        # Every batch of a run holds its permits under the run's id, so the run's failure
        # handling can free them at once (sweeps.release_run) instead of waiting out the holds.
        self.holder = run_id
        self.counts = DeliveryCounts()
        # The destination as last read, and what sends to it (_refresh_destination).
        self.destination: Destination | None = None
        self.sender: Sender | None = None
        self.lease_seconds = settings.lease_seconds
        self.refreshed_at = 0.0
        # Senders replaced by a changed destination; closed at the end.
        self.retired: list[Sender] = []
        self.waiting: deque[Message] = deque()
        self.pages_exhausted = False
        # Leases taken and not yet handed to a sender, with their slot and the moment (monotonic)
        # their start was granted for; requests in flight, with their slot; and when each lease
        # ends (monotonic): its outcome is retried until shortly before.
        self.unsent: list[tuple[Lease, int, float]] = []
        self.in_flight: dict[Future, tuple[Lease, int]] = {}
        self.lease_ends: dict[str, float] = {}
        # Requests in flight that have finished, as they finish: waiting on this costs one
        # wake-up per answer, where waiting on every future in flight costs a lock on each.
        self.answers: queue.SimpleQueue[Future] = queue.SimpleQueue()
        # Finished attempts whose outcomes are not recorded yet, with their answers (None for a
        # lease never sent); and the permits of finished requests, handed back with the next ask.
        self.finished: list[tuple[Outcome, AttemptResult | None]] = []
        self.returned_slots: list[int] = []
        # The database's clock here: when to send a start granted for a moment on it.
        self.clock = rate_limits.DatabaseClock()
        self.wait_started: float | None = None
        # The last answer of the limiter, and when (monotonic) asking again is worth a round
        # trip (_ask_delay): a request finishing before then does not make the worker ask.
        self.grant = rate_limits.Grant()
        self.next_ask_at = 0.0
        # Set when the database refused the outcomes outright: not tried again on the way out.
        self.record_refused = False
        # Why this batch sends nothing more (it disabled its destination), once it does not.
        self.stopped: str | None = None

    def _db(self, what: str, action: Callable[..., T], *args, **kwargs) -> T:
        return db.retrying(what, lambda: action(self.conn, *args, **kwargs))

    # The destination -----------------------------------------------------------------------

    def _refresh_destination(self) -> None:
        """Read the destination again and apply what changed: a new URL, secrets, timeout or
        in-flight limit gets a new sender (requests in flight finish on the old one); settings
        the engine cannot honour disable it. Grants read the rest (enabled, pause, rates)."""
        current = self._db("read destination", get_destination, self.destination_id)
        self.refreshed_at = time.monotonic()
        previous, self.destination = self.destination, current
        problem = destinations.out_of_range(current)
        if problem is not None:
            self._disable(problem)
            return
        if self.stopped is not None:
            return
        if previous is not None and self.sender is not None and _same_sending(previous, current):
            return
        try:
            sender = Sender(
                current.url,
                current.secrets,
                current.timeout_seconds,
                self.settings.allow_private_urls or current.allow_private_url,
                current.max_in_flight,
                loop=self.sends,
            )
        except InvalidSecret as exc:
            self._disable(f"configuration: a stored secret is unusable ({exc})")
            return
        if self.sender is not None:
            self.retired.append(self.sender)
        self.sender = sender
        self.lease_seconds = lease_seconds_for(current, sender, self.settings)

    def _disable(self, reason: str) -> None:
        """The destination stops for every worker until an operator enables it (a 410, or a
        configuration fault); this batch sends nothing more and hands the rest back."""
        if self.destination is not None and self.destination.enabled:
            log.warning("disabling destination %s: %s", self.destination_id, reason)
            self._db("disable destination", disable_destination, self.destination_id, reason)
        self.stopped = reason

    # The relay ---------------------------------------------------------------------------

    def _next_page(self) -> list[Message]:
        page = self.pages.next_page(self.conn)
        if page:
            crashpoints.hit(crashpoints.AFTER_PUBLISH)
            self._refresh_destination()
        else:
            self.pages_exhausted = True
        return page

    def _refill(self) -> None:
        if not self.waiting and not self.pages_exhausted:
            self.waiting.extend(self._next_page())

    # Sending -----------------------------------------------------------------------------

    def _step(self) -> tuple[rate_limits.Grant, int]:
        """Take permits and lease that many waiting messages (one round trip), and send them.
        Returns the grant and how many waiting messages it used up."""
        free = self.destination.max_in_flight - len(self.in_flight)
        offered = [self.waiting[i] for i in range(min(free, len(self.waiting)))]
        if not offered:
            return rate_limits.Grant(), 0
        returned, self.returned_slots = self.returned_slots, []
        try:
            step = self._db(
                "lease with permits",
                leases.lease_with_permits,
                self.run_id,
                self.destination.destination_id,
                offered,
                holder=self.holder,
                lease_seconds=self.lease_seconds,
                release_slots=returned,
            )
        except BaseException:
            self.returned_slots = returned + self.returned_slots  # not handed back after all
            raise
        answered = time.monotonic()
        for _ in range(step.examined):
            self.waiting.popleft()
        self.counts.skipped += step.examined - len(step.leases)
        self.grant = step.grant
        self.next_ask_at = answered + self._ask_delay(step.grant)
        ends = answered + self.lease_seconds
        self.clock.observe(step.grant.answered_at, answered)
        starts = [self.clock.monotonic_at(at) for at in step.grant.start_at]
        self.unsent = list(zip(step.leases, step.grant.slots, starts, strict=True))
        for lease in step.leases:
            self.lease_ends[lease.delivery_id] = ends
        if self.unsent:
            crashpoints.hit(crashpoints.AFTER_LEASE_BEFORE_REQUEST)
        while self.unsent:
            lease, slot, start_at = self.unsent[0]
            if self._wait_for_start(start_at) or self.stopped is not None:
                break  # the loop hands the unsent leases back
            future = self.sender.submit(lease.delivery_id, lease.body)
            self.in_flight[future] = (lease, slot)
            future.add_done_callback(self.answers.put)
            self.unsent.pop(0)
        return step.grant, step.examined

    def _wait_for_start(self, start_at: float) -> bool:
        """Wait until ``start_at`` (``time.monotonic()``), the moment the limiter granted a
        start for (it may grant one a little ahead), taking and recording meanwhile whatever
        finishes or falls due; True if the run was stopped first."""
        while (left := start_at - time.monotonic()) > 0:
            bound = self._wait_bound(rate_limits.Grant())
            timeout = left if bound is None else min(left, bound)
            if self.in_flight:
                self._collect(timeout=timeout)
            elif self.stop.wait(timeout):
                return True
            elif self._record_due():
                self._record()
        return self.stop.is_set()

    def _take(self, future: Future, lease: Lease, slot: int) -> None:
        result = future.result()
        self.finished.append((to_outcome(lease, result, self.destination), result))
        self.returned_slots.append(slot)

    def _collect(self, timeout: float | None) -> None:
        """Wait for at least one request to finish (or ``timeout``) and take what finished.

        Their permits go back with the next ask; their outcomes are recorded in batches
        (``_record``), since one statement for many outcomes costs little more than for one.
        """
        done = self._answered(timeout)
        for future in done:
            self._take(future, *self.in_flight.pop(future))
        if done and self.grant.reason == "in flight":
            self.next_ask_at = 0.0  # a slot of its own is free: what the worker waited for
        if self._record_due():
            self._record()

    def _answered(self, timeout: float | None) -> list[Future]:
        """The requests that finished: at least one, unless ``timeout`` passes first."""
        try:
            done = [self.answers.get(timeout=timeout)]
        except queue.Empty:
            return []
        # Requests sent together tend to finish together: a moment's wait for the rest lets
        # the next ask take several permits in one round trip instead of one each.
        gather_until = time.monotonic() + GATHER_SECONDS
        while len(done) < len(self.in_flight):
            try:
                done.append(self.answers.get(timeout=max(gather_until - time.monotonic(), 0.0)))
            except queue.Empty:
                break
        return done

    def _oldest_unrecorded(self) -> float:
        return min(outcome.finished_monotonic for outcome, _ in self.finished)

    def _record_due(self) -> bool:
        if not self.finished:
            return False
        idle = not self.in_flight and not self.waiting and self.pages_exhausted
        if idle or len(self.finished) >= RECORD_BATCH:
            return True
        # A destination's signal (429, 410, a refused address) acts at once; no outcome waits
        # long unrecorded.
        signal = any(
            r is not None
            and (
                r.outcome == outcomes.RATE_LIMITED or r.disable_destination or r.configuration_fault
            )
            for _, r in self.finished
        )
        return signal or time.monotonic() - self._oldest_unrecorded() >= RECORD_MAX_DELAY_SECONDS

    def _ask_delay(self, grant: rate_limits.Grant) -> float:
        """How long after this answer the next ask is worth its round trip.

        Bound by the rate, the worker waits until a burst of starts is due instead of the next
        one alone: each ask costs the limiter and the database about as much as the leases it
        takes (one start an ask is 50 asks a second at 50/s). Waiting for the burst loses no
        start: the limiter grants a start a little ahead of its moment (up to 50 ms, at most
        one interval: migration 0014), so an ask arriving up to that late still finds every
        start of the burst; the starts taken together stay within burst + rate·t. Bound by
        requests in flight, a request of its own finishing is the moment to ask too (_collect).
        """
        if grant.reason != "rate" or self.destination is None:
            return grant.retry_in if grant.reason else 0.0
        together = max(min(self.destination.burst, len(self.waiting)), 1)
        return grant.retry_in + (together - 1) / self.destination.rate_per_second

    def _wait_bound(self, grant: rate_limits.Grant) -> float | None:
        """How long to wait for a request to finish: until a permit is worth asking for, and
        never past the moment the oldest unrecorded outcome is due to be recorded."""
        bounds = []
        if self.waiting and grant.reason:
            bounds.append(max(self.next_ask_at - time.monotonic(), 0.0))
        if self.finished:
            due = self._oldest_unrecorded() + RECORD_MAX_DELAY_SECONDS - time.monotonic()
            bounds.append(max(due, 0.0))
        return min(bounds) if bounds else None

    def _record(self) -> None:
        crashpoints.hit(crashpoints.AFTER_RESPONSE_BEFORE_RECORD)
        finished = self.finished
        batch = [outcome for outcome, _ in finished]
        deadline = (
            min(self.lease_ends[o.lease.delivery_id] for o in batch)
            - RECORD_DEADLINE_MARGIN_SECONDS
        )
        try:
            recorded = db.retrying(
                "record outcomes", lambda: leases.record(self.conn, batch), until=deadline
            )
        except (psycopg.Error, db.DatabaseBusy) as exc:
            self.record_refused = True
            raise OutcomesNotRecorded([o.lease.delivery_id for o in batch], exc) from exc
        self.finished = []
        for outcome, result in finished:
            self.lease_ends.pop(outcome.lease.delivery_id, None)
            state = recorded.get(outcome.lease.delivery_id)
            if state is None:
                self.counts.skipped += 1  # our lease expired and someone else owns it now
            elif outcome.spare:
                self.counts.count_spared(result is not None and result.configuration_fault)
            else:
                self.counts.count(outcome.outcome, state)
        self._apply_destination_signals([r for _, r in finished if r is not None])

    def _return_slots(self) -> None:
        if self.returned_slots:
            self._db(
                "return permits",
                rate_limits.release,
                self.destination_id,
                self.returned_slots,
                self.holder,
            )
            self.returned_slots = []

    def _apply_destination_signals(self, results: list[AttemptResult]) -> None:
        """A 429 / 503 + Retry-After pauses the destination; a 410 disables it, and so does an
        address the SSRF guard refused (a configuration fault)."""
        pauses = [r for r in results if r.outcome == outcomes.RATE_LIMITED]
        if pauses:
            longest = max(pauses, key=lambda r: r.retry_after_seconds or 0.0)
            seconds = longest.retry_after_seconds
            if seconds is None:
                seconds = bare_pause_seconds(self.destination)
                why = f"HTTP {longest.http_status} without Retry-After: {seconds:.0f} s"
            else:
                why = f"HTTP {longest.http_status} with Retry-After {seconds:.0f} s"
            if seconds > 0:
                self._db(
                    "pause destination",
                    rate_limits.pause_destination,
                    self.destination_id,
                    seconds,
                    why,
                )
        gone = next((r for r in results if r.disable_destination), None)
        if gone is not None:
            self._disable(
                f"receiver answered HTTP {gone.http_status} (Gone) at "
                f"{gone.finished_at:%Y-%m-%d %H:%M:%S} UTC"
            )
        refused = next((r for r in results if r.configuration_fault), None)
        if refused is not None:
            self._disable(_configuration_reason(refused))

    # Deferring ---------------------------------------------------------------------------

    def _defer_rest(self, grant: rate_limits.Grant, why: str | None = None) -> None:
        """Hand every unsent message of the batch back to pending, due when worth trying: at
        the end of the destination's pause (as stored), or after the grant's wait."""
        self.pages.stop()
        paused = bool(grant.reason and grant.reason.startswith("paused"))
        delay = 0.0 if paused else grant.retry_in
        reason = why or f"destination {self.destination_id} {grant.reason or 'unavailable'}"
        if paused:
            reason = f"waiting: destination {grant.reason}"
        while True:
            self._refill()
            if not self.waiting:
                return
            chunk = list(self.waiting)
            self.waiting.clear()
            self.counts.deferred += self._db("defer", leases.defer, chunk, delay, reason)

    # The loop ----------------------------------------------------------------------------

    def _should_give_up(self, grant: rate_limits.Grant) -> bool:
        if grant.reason == "disabled":
            return True
        now = time.monotonic()
        if self.wait_started is None:
            self.wait_started = now
        return now + grant.retry_in > self.wait_started + self.max_wait_seconds

    def run(self) -> DeliveryCounts:
        failure: BaseException | None = None
        try:
            self._refresh_destination()
            self._db("read the database's clock", self.clock.calibrate)
            self._loop()
        except BaseException as exc:
            failure = exc
            raise
        finally:
            self._settle(failure)
        return self.counts

    def _loop(self) -> None:
        while True:
            if time.monotonic() - self.refreshed_at >= REFRESH_SECONDS:
                self._refresh_destination()
            if self.stop.is_set():
                self._defer_rest(rate_limits.Grant(), f"due again: run {self.run_id} was stopped")
                return
            self._refill()
            if not self.waiting and not self.in_flight:
                return
            if self.stopped is not None and not self.in_flight:
                self._defer_rest(
                    rate_limits.Grant(retry_in=rate_limits.DISABLED_POLL_SECONDS),
                    f"waiting: destination {self.destination_id} is disabled ({self.stopped})",
                )
                return
            if self.stopped is not None:
                grant, used = rate_limits.Grant(), 0
            elif time.monotonic() >= self.next_ask_at:
                grant, used = self._step()
            else:
                grant, used = self.grant, 0  # not worth asking yet (_ask_delay)
            if used:
                self.wait_started = None
                continue
            if self.waiting and not self.in_flight and self._should_give_up(grant):
                self._defer_rest(grant)
                return
            if self.in_flight:
                # Asking again only pays once something finishes, a permit is due, or an
                # outcome is due to be recorded.
                self._collect(timeout=self._wait_bound(grant))
            else:
                if self.finished:
                    self._record()  # nothing is in flight: record while waiting for a permit
                self.stop.wait(max(self.next_ask_at - time.monotonic(), 0.001))

    # Handing back ------------------------------------------------------------------------

    def _settle(self, failure: BaseException | None) -> None:
        """However the batch ends: every request in flight is waited for and taken, a lease
        never sent is recorded as not sent, every outcome is recorded (unless the database
        refused them outright), every permit goes back, and senders and threads are closed.
        After a failure, a further failure here is logged and the first one is raised."""
        try:
            try:
                for lease, slot, _ in self.unsent:
                    self.finished.append((not_sent(lease, failure or RuntimeError()), None))
                    self.returned_slots.append(slot)
                self.unsent = []
                for future, (lease, slot) in list(self.in_flight.items()):
                    self._take(future, lease, slot)  # a send ends within its timeouts
                self.in_flight.clear()
                if self.finished and not self.record_refused:
                    self._record()
            finally:
                self._return_slots()
        except BaseException:
            if failure is None:
                raise
            log.exception(
                "delivery to %s in run %s: handing back after %r failed too",
                self.destination_id,
                self.run_id,
                failure,
            )
        finally:
            for sender in [*self.retired, self.sender]:
                if sender is not None:
                    sender.close()


def _same_sending(before: Destination, after: Destination) -> bool:
    """Whether a sender built for ``before`` still sends as ``after`` says."""
    return (
        before.url,
        before.secrets,
        before.timeout_seconds,
        before.max_in_flight,
        before.allow_private_url,
    ) == (
        after.url,
        after.secrets,
        after.timeout_seconds,
        after.max_in_flight,
        after.allow_private_url,
    )


def _deliver(
    pool: ConnectionPool,
    run_id: str,
    pages: BatchPages | DuePages,
    settings: Settings,
    *,
    max_wait_seconds: float,
    stop: threading.Event | None,
    sends: SendLoop | None,
) -> DeliveryCounts:
    """One batch in the calling thread; its requests on ``sends``, or on an event loop of its
    own (started where the batch runs, closed when it ends) when it is a delivery alone."""
    with ExitStack() as stack:
        stack.enter_context(affinity.pinned(affinity.resolve(settings.delivery_cpu, batches=1)))
        if sends is None:
            sends = stack.enter_context(SendLoop())
        conn = stack.enter_context(db.borrow(pool, db.Role.WORKER, settings))
        worker = _BatchWorker(
            conn,
            run_id,
            pages,
            settings,
            max_wait_seconds=max_wait_seconds,
            stop=stop or threading.Event(),
            sends=sends,
        )
        return worker.run()


def deliver_batch(
    pool: ConnectionPool,
    run_id: str,
    batch: Batch,
    settings: Settings,
    *,
    page_size: int = DEFAULT_PAGE_SIZE,
    max_wait_seconds: float = DEFAULT_MAX_WAIT_SECONDS,
    stop: threading.Event | None = None,
    sends: SendLoop | None = None,
) -> DeliveryCounts:
    """Deliver one batch of a run's outbox messages; ``run_id`` is the attempting run.

    ``batch.run_id`` names the run whose outbox rows these are; it differs from ``run_id``
    when a run is re-executed (the re-execution sends what its parent dispatched).
    """
    return _deliver(
        pool,
        run_id,
        BatchPages(batch, page_size),
        settings,
        max_wait_seconds=max_wait_seconds,
        stop=stop,
        sends=sends,
    )


@dataclass(frozen=True)
class DestinationResult:
    destination_id: str
    claimed: int
    counts: DeliveryCounts
    seconds: float


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
    counts = _deliver(
        pool, run_id, pages, settings, max_wait_seconds=max_wait_seconds, stop=stop, sends=sends
    )
    return DestinationResult(destination_id, pages.claimed, counts, time.monotonic() - started)


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


def deliver_batches(
    pool: ConnectionPool,
    run_id: str,
    batches: list[Batch],
    settings: Settings,
    *,
    stop: threading.Event | None = None,
    **options,
) -> Iterator[tuple[Batch, DeliveryCounts]]:
    """Deliver batches concurrently, one thread per batch: a slow or rate-limited
    destination never holds up another's. Yields each batch's counts as it finishes."""
    stop = stop or threading.Event()

    def one(batch: Batch) -> Callable[[SendLoop], tuple[Batch, DeliveryCounts]]:
        return lambda sends: (
            batch,
            deliver_batch(pool, run_id, batch, settings, stop=stop, sends=sends, **options),
        )

    yield from _in_threads(settings, [one(batch) for batch in batches], stop)


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
    claiming its own pages (round-robin: none waits behind another's backlog), at most
    ``max_rows`` rows in all. Yields each destination's result as it finishes."""
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
