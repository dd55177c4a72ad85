"""From an answer to a recorded outcome: what each attempt means for its delivery and its
destination, and the worker's outcomes recorded in batches, fenced by their leases.

An outcome is recorded by one statement for many (``leases.record``): a success or a dead
end is conditional on the lease the worker holds (invariant 4), a retry moves only
``next_attempt_at`` and the budget (invariant 5). An outcome waits at most
``RECORD_MAX_DELAY_SECONDS`` however long its neighbours take, and a destination's signal (a
429, a 410, an address the SSRF guard refused) is recorded, and acted on, at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import psycopg

from media_hooks.core import backoff, crashpoints
from media_hooks.engine.counts import DeliveryCounts
from media_hooks.http import outcomes
from media_hooks.http.sender import AttemptResult
from media_hooks.outbox import destinations, leases
from media_hooks.outbox.destinations import Destination
from media_hooks.outbox.leases import Lease, Outcome
from media_hooks.store import db

# Outcomes are recorded in batches of up to this many, and none waits longer than the delay.
RECORD_BATCH = 100
RECORD_MAX_DELAY_SECONDS = 0.2
# Outcomes are retried until this long before the first of their leases ends.
RECORD_DEADLINE_MARGIN_SECONDS = 5.0
ALLOW_PRIVATE_SETTING = "MEDIA_HOOKS_ALLOW_PRIVATE_URLS=1"
# No retry or pause is ever scheduled further out than the longest backoff cap allowed: a
# destination changed under a running worker cannot make a due time overflow.
LONGEST_DELAY_SECONDS = destinations.RANGES["backoff_cap_seconds"].allowed.high


class OutcomesNotRecorded(Exception):
    """Finished attempts whose outcomes the database would not record (not a passing lock or
    timeout: those are retried while the leases hold). Retrying the step would not record
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
    """A lease whose request was never started (the worker stopped between lease and send)."""
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


@dataclass(frozen=True)
class Signals:
    """What a batch of answers asks of their destination: a pause (seconds, why) for every
    process, and reasons to disable it until an operator enables it."""

    pause: tuple[float, str] | None = None
    disable: list[str] = field(default_factory=list)


def _configuration_reason(result: AttemptResult) -> str:
    """A destination's disabled reason for an address the SSRF guard refused: which address,
    and which setting allows it."""
    reason = f"configuration: {result.error} (at connect time"
    if ALLOW_PRIVATE_SETTING not in (result.error or ""):
        reason += f"; {ALLOW_PRIVATE_SETTING} in the workers' environment allows private addresses"
    return reason + "); enable it once the URL or the setting is fixed"


def destination_signals(results: Iterable[AttemptResult], destination: Destination) -> Signals:
    """A 429 / 503 + Retry-After pauses the destination (for the longest asked); a 410
    disables it, and so does an address the SSRF guard refused (a configuration fault)."""
    results = list(results)
    pause = None
    limited = [r for r in results if r.outcome == outcomes.RATE_LIMITED]
    if limited:
        longest = max(limited, key=lambda r: r.retry_after_seconds or 0.0)
        seconds = longest.retry_after_seconds
        if seconds is None:
            seconds = bare_pause_seconds(destination)
            why = f"HTTP {longest.http_status} without Retry-After: {seconds:.0f} s"
        else:
            why = f"HTTP {longest.http_status} with Retry-After {seconds:.0f} s"
        pause = (seconds, why) if seconds > 0 else None
    disable = []
    gone = next((r for r in results if r.disable_destination), None)
    if gone is not None:
        disable.append(
            f"receiver answered HTTP {gone.http_status} (Gone) at "
            f"{gone.finished_at:%Y-%m-%d %H:%M:%S} UTC"
        )
    refused = next((r for r in results if r.configuration_fault), None)
    if refused is not None:
        disable.append(_configuration_reason(refused))
    return Signals(pause, disable)


def _is_signal(result: AttemptResult | None) -> bool:
    return result is not None and (
        result.outcome == outcomes.RATE_LIMITED
        or result.disable_destination
        or result.configuration_fault
    )


class Recorder:
    """A worker's finished attempts until they are recorded, and when each lease ends: an
    outcome is retried until shortly before its lease does, and then given up as
    ``OutcomesNotRecorded`` (the lease's expiry makes the delivery due again as ambiguous)."""

    def __init__(self, conn: psycopg.Connection, counts: DeliveryCounts) -> None:
        self.conn = conn
        self.counts = counts
        # Finished attempts with their answers (None for a lease never sent).
        self.finished: list[tuple[Outcome, AttemptResult | None]] = []
        self.lease_ends: dict[str, float] = {}
        # Set when the database refused the outcomes outright: not tried again on the way out.
        self.refused = False

    def leased(self, taken: Iterable[Lease], ends_monotonic: float) -> None:
        for lease in taken:
            self.lease_ends[lease.delivery_id] = ends_monotonic

    def add(self, outcome: Outcome, result: AttemptResult | None) -> None:
        self.finished.append((outcome, result))

    def _oldest(self) -> float:
        return min(outcome.finished_monotonic for outcome, _ in self.finished)

    def due(self, idle: bool) -> bool:
        """Whether to record now: the worker is idle, a batch is full, a destination's
        signal waits, or the oldest outcome has waited its longest."""
        if not self.finished:
            return False
        if idle or len(self.finished) >= RECORD_BATCH:
            return True
        if any(_is_signal(result) for _, result in self.finished):
            return True
        return time.monotonic() - self._oldest() >= RECORD_MAX_DELAY_SECONDS

    def seconds_until_due(self) -> float | None:
        """How long until the oldest outcome is due to be recorded (None: nothing waits)."""
        if not self.finished:
            return None
        return max(self._oldest() + RECORD_MAX_DELAY_SECONDS - time.monotonic(), 0.0)

    def record(self) -> list[AttemptResult]:
        """Records every finished outcome in one statement and counts them; returns the
        answers recorded, whose signals the worker applies to its destination."""
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
            self.refused = True
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
        return [result for _, result in finished if result is not None]
