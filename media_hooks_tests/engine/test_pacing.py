"""SendPace: the destination's envelope on a worker's own sends."""

from __future__ import annotations

import random

import pytest

from media_hooks.engine.pacing import SendPace
from media_hooks_tests.envelope import envelope_excess


def _send(pace: SendPace, wanted: float, rate: float, burst: int) -> float:
    """Send at ``wanted`` or, if that is too early, at the pace's earliest; returns when."""
    at = max(wanted, pace.earliest(rate, burst))
    pace.sent(at, rate)
    return at


def test_sends_on_their_granted_moments_are_never_held_back():
    pace = SendPace()
    grants = [0.0, 0.0, 0.0, 0.1, 0.2, 0.3, 0.4]  # a burst of 3, then 10/s
    assert [_send(pace, g, 10, 3) for g in grants] == pytest.approx(grants)


def test_a_late_send_pushes_the_next_instead_of_bunching_with_it():
    pace = SendPace()
    assert _send(pace, 0.0, 10, 1) == 0.0
    assert _send(pace, 0.150, 10, 1) == 0.150  # granted for 0.1, sent 50 ms late
    assert _send(pace, 0.2, 10, 1) == pytest.approx(0.25)  # not 50 ms after the late one
    assert _send(pace, 0.5, 10, 1) == 0.5  # once the lateness has passed, no cost


def test_a_burst_lets_the_worker_catch_up_on_a_late_send():
    pace = SendPace()
    assert _send(pace, 0.0, 10, 3) == 0.0
    assert _send(pace, 0.160, 10, 3) == 0.160  # granted for 0.1, sent 60 ms late
    assert _send(pace, 0.2, 10, 3) == 0.2  # on time again: the burst covers the lateness


@pytest.mark.parametrize("seed", range(20))
def test_any_lateness_keeps_the_envelope_on_the_sends(seed):
    """Grants on the limiter's exact timeline, some sent up to 80 ms late at random: the
    sends, as the pace lets them go, keep burst + rate * t in every window."""
    rng = random.Random(seed)
    rate, burst = rng.choice([(10, 1), (10, 3), (50, 5), (2, 1)])
    pace = SendPace()
    grants = [max(0.0, (n - burst + 1) / rate) for n in range(60)]
    sends: list[float] = []
    for granted in grants:
        late = rng.choice([0.0, 0.0, 0.0, rng.uniform(0, 0.08)])
        # The worker sends in turn: never before its previous send.
        sends.append(_send(pace, max([granted + late, *sends[-1:]]), rate, burst))
    assert envelope_excess(sends, rate=rate, burst=burst, jitter=0.0) <= 1e-9


def test_the_envelope_check_catches_a_doubled_rate_and_allows_only_the_jitter():
    """The check the whole-run tests rely on: starts at twice the rate break it over a longer
    window than the arrival jitter; starts on the rate hold, even when bunched by the jitter."""
    rate, burst = 10.0, 1
    on_rate = [n / rate for n in range(40)]
    doubled = [t / 2 for t in on_rate]
    # Every third start 100 ms late, arriving with the next: two at once, one past the burst.
    bunched = [t + (0.1 if n % 3 == 0 else 0.0) for n, t in enumerate(on_rate)]
    assert envelope_excess(on_rate, rate=rate, burst=burst, jitter=0.0) <= 1e-9
    assert envelope_excess(doubled, rate=rate, burst=burst) > 5
    assert envelope_excess(bunched, rate=rate, burst=burst) <= 0
    assert envelope_excess(bunched, rate=rate, burst=burst, jitter=0.0) > 0.5
