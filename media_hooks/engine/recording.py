"""From an answer to a recorded outcome: each attempt classified as the contract says, and the
worker's outcomes recorded in batches, fenced by their leases.

The runtime only classifies (``to_outcome``); the database decides everything that follows
(``leases.record_classified``, migration 0017): the next state, when it is due (backoff with
jitter, Retry-After), the retry budget and maximum age, a pause of the destination for every
process, and a destination disabled by a 410 or an address the SSRF guard refused. One
statement records many outcomes: a success or a dead end is conditional on the lease the worker
holds (invariant 4), a retry moves only ``next_attempt_at`` and the budget (invariant 5). An
outcome waits at most ``RECORD_MAX_DELAY_SECONDS`` however long its neighbours take (or, when
that falls just before a start's moment, until that request is sent: ``engine.worker``), and a
destination's signal (a 429, a 410, a refused address) is recorded, and acted on, at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import psycopg

from media_hooks.core import crashpoints
from media_hooks.engine.counts import DeliveryCounts
from media_hooks.http import outcomes
from media_hooks.http.sender import AttemptResult
from media_hooks.outbox import leases
from media_hooks.outbox.leases import Classified, Lease
from media_hooks.store import db

# Outcomes are recorded in batches of up to this many, and none waits longer than the delay.
RECORD_BATCH = 100
RECORD_MAX_DELAY_SECONDS = 0.2
# Outcomes are retried until this long before the first of their leases ends.
RECORD_DEADLINE_MARGIN_SECONDS = 5.0


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


def to_outcome(lease: Lease, result: AttemptResult) -> Classified:
    """What the attempt came to, as the runtime saw it; nothing decided."""
    return Classified(
        lease=lease,
        outcome=result.outcome,
        http_status=result.http_status,
        retry_after_seconds=result.retry_after_seconds,
        error=result.error,
        response_excerpt=result.response_excerpt,
        finished_monotonic=result.finished_monotonic,
        configuration_fault=result.configuration_fault,
    )


def not_sent(lease: Lease, why: BaseException) -> Classified:
    """A lease whose request was never started (the worker stopped between lease and send):
    its unit of retry budget goes back."""
    return Classified(
        lease=lease,
        outcome=outcomes.RETRYABLE,
        http_status=None,
        retry_after_seconds=None,
        error=f"not sent: the batch stopped first ({type(why).__name__}: {why})"[:500],
        response_excerpt=None,
        finished_monotonic=time.monotonic(),
        attempted=False,
    )


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
        self.finished: list[tuple[Classified, AttemptResult | None]] = []
        self.lease_ends: dict[str, float] = {}
        # Set when the database refused the outcomes outright: not tried again on the way out.
        self.refused = False

    def leased(self, taken: Iterable[Lease], ends_monotonic: float) -> None:
        for lease in taken:
            self.lease_ends[lease.delivery_id] = ends_monotonic

    def add(self, outcome: Classified, result: AttemptResult | None) -> None:
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
        if self.signal_waiting():
            return True
        return time.monotonic() - self._oldest() >= RECORD_MAX_DELAY_SECONDS

    def signal_waiting(self) -> bool:
        """Whether a destination's signal (a 429, a 410, a refused address) waits."""
        return any(_is_signal(result) for _, result in self.finished)

    def seconds_until_due(self) -> float | None:
        """How long until the oldest outcome is due to be recorded (None: nothing waits)."""
        if not self.finished:
            return None
        return max(self._oldest() + RECORD_MAX_DELAY_SECONDS - time.monotonic(), 0.0)

    def record(self) -> str | None:
        """Records every finished outcome in one statement and counts them; returns why the
        destination was disabled when these outcomes disabled it (a 410, a refused address)."""
        crashpoints.hit(crashpoints.AFTER_RESPONSE_BEFORE_RECORD)
        finished = self.finished
        batch = [outcome for outcome, _ in finished]
        deadline = (
            min(self.lease_ends[o.lease.delivery_id] for o in batch)
            - RECORD_DEADLINE_MARGIN_SECONDS
        )
        try:
            recorded = db.retrying(
                "record outcomes",
                lambda: leases.record_classified(self.conn, batch),
                until=deadline,
            )
        except (psycopg.Error, db.DatabaseBusy) as exc:
            self.refused = True
            raise OutcomesNotRecorded([o.lease.delivery_id for o in batch], exc) from exc
        self.finished = []
        for outcome in batch:
            self.lease_ends.pop(outcome.lease.delivery_id, None)
            state = recorded.states.get(outcome.lease.delivery_id)
            if state is None:
                self.counts.skipped += 1  # our lease expired and someone else owns it now
            elif outcome.spare:
                self.counts.count_spared(outcome.configuration_fault)
            else:
                self.counts.count(outcome.outcome, state)
        return recorded.stopped
