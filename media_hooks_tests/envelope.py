"""The start-rate envelope: no window of starts holds more than ``burst + rate * t``.

The limiter grants on the database's clock (held exactly by the protocol model's invariants);
tests of whole runs read it where a publisher does, at the receiver. Arrival there adds the
host's scheduling to each grant: on a loaded 2-core machine, and with the tests running in
parallel, requests granted 25 ms apart were seen arriving bunched within a few milliseconds.
The allowance keeps those tests about the limiter (a doubled rate still breaks the envelope over
any longer window); how closely starts follow the limit is the benchmark's to measure (its
rate-fidelity section).
"""

from __future__ import annotations

from collections.abc import Iterable

from bench import stats

ARRIVAL_JITTER_SECONDS = 0.15


def envelope_excess(
    starts: Iterable[float], *, rate: float, burst: int, jitter: float = ARRIVAL_JITTER_SECONDS
) -> float:
    """How far the worst window of ``starts`` goes past ``burst + rate * (t + jitter)``: 0 or
    less when the envelope holds (the benchmark's own measure, less the allowance)."""
    excess, _ = stats.envelope_excess(list(starts), rate, burst)
    return excess - rate * jitter
