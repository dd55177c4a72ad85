"""Where a worker's messages come from: its destination's due deliveries, claimed for the run a
page at a time as the worker runs out (``DuePages``), under the run's row cap (``RowBudget``).

A page is claimed and published in one statement (``claims.claim_destination_page``), so what
a worker holds is always in the outbox under its run's id: a run that dies leaves rows the
run-failure release and the enqueue sweep find (invariant 3).
"""

from __future__ import annotations

import threading
from typing import Protocol

import psycopg

from media_hooks.outbox import claims
from media_hooks.outbox.cohort import Cohort
from media_hooks.outbox.leases import Message


class Pages(Protocol):
    """A source of one destination's outbox messages, a page at a time."""

    destination_id: str

    def next_page(self, conn: psycopg.Connection) -> list[Message]:
        """The next page of claimed, published messages ([] when there are no more)."""

    def stop(self) -> None:
        """Claim nothing more: the worker is handing back what it holds."""


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
    runs out of messages. Claiming stops at the first page that comes back
    short (nothing more was due), when the run's row budget is spent, or when the worker stops
    (it then hands back what it holds and claims nothing)."""

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
        return page

    def stop(self) -> None:
        self.done = True
