"""The engine's behaviour, held by both runtimes: every test here runs once with the Python
engine and once with the Node.js worker (the ``deliver`` fixture, conftest.py), against real
PostgreSQL and the project's receiver on 127.0.0.1.

Every due delivery signed and sent once, the contract's outcome table answer by answer, the same key and bytes on every attempt, a
pause or a 410 handing the rest of the destination back, the in-flight and start-rate limits,
and the SSRF guard at connect time."""

from __future__ import annotations

import base64
from datetime import UTC, datetime

import pytest

from media_hooks.devtools.receiver import Receiver, Reply, by_attempt
from media_hooks.observe import figures
from media_hooks.outbox import rate_limits
from media_hooks.outbox.destinations import list_destinations
from media_hooks_tests.envelope import ARRIVAL_JITTER_SECONDS, envelope_excess
from media_hooks_tests.factories import add_deliveries, add_destination, delivery, states


def _attempts(conn, delivery_id: str) -> list[dict]:
    return conn.execute(
        "SELECT * FROM delivery_attempt_all WHERE delivery_id = %s ORDER BY attempt_no",
        (delivery_id,),
    ).fetchall()


SECRET = "whsec_" + base64.b64encode(b"conformance-test-secret-0123456").decode()


def _make_due(conn) -> None:
    conn.execute("UPDATE webhook_delivery_all SET next_attempt_at = now() WHERE state = 'pending'")
    conn.execute("UPDATE webhook_destination SET paused_until = NULL")


def test_every_due_delivery_is_delivered_signed_once(deliver, conn):
    with Receiver(secrets=[SECRET]) as receiver:
        for name in ("cdn", "rights"):
            add_destination(
                conn, name, url=receiver.url, secrets=[SECRET], rate_per_second=500, burst=50
            )
            add_deliveries(conn, name, 20)

        counts = deliver("cdn", "rights", run_id="run-1")

        assert {d: c["succeeded"] for d, c in counts.items()} == {"cdn": 20, "rights": 20}
        assert states(conn) == {"succeeded": 40}
        assert receiver.effects == 40 and receiver.request_count == 40
        assert all(r.verified for r in receiver.requests)
        assert all(r.webhook_id == r.idempotency_key for r in receiver.requests)
        for request in receiver.requests:
            assert request.body == bytes(delivery(conn, request.webhook_id)["body"])
    outbox = conn.execute(
        "SELECT count(*) AS n, count(published_at) AS published, "
        "array_agg(DISTINCT run_id) AS runs FROM dispatch_outbox"
    ).fetchone()
    assert outbox == {"n": 40, "published": 40, "runs": ["run-1"]}
    attempt = _attempts(conn, "d-cdn-1")[0]
    assert (attempt["run_id"], attempt["outcome"], attempt["http_status"]) == (
        "run-1",
        "success",
        200,
    )
    assert rate_limits.in_flight(conn, "cdn") == []


# The contract's outcome table, answer by answer -------------------------------------------------

OVERSIZED = b"x" * (1024 * 1024)

# case: (reply, destination settings, state, outcome, http status, error words)
ANSWERS = {
    "2xx": (Reply(status=204, body=b""), {}, "succeeded", "success", 204, None),
    "4xx": (Reply(status=400), {}, "dead", "rejected", 400, "HTTP 400"),
    "410": (Reply(status=410), {}, "dead", "rejected", 410, "HTTP 410"),
    "429-retry-after": (
        Reply(status=429, headers={"Retry-After": "120"}),
        {},
        "pending",
        "rate_limited",
        429,
        "HTTP 429",
    ),
    "429-bare": (
        Reply(status=429),
        {"backoff_base_seconds": 30},
        "pending",
        "rate_limited",
        429,
        "HTTP 429",
    ),
    "503-retry-after": (
        Reply(status=503, headers={"Retry-After": "60"}),
        {},
        "pending",
        "rate_limited",
        503,
        "HTTP 503",
    ),
    "5xx": (Reply(status=502), {}, "pending", "retryable", 502, "HTTP 502"),
    "503-bare": (Reply(status=503), {}, "pending", "retryable", 503, "HTTP 503"),
    "timeout": (
        Reply(delay_seconds=1.0),
        {"timeout_seconds": 0.3},
        "pending",
        "ambiguous",
        None,
        "timeout",
    ),
    "dropped": (Reply(drop=True), {}, "pending", "ambiguous", None, "connection"),
    "redirect": (
        Reply(status=302, headers={"Location": "http://127.0.0.1:9/elsewhere"}),
        {},
        "dead",
        "rejected",
        302,
        "HTTP 302",
    ),
    "oversized-body": (Reply(body=OVERSIZED), {}, "succeeded", "success", 200, None),
}


@pytest.mark.parametrize("case", list(ANSWERS))
def test_each_answer_is_recorded_as_the_contract_says(deliver, conn, case):
    reply, settings, state, outcome, status, words = ANSWERS[case]
    with Receiver(reply=reply) as receiver:
        add_destination(conn, "cdn", url=receiver.url, **settings)
        add_deliveries(conn, "cdn", 1)
        before = datetime.now(UTC)
        counts = deliver("cdn")["cdn"]
        # One request (a slow answer's is logged when it ends): no redirect followed, no resend.
        assert receiver.wait_for_requests(1, timeout=10) and receiver.request_count == 1

    row = delivery(conn, "d-cdn-1")
    (attempt,) = _attempts(conn, "d-cdn-1")
    assert (row["state"], row["last_outcome"]) == (state, outcome)
    assert (attempt["outcome"], attempt["http_status"]) == (outcome, status)
    if words is None:
        assert attempt["error"] is None
    else:
        assert words.lower() in attempt["error"].lower()
    assert counts["attempted"] == 1
    assert counts["ambiguous"] == (1 if outcome == "ambiguous" else 0)
    destination = conn.execute("SELECT * FROM webhook_destination").fetchone()
    assert destination["enabled"] is (case != "410")
    if case == "410":
        assert "receiver answered HTTP 410 (Gone)" in destination["disabled_reason"]
    if outcome == "rate_limited":
        wait = {"429-retry-after": 120, "429-bare": 30, "503-retry-after": 60}[case]
        assert row["budget_used"] == 0  # rate limits do not spend the retry budget
        assert (row["next_attempt_at"] - before).total_seconds() == pytest.approx(wait, abs=5)
        assert (destination["paused_until"] - before).total_seconds() == pytest.approx(wait, abs=5)
    else:
        assert destination["paused_until"] is None
    if outcome in ("retryable", "ambiguous"):
        assert row["budget_used"] == 1 and row["wait_reason"].startswith("backoff ")
    if case == "oversized-body":
        assert len(attempt["response_excerpt"]) == 4096
    assert rate_limits.in_flight(conn, "cdn") == []


def test_a_refused_connection_is_retryable_and_spends_the_budget(deliver, conn):
    with Receiver() as receiver:
        url = receiver.url  # a port that nothing listens on once the receiver is gone
    add_destination(conn, "cdn", url=url)
    add_deliveries(conn, "cdn", 1)
    deliver("cdn")
    row = delivery(conn, "d-cdn-1")
    (attempt,) = _attempts(conn, "d-cdn-1")
    assert (row["state"], row["budget_used"], attempt["outcome"]) == ("pending", 1, "retryable")
    assert attempt["http_status"] is None


@pytest.mark.parametrize(
    ("reply", "rate_limited", "dead", "paused_reason"),
    [
        (Reply(status=429, headers={"Retry-After": "120"}), 1, 0, "HTTP 429"),
        (Reply(status=429), 1, 0, "HTTP 429 without Retry-After: 120 s"),
        (Reply(status=410), 0, 1, None),
    ],
    ids=["429-retry-after", "429-bare", "410"],
)
def test_a_pause_or_a_410_hands_the_rest_of_the_destination_back(
    deliver, conn, reply, rate_limited, dead, paused_reason
):
    """One request, then the destination is paused (the pause outlasts what a run waits) or
    disabled: the rest of its deliveries are handed back pending, their budget unspent."""
    with Receiver(reply=reply) as receiver:
        add_destination(conn, "cdn", url=receiver.url, max_in_flight=1, backoff_base_seconds=120)
        add_deliveries(conn, "cdn", 3)

        counts = deliver("cdn")["cdn"]

        assert receiver.request_count == 1
    assert (counts["rate_limited"], counts["dead"], counts["deferred"]) == (rate_limited, dead, 2)
    assert states(conn) == ({"pending": 3} if rate_limited else {"dead": 1, "pending": 2})
    pending = conn.execute("SELECT budget_used FROM webhook_delivery_all WHERE state = 'pending'")
    assert {r["budget_used"] for r in pending.fetchall()} == {0}
    destination = conn.execute(
        "SELECT enabled, paused_until - now() AS left, paused_reason FROM webhook_destination"
    ).fetchone()
    if paused_reason is None:
        assert destination["enabled"] is False
    else:
        assert 110 < destination["left"].total_seconds() <= 120
        assert destination["paused_reason"].startswith(paused_reason)
    assert rate_limits.in_flight(conn, "cdn") == []
    open_attempts = conn.execute(
        "SELECT count(*) AS n FROM delivery_attempt_all WHERE finished_at IS NULL"
    )
    assert open_attempts.fetchone()["n"] == 0


# The same key and bytes on every attempt --------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "outcome"),
    [
        (Reply(status=500), "retryable"),
        (Reply(drop=True), "ambiguous"),  # the receiver committed, then the connection dropped
        (Reply(delay_seconds=1.0), "ambiguous"),  # slower than the destination's timeout
    ],
    ids=["5xx", "dropped", "timeout"],
)
def test_a_retry_is_a_new_dispatch_with_the_same_key_and_bytes(deliver, conn, first, outcome):
    with Receiver(script=by_attempt(first)) as receiver:
        add_destination(conn, "cdn", url=receiver.url, timeout_seconds=0.3)
        add_deliveries(conn, "cdn", 1)

        deliver("cdn", run_id="run-1")
        _make_due(conn)
        assert deliver("cdn", run_id="run-2")["cdn"]["succeeded"] == 1
        assert receiver.wait_for_requests(2, timeout=10)

        one, two = receiver.requests
    body = bytes(delivery(conn, "d-cdn-1")["body"])
    assert one.webhook_id == two.webhook_id == one.idempotency_key == two.idempotency_key
    assert one.webhook_id == "d-cdn-1"
    assert one.body == two.body == body
    assert receiver.effects == 1  # one logical effect at a deduplicating receiver
    outbox = conn.execute("SELECT message_id, run_id FROM dispatch_outbox ORDER BY dispatch_no")
    assert [(r["message_id"], r["run_id"]) for r in outbox.fetchall()] == [
        ("d-cdn-1:1", "run-1"),
        ("d-cdn-1:2", "run-2"),
    ]
    assert [a["outcome"] for a in _attempts(conn, "d-cdn-1")] == [outcome, "success"]


# Limits -----------------------------------------------------------------------------------------


def test_in_flight_reaches_the_destination_ceiling_and_never_exceeds_it(deliver, conn):
    with Receiver(reply=Reply(delay_seconds=0.05)) as receiver:
        add_destination(
            conn, "cdn", url=receiver.url, max_in_flight=3, rate_per_second=1000, burst=50
        )
        add_deliveries(conn, "cdn", 30)
        assert deliver("cdn")["cdn"]["succeeded"] == 30
        assert receiver.max_in_flight == 3
    assert rate_limits.in_flight(conn, "cdn") == []


def test_starts_stay_within_the_rate_envelope(deliver, conn):
    """The starts never exceed burst + rate·t at the receiver (beyond arrival jitter), and
    the whole run takes at least the time the rate allows."""
    rate, burst, count = 40.0, 2, 24
    with Receiver(reply=Reply(delay_seconds=0.1)) as receiver:
        add_destination(
            conn, "cdn", url=receiver.url, max_in_flight=20, rate_per_second=rate, burst=burst
        )
        add_deliveries(conn, "cdn", count)
        assert deliver("cdn")["cdn"]["succeeded"] == count
        starts = sorted(r.arrived_monotonic for r in receiver.requests)
    assert envelope_excess(starts, rate=rate, burst=burst) <= 0
    assert starts[-1] - starts[0] >= (count - burst) / rate - ARRIVAL_JITTER_SECONDS


# The SSRF guard ---------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"], ids=["address", "name"])
def test_an_address_refused_at_connect_time_disables_the_destination_not_the_deliveries(
    deliver, conn, host
):
    """The guard judges the address connected to: a literal one before the request, a name's
    after its lookup. Nothing is sent; the destination is disabled saying which address and
    which setting allows it; the attempt is recorded, the deliveries keep their budget."""
    with Receiver() as receiver:
        url = receiver.url.replace("127.0.0.1", host)
        add_destination(conn, "cdn", url=url, max_in_flight=1, max_attempts=1)
        add_deliveries(conn, "cdn", 3)

        counts = deliver("cdn", guarded=True)["cdn"]

        assert receiver.request_count == 0
    assert (counts["guard_refused"], counts["deferred"], counts["dead"]) == (1, 2, 0)
    for row in conn.execute("SELECT * FROM webhook_delivery_all").fetchall():
        assert (row["state"], row["budget_used"]) == ("pending", 0)
    (attempt,) = conn.execute("SELECT outcome, error FROM delivery_attempt_all").fetchall()
    assert attempt["outcome"] == "retryable" and "SSRF guard" in attempt["error"]
    (listed,) = list_destinations(conn)
    assert listed["state"] == "disabled"
    assert "127.0.0.1" in listed["disabled_reason"] or "::1" in listed["disabled_reason"]
    assert "MEDIA_HOOKS_ALLOW_PRIVATE_URLS=1" in listed["disabled_reason"]
    (flag,) = figures.measure(conn).disabled
    assert flag.disabled_reason == listed["disabled_reason"]
    assert rate_limits.in_flight(conn, "cdn") == []


def test_a_destination_allowed_private_addresses_delivers_where_the_guard_refuses_others(
    deliver, conn
):
    """The guard on for the deployment: the destination added with allow_private_url reaches
    the receiver on 127.0.0.1; its neighbour at the same address is disabled by the guard."""
    with Receiver() as receiver:
        add_destination(conn, "mine", url=receiver.url + "mine", allow_private_url=True)
        add_destination(conn, "theirs", url=receiver.url + "theirs", max_in_flight=1)
        add_deliveries(conn, "mine", 2)
        add_deliveries(conn, "theirs", 2)

        counts = deliver("mine", "theirs", guarded=True)

        assert receiver.effects == 2
    assert (counts["mine"]["succeeded"], counts["theirs"]["guard_refused"]) == (2, 1)
    listed = {d["destination_id"]: d["state"] for d in list_destinations(conn)}
    assert listed == {"mine": "enabled", "theirs": "disabled"}
