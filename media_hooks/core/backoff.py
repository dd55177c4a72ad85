"""Retry backoff: exponential, capped, jittered.

A delivery's retries are scheduled by the database (media_hooks_backoff_seconds_v1, migration
0017), by this same rule, so that every runtime schedules them alike; this module keeps the
rule for the engine's own retries (a migration waiting for its lock) and as the reference the
database's schedule is tested against (media_hooks_tests/test_state_machine_in_sql.py).

After attempt ``n`` fails, the next is due in ``d = min(cap, base * 2**(n-1))`` seconds,
jittered uniformly over ``[0.8 d, min(1.2 d, cap)]``: the jitter spreads a burst of failures
(a receiver's outage) so the retries do not come back in lockstep, never waits above ``cap``
and never below 80 % of the nominal delay, so the schedule keeps its shape.

With the schema's defaults (base 5 s, cap 28,800 s = 8 h, max_attempts 20) the nineteen waits
are nominally 5 s, 10 s, 20 s, 40 s, 80 s, 160 s, 5.3 min, 10.7 min, 21 min, 43 min, 85 min,
2.8 h, 5.7 h, then 8 h six times: seconds, then minutes, then hours, like the Standard
Webhooks schedule. Nominal total 59.4 h (jittered between 47.5 h and 61.7 h: two to two and
a half days); the delivery's maximum age (72 h by default) ends it in any case.
"""

from __future__ import annotations

import random

JITTER_LOW = 0.8
JITTER_HIGH = 1.2

_shared_rng = random.Random()


def nominal_seconds(attempt_no: int, base: float, cap: float) -> float:
    """The unjittered wait after failed attempt ``attempt_no`` (1 = the first attempt)."""
    if attempt_no < 1:
        raise ValueError(f"attempt_no must be at least 1, got {attempt_no}")
    if base <= 0 or cap < base:
        raise ValueError(f"backoff needs 0 < base <= cap, got base={base} cap={cap}")
    # The exponent is bounded so a huge attempt number cannot overflow a float.
    return min(cap, base * 2.0 ** min(attempt_no - 1, 64))


def backoff_seconds(
    attempt_no: int, base: float, cap: float, rng: random.Random | None = None
) -> float:
    """The jittered wait after failed attempt ``attempt_no``."""
    nominal = nominal_seconds(attempt_no, base, cap)
    return (rng or _shared_rng).uniform(JITTER_LOW * nominal, min(JITTER_HIGH * nominal, cap))


def nominal_schedule(max_attempts: int, base: float, cap: float) -> list[float]:
    """The nominal waits between ``max_attempts`` attempts (one fewer than attempts)."""
    return [nominal_seconds(n, base, cap) for n in range(1, max_attempts)]
