"""The chaos soak's publisher: ``media_hooks.devtools.receiver.Receiver`` answering at random, and what it
saw, per destination, for the soak's table (``bench.soak``).

Each request draws an answer: mostly 200; 429 with and without Retry-After; 503; 500; a 200
that comes after the sender's timeout (the effect is committed first); a commit whose
connection is dropped without an answer. A few deliveries (chosen by id, so every attempt of one
gets the same answer) are refused for good with a 422. The receiver deduplicates by
``webhook-id`` as a cooperating publisher does: a repeated id gets the first answer again and
has no new effect.
"""

from __future__ import annotations

import hashlib
import random
import threading
from collections import defaultdict
from dataclasses import dataclass

from bench.stats import envelope_excess
from media_hooks.devtools.receiver import ReceivedRequest, Receiver, Reply, RequestInfo

# Cumulative chances of each answer (the rest: 200 at once).
ANSWERS = (
    (0.03, "429 with Retry-After"),
    (0.05, "429 without Retry-After"),
    (0.08, "503"),
    (0.12, "500"),
    (0.14, "slow past the timeout"),
    (0.16, "commit, then drop the connection"),
)
# One delivery in this many is refused for good (422), on every attempt.
REJECTED_ONE_IN = 200
# Arrival times are the receiver's: a start granted by the limiter arrives later by however
# long the sender's and the receiver's threads wait for a core, so starts granted apart may
# arrive together, up to max_in_flight of them. On this loaded 2-core machine (load average
# 10-40 while other suites run) windows of 0.27 s held 3.3 starts more than the envelope
# with 8 in flight (the excess grows with what may be in flight, as bunching does; a hole
# bounded by the in-flight ceiling would too: not settled). Every window may hold rate x jitter + 1 more. The exact proof of the limiter is the
# interleaving tests (test_state_machine, test_rate_limits).
ARRIVAL_JITTER_SECONDS = 0.4


def rejected(delivery_id: str) -> bool:
    digest = hashlib.sha256(delivery_id.encode()).digest()
    return int.from_bytes(digest[:4], "big") % REJECTED_ONE_IN == 0


@dataclass(frozen=True)
class Limits:
    rate_per_second: float
    burst: int
    max_in_flight: int
    timeout_seconds: float


class ChaosPublisher:
    """A receiver on a fixed port (so an outage can end on the same address)."""

    def __init__(self, port: int, limits: Limits, seed: int) -> None:
        self.limits = limits
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        # destination -> (arrived, finished) of each request; webhook-id -> duplicates.
        self._intervals: dict[str, list[tuple[float, float]]] = defaultdict(list)
        self.duplicates: dict[str, int] = defaultdict(int)
        self.answers: dict[str, int] = defaultdict(int)
        self.receiver = Receiver(port=port, script=self._answer, on_request=self._seen, history=1)

    def _answer(self, info: RequestInfo) -> Reply:
        if rejected(info.webhook_id):
            return self._count("422 (refused for good)", Reply(422, body=b'{"error": "invalid"}'))
        with self._lock:
            draw = self._rng.random()
        late = self.limits.timeout_seconds + 1.0
        replies = {
            "429 with Retry-After": Reply(429, headers={"Retry-After": "1"}),
            "429 without Retry-After": Reply(429),
            "503": Reply(503),
            "500": Reply(500),
            "slow past the timeout": Reply(200, delay_seconds=late),
            "commit, then drop the connection": Reply(drop=True),
        }
        for chance, name in ANSWERS:
            if draw < chance:
                return self._count(name, replies[name])
        return self._count("200", Reply())

    def _count(self, name: str, reply: Reply) -> Reply:
        with self._lock:
            self.answers[name] += 1
        return reply

    def _seen(self, request: ReceivedRequest) -> None:
        destination = request.path.strip("/")
        with self._lock:
            self._intervals[destination].append(
                (request.arrived_monotonic, request.finished_monotonic)
            )
            if request.duplicate and request.webhook_id:
                self.duplicates[request.webhook_id] += 1

    def start(self) -> None:
        self.receiver.start()

    def stop(self) -> None:
        self.receiver.stop()

    @property
    def url(self) -> str:
        return self.receiver.url

    def requests(self) -> int:
        return self.receiver.request_count

    def violations(self) -> dict[str, dict[str, float]]:
        """Per destination: the worst excess of starts over the start-rate envelope (more than
        the jitter allows is a violation) and the most requests in flight at once (a request
        counts until it was answered or its sender's timeout passed, whichever came first)."""
        limits = self.limits
        found = {}
        with self._lock:
            intervals = {d: list(v) for d, v in self._intervals.items()}
        for destination, spans in intervals.items():
            excess, window = envelope_excess(
                [a for a, _ in spans], limits.rate_per_second, limits.burst
            )
            allowed = 1 + limits.rate_per_second * ARRIVAL_JITTER_SECONDS
            found[destination] = {
                "rate_excess": round(excess, 2),
                "rate_excess_window_seconds": round(window, 3),
                "rate_violation": excess > allowed,
                "max_in_flight": _most_at_once(spans, limits.timeout_seconds),
            }
        return found


def _most_at_once(spans: list[tuple[float, float]], timeout: float) -> int:
    events = []
    for arrived, finished in spans:
        events.append((arrived, 1))
        # A sender that timed out gave up at its timeout, counted from before the request
        # arrived; its permit may then go to the next request while this one still sleeps.
        gave_up = arrived + timeout - ARRIVAL_JITTER_SECONDS
        events.append((finished if finished < gave_up else gave_up, -1))
    most = current = 0
    for _, change in sorted(events, key=lambda e: (e[0], e[1])):
        current += change
        most = max(most, current)
    return most
