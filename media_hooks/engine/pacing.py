"""A destination's envelope kept on one worker's own sends, as they happen.

The limiter (``media_hooks.outbox.rate_limits``) grants starts on an exact timeline: at most
``burst + rate * t`` in any window of length t. A worker sends each at its granted moment, but
sometimes late: behind a statement of its own, while its threads all start at once, or when a
grant's answer arrives after its moment. The next start, on time, then follows the late one
closer than the envelope allows, and the receiver sees the two bunched. On 32 publishers at
10/s (issue 31; six runs of the local arrangement, load average 0.5 to 5) the worst window at
the receiver was 69-217 ms over the envelope, 64-74 ms of it already at the moments the
worker handed its requests to the send loop. ``SendPace`` is the same leaky bucket on the
moments the worker actually sends: a request that went out late pushes the next one back
instead of bunching with it. With it the hand-overs kept the envelope in every run, and the
receiver's worst window was 32-100 ms: what remains is the send loop's and the receiver's own
scheduling on the machine's 2 shared cores.

A late send shifts the sends after it by its lateness, at the rate's spacing: later than
granted, not less often. Only when the lateness it carries grows past about an interval does
it cost rate: the next ask then finds the limiter's moment passed and the limiter starts again
from it (0.989-0.997 of the limits in those runs, against 0.999-1.001 without). With a burst
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
