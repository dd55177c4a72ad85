"""A destination's envelope kept on one worker's own sends, as they happen.

The limiter (``media_hooks.outbox.rate_limits``) grants starts on an exact timeline: at most
``burst + rate * t`` in any window of length t. A worker sends each at its granted moment, but
sometimes late: the run's first requests, while its threads all start at once; a grant whose
answer arrived after its moment. The next start, on time, then follows the late one closer
than the envelope allows, and the receiver sees the two bunched (issue 31: on 32 publishers
at 10/s, 25-60 ms of the receiver's 30-55 ms worst excess began at a publisher's first
request). ``SendPace`` is the same leaky bucket on the moments the worker actually sends:
a request that went out late pushes the next one back instead of bunching with it.

It costs no rate while the limits stand. A late send shifts the sends after it by its
lateness, at the rate's spacing: a little later than granted, never less often (by at most
about one interval: an ask that late finds the limiter starting again from it). With a burst
above 1 the worker catches up within the burst. The rate and burst are the destination's as
the worker last read them (``worker.REFRESH_SECONDS``): a raised limit paces this worker's
sends from its next read. Each worker keeps its own sends: two workers of one destination (two
runs at once) each keep theirs.
"""

from __future__ import annotations

import math


class SendPace:
    """The earliest moment (``time.monotonic()``) the next send keeps ``burst + rate * t``
    over this worker's sends: a GCRA of the moments ``sent`` reports."""

    def __init__(self) -> None:
        # The theoretical moment of the next send at the rate (none sent yet: any moment).
        self._due = -math.inf

    def earliest(self, rate_per_second: float, burst: int) -> float:
        """The earliest the next send may go: up to ``burst - 1`` intervals before its due
        moment."""
        return self._due - (burst - 1) / rate_per_second

    def sent(self, at: float, rate_per_second: float) -> None:
        """A request went out at ``at``."""
        self._due = max(self._due, at) + 1 / rate_per_second
