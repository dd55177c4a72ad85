"""Retry backoff: exponential growth, the cap, and bounded jitter."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from media_hooks.core.backoff import backoff_seconds, nominal_schedule, nominal_seconds


def test_nominal_doubles_from_base_until_the_cap() -> None:
    assert [nominal_seconds(n, 5, 28800) for n in (1, 2, 3, 4)] == [5, 10, 20, 40]
    assert nominal_seconds(14, 5, 28800) == 28800
    assert nominal_seconds(10_000, 5, 28800) == 28800


def test_jitter_stays_within_80_percent_of_nominal_and_the_cap() -> None:
    rng = random.Random(7)
    for attempt in range(1, 25):
        nominal = nominal_seconds(attempt, 5, 28800)
        waits = [backoff_seconds(attempt, 5, 28800, rng) for _ in range(300)]
        assert min(waits) >= 0.8 * nominal
        assert max(waits) <= min(1.2 * nominal, 28800)
        # Jitter actually spreads the retries.
        assert max(waits) - min(waits) > 0.1 * nominal


def test_waits_grow_with_attempts() -> None:
    rng = random.Random(1)
    means = [sum(backoff_seconds(n, 5, 28800, rng) for _ in range(200)) / 200 for n in range(1, 14)]
    assert all(later > 1.5 * earlier for earlier, later in zip(means, means[1:], strict=False))


def test_default_schedule_is_seconds_then_minutes_then_hours_over_days() -> None:
    schedule = nominal_schedule(20, 5, 28800)
    assert len(schedule) == 19
    assert schedule[0] == 5 and schedule[6] == 320 and schedule[-1] == 28800
    assert 2 * 86400 < sum(schedule) < 3 * 86400


@pytest.mark.parametrize(("attempt", "base", "cap"), [(0, 5, 10), (1, 0, 10), (1, 10, 5)])
def test_nonsense_arguments_are_refused(attempt: int, base: float, cap: float) -> None:
    with pytest.raises(ValueError):
        backoff_seconds(attempt, base, cap)


# Properties (hypothesis) over every policy a destination can have.

POLICIES = st.tuples(
    st.floats(0.001, 86400, allow_nan=False), st.floats(0.001, 30 * 86400, allow_nan=False)
).map(lambda bc: (min(bc), max(bc)))


@settings(max_examples=500, deadline=None)
@given(policy=POLICIES, attempt=st.integers(1, 10**9), seed=st.integers(0, 2**32))
def test_every_wait_is_within_the_jitter_band_and_never_above_the_cap(policy, attempt, seed):
    base, cap = policy
    nominal = nominal_seconds(attempt, base, cap)
    assert nominal == min(cap, base * 2.0 ** min(attempt - 1, 64))
    wait = backoff_seconds(attempt, base, cap, random.Random(seed))
    assert 0.8 * nominal <= wait <= min(1.2 * nominal, cap)


@settings(max_examples=300, deadline=None)
@given(policy=POLICIES, attempts=st.integers(2, 60))
def test_the_schedule_grows_until_the_cap_and_stays_there(policy, attempts):
    base, cap = policy
    schedule = nominal_schedule(attempts, base, cap)
    assert len(schedule) == attempts - 1
    assert schedule[0] == base
    assert all(a <= b for a, b in zip(schedule, schedule[1:], strict=False))
    assert all(b == min(cap, 2 * a) for a, b in zip(schedule, schedule[1:], strict=False))
