"""The per-destination loop: one destination's deliveries of a run, from the outbox to
recorded outcomes.

For each page its ``Pages`` hand over, the worker takes permits from the destination's global
limits, leases as many deliveries as it got permits, hands them to the run's event loop (one
pooled HTTP session per destination, ``media_hooks.http.send_loop``), each at the moment its
start was granted for (the limiter may grant a start a little ahead; one sent late pushes the
next back, ``engine.pacing``), and has what finished recorded (``recording.Recorder``). No
transaction is open while a request is in flight (invariant 7), and a worker waiting for
permits holds no lease (it leases only what it can send now).

The destination is read again at every page and at least every ``REFRESH_SECONDS``: a changed
URL, secret, timeout or limit takes effect then (a disabled or paused destination, and the
rate and in-flight limits, at the next permit: they are read by every grant). Settings the
engine cannot honour, and an address the SSRF guard refuses at connect time, are configuration
faults: the destination is disabled saying why, and its deliveries wait, pending, with their
retry budget intact.

A destination's failures are data: they are recorded and counted, never raised. Only
infrastructure faults (the database, a bug) raise, and then whatever the worker holds is
handed back first (``_settle``): every request in flight is waited for and its outcome
recorded, a lease that was never sent is recorded as not sent, and every permit is returned.
A statement that meets a lock or a timeout is retried (``media_hooks.store.db.retrying``);
outcomes keep being retried for as long as their leases hold. Outcomes the database refuses
outright raise ``OutcomesNotRecorded``, which must not be retried (retrying the step would
leave them to lease expiry and hide the failure).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

import psycopg

from media_hooks.core import crashpoints
from media_hooks.core.config import Settings
from media_hooks.engine.counts import DeliveryCounts
from media_hooks.engine.pacing import SendPace
from media_hooks.engine.pages import Pages
from media_hooks.engine.recording import Recorder, not_sent, to_outcome
from media_hooks.http.send_loop import SendLoop
from media_hooks.http.sender import Sender
from media_hooks.http.signing import InvalidSecret
from media_hooks.outbox import destinations, leases, rate_limits
from media_hooks.outbox.destinations import Destination, disable_destination, get_destination
from media_hooks.outbox.leases import Lease, Message
from media_hooks.store import db

log = logging.getLogger("media_hooks")
T = TypeVar("T")

# Margin a lease keeps beyond the longest a send can take, for recording the outcome.
LEASE_MARGIN_SECONDS = 2.0
# How long a worker waits for permits (rate, in-flight, a short pause) before it hands the
# rest of its work back to pending for a later run.
DEFAULT_MAX_WAIT_SECONDS = 60.0
GATHER_SECONDS = 0.002
# A running worker reads its destination again at every page and at least this often.
REFRESH_SECONDS = 5.0
# While a start waits for its moment, outcomes are recorded only this long or more before it:
# a recording statement takes a few ms, tens on a loaded machine. Closer, they wait for the
# send (at most this long plus the send), so no outcome waits long enough to risk its lease.
RECORD_MARGIN_SECONDS = 0.1


def lease_seconds_for(destination: Destination, sender: Sender, settings: Settings) -> float:
    """The configured lease, stretched if this destination's sends could outlast it."""
    return max(settings.lease_seconds, sender.worst_case_seconds + LEASE_MARGIN_SECONDS)


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


class DestinationWorker:
    """Delivers one destination's messages from ``pages`` for ``run_id``."""

    def __init__(
        self,
        conn: psycopg.Connection,
        run_id: str,
        pages: Pages,
        settings: Settings,
        *,
        max_wait_seconds: float,
        stop: threading.Event,
        sends: SendLoop,
    ) -> None:
        self.conn = conn
        # The run's event loop, where every request of the worker is in flight.
        self.sends = sends
        self.run_id = run_id
        self.pages = pages
        self.destination_id = pages.destination_id
        self.settings = settings
        self.max_wait_seconds = max_wait_seconds
        # Set when the run is stopped (canceled): the worker hands back what it holds at once.
        self.stop = stop
        # Every worker of a run holds its permits under the run's id, so the run's failure
        # handling can free them at once (sweeps.release_run) instead of waiting out the holds.
        self.holder = run_id
        self.counts = DeliveryCounts()
        self.recorder = Recorder(conn, self.counts)
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
        # their start was granted for; and requests in flight, with their slot.
        self.unsent: list[tuple[Lease, int, float]] = []
        self.in_flight: dict[Future, tuple[Lease, int]] = {}
        # Requests in flight that have finished, as they finish: waiting on this costs one
        # wake-up per answer, where waiting on every future in flight costs a lock on each.
        self.answers: queue.SimpleQueue[Future] = queue.SimpleQueue()
        # The permits of finished requests, handed back with the next ask.
        self.returned_slots: list[int] = []
        # The database's clock here: when to send a start granted for a moment on it.
        self.clock = rate_limits.DatabaseClock()
        # The destination's envelope on this worker's own sends: a late one pushes the next.
        self.pace = SendPace()
        self.wait_started: float | None = None
        # The last answer of the limiter, and when (monotonic) asking again is worth a round
        # trip (_ask_delay): a request finishing before then does not make the worker ask.
        self.grant = rate_limits.Grant()
        self.next_ask_at = 0.0
        # Why this worker sends nothing more (it disabled its destination), once it does not.
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
        configuration fault); this worker sends nothing more and hands the rest back."""
        if self.destination is not None and self.destination.enabled:
            log.warning("disabling destination %s: %s", self.destination_id, reason)
            self._db("disable destination", disable_destination, self.destination_id, reason)
        self.stopped = reason

    # Pages ---------------------------------------------------------------------------------

    def _next_page(self) -> list[Message]:
        page = self.pages.next_page(self.conn)
        if page:
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
        self.clock.observe(step.grant.answered_at, answered)
        starts = [self.clock.monotonic_at(at) for at in step.grant.start_at]
        self.unsent = list(zip(step.leases, step.grant.slots, starts, strict=True))
        self.recorder.leased(step.leases, answered + self.lease_seconds)
        if self.unsent:
            crashpoints.hit(crashpoints.AFTER_LEASE_BEFORE_REQUEST)
        while self.unsent:
            lease, slot, start_at = self.unsent[0]
            rate, burst = self.destination.rate_per_second, self.destination.burst
            start_at = max(start_at, self.pace.earliest(rate, burst))
            if self._wait_for_start(start_at) or self.stopped is not None:
                break  # the loop hands the unsent leases back
            future = self.sender.submit(lease.delivery_id, lease.body)
            self.pace.sent(time.monotonic(), rate)
            self.in_flight[future] = (lease, slot)
            future.add_done_callback(self.answers.put)
            self.unsent.pop(0)
        # Just sent: the next start is furthest away, the moment to record what waits.
        if self._record_due():
            self._record()
        return step.grant, step.examined

    def _wait_for_start(self, start_at: float) -> bool:
        """Wait until ``start_at`` (``time.monotonic()``), the moment the limiter granted a
        start for (it may grant one a little ahead, and ``pace`` may push it back), taking
        meanwhile whatever finishes; True if the run was stopped first.

        What falls due for recording with ``RECORD_MARGIN_SECONDS`` to spare before the start
        is recorded then; what falls due closer to it waits for the send (``_step`` records it
        next): a statement started then could end after the start's moment, and the request,
        sent late, would reach the receiver bunched with the next one (on 32 publishers at
        10/s, half or more of the sends over 10 ms late had waited behind a recording: issue
        31). A destination's signal (a 429, a 410, a refused address) is recorded at once.
        """
        while (left := start_at - time.monotonic()) > 0:
            bound = self._wait_bound(rate_limits.Grant())
            timeout = left if bound is None or bound >= left - RECORD_MARGIN_SECONDS else bound
            if self.in_flight:
                self._collect(timeout=timeout, record=False)
            elif self.stop.wait(timeout):
                return True
            spare = start_at - time.monotonic() > RECORD_MARGIN_SECONDS
            if self._record_due() and (spare or self.recorder.signal_waiting()):
                self._record()
        return self.stop.is_set()

    def _take(self, future: Future, lease: Lease, slot: int) -> None:
        result = future.result()
        self.recorder.add(to_outcome(lease, result), result)
        self.returned_slots.append(slot)

    def _collect(self, timeout: float | None, *, record: bool = True) -> None:
        """Wait for at least one request to finish (or ``timeout``) and take what finished.

        Their permits go back with the next ask; their outcomes are recorded in batches
        (``_record``; when due, unless ``record`` is False), since one statement for many
        outcomes costs little more than for one.
        """
        done = self._answered(timeout)
        for future in done:
            self._take(future, *self.in_flight.pop(future))
        if done and self.grant.reason == "in flight":
            self.next_ask_at = 0.0  # a slot of its own is free: what the worker waited for
        if record and self._record_due():
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

    def _record_due(self) -> bool:
        idle = not self.in_flight and not self.waiting and self.pages_exhausted
        return self.recorder.due(idle)

    def _record(self) -> None:
        stopped = self.recorder.record()
        if stopped is not None and self.stopped is None:
            # A 410 or a refused address disabled the destination in the same statement.
            log.warning("destination %s disabled: %s", self.destination_id, stopped)
            self.stopped = stopped

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
        due = self.recorder.seconds_until_due()
        if due is not None:
            bounds.append(due)
        return min(bounds) if bounds else None

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

    # Deferring ---------------------------------------------------------------------------

    def _defer_rest(self, grant: rate_limits.Grant, why: str | None = None) -> None:
        """Hand every unsent message back to pending, due when worth trying: at the end of the
        destination's pause (as stored), or after the grant's wait."""
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
                if self.recorder.finished:
                    self._record()  # nothing is in flight: record while waiting for a permit
                self.stop.wait(max(self.next_ask_at - time.monotonic(), 0.001))

    # Handing back ------------------------------------------------------------------------

    def _settle(self, failure: BaseException | None) -> None:
        """However the worker ends: every request in flight is waited for and taken, a lease
        never sent is recorded as not sent, every outcome is recorded (unless the database
        refused them outright), every permit goes back, and senders are closed. After a
        failure, a further failure here is logged and the first one is raised."""
        try:
            try:
                for lease, slot, _ in self.unsent:
                    self.recorder.add(not_sent(lease, failure or RuntimeError()), None)
                    self.returned_slots.append(slot)
                self.unsent = []
                for future, (lease, slot) in list(self.in_flight.items()):
                    self._take(future, lease, slot)  # a send ends within its timeouts
                self.in_flight.clear()
                if self.recorder.finished and not self.recorder.refused:
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
