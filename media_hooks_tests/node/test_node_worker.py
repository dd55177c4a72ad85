"""The Node.js worker (node/bin/media-hooks-node.js) against real PostgreSQL and the project's
receiver: the request the contract describes, the same bytes as the Python sender, the
contract's outcome classes (decided by the database's state machine), the destination's
limits, the SSRF guard at connect time, and a stop that hands back what it holds."""

from __future__ import annotations

import base64
import json
import signal
from datetime import UTC, datetime

import pytest

from media_hooks.devtools.receiver import ReceivedRequest, Receiver, Reply, by_attempt
from media_hooks.engine.delivery_run import deliver_due
from media_hooks.outbox import rate_limits
from media_hooks.outbox.cohort import Cohort
from media_hooks_tests.factories import add_deliveries, add_destination, delivery, states
from media_hooks_tests.interleaving import wait_for
from media_hooks_tests.node.conftest import run_worker, start_worker, worker_report

SECRET = "whsec_" + base64.b64encode(b"node-worker-test-secret-012345").decode()
CONTRACT_HEADERS = (
    "content-type",
    "user-agent",
    "webhook-id",
    "idempotency-key",
    "webhook-timestamp",
    "webhook-signature",
)


def _attempts(conn, delivery_id: str) -> list[dict]:
    return conn.execute(
        "SELECT * FROM delivery_attempt WHERE delivery_id = %s ORDER BY attempt_no", (delivery_id,)
    ).fetchall()


def _contract_headers(request: ReceivedRequest) -> dict[str, str]:
    lowered = {k.lower(): v for k, v in request.headers.items()}
    return {name: lowered.get(name) for name in CONTRACT_HEADERS}


def test_the_node_worker_delivers_every_due_delivery_signed_once(node, node_env, conn):
    with Receiver(secrets=[SECRET]) as receiver:
        for name in ("cdn", "rights"):
            add_destination(
                conn, name, url=receiver.url, secrets=[SECRET], rate_per_second=500, burst=50
            )
            add_deliveries(conn, name, 20)

        report = worker_report(
            run_worker(node, "cdn", "rights", "--json", "--run-id", "run-node", env=node_env)
        )

        assert report["run_id"] == "run-node"
        assert {d: (c["claimed"], c["succeeded"]) for d, c in report["destinations"].items()} == {
            "cdn": (20, 20),
            "rights": (20, 20),
        }
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
    assert outbox == {"n": 40, "published": 40, "runs": ["run-node"]}
    attempt = _attempts(conn, "d-cdn-1")[0]
    assert (attempt["run_id"], attempt["outcome"], attempt["http_status"]) == (
        "run-node",
        "success",
        200,
    )
    assert rate_limits.in_flight(conn, "cdn") == []


def test_node_and_python_send_the_same_bytes_and_headers(node, node_env, conn, pool, settings):
    """One delivery sent by each runtime in turn (its first answer is a 500): the receiver
    gets the same body bytes and the same contract headers, each signature verifying."""
    with Receiver(secrets=[SECRET], script=by_attempt(Reply(status=500))) as receiver:
        for name in ("python-first", "node-first"):
            add_destination(conn, name, url=receiver.url, secrets=[SECRET])
            add_deliveries(conn, name, 1)

        def make_due() -> None:
            conn.execute(
                "UPDATE webhook_delivery SET next_attempt_at = now() WHERE state = 'pending'"
            )

        deliver_due(pool, "run-py-1", settings, cohort=_only("python-first"))
        worker_report(run_worker(node, "node-first", "--json", env=node_env))
        make_due()
        worker_report(run_worker(node, "python-first", "--json", env=node_env))
        deliver_due(pool, "run-py-2", settings, cohort=_only("node-first"))

        assert states(conn) == {"succeeded": 2}
        for delivery_id in ("d-python-first-1", "d-node-first-1"):
            first, second = [r for r in receiver.requests if r.webhook_id == delivery_id]
            assert first.body == second.body == bytes(delivery(conn, delivery_id)["body"])
            assert first.verified and second.verified
            a, b = _contract_headers(first), _contract_headers(second)
            assert a["webhook-id"] == a["idempotency-key"] == delivery_id
            for name in ("content-type", "user-agent", "webhook-id", "idempotency-key"):
                assert a[name] == b[name], name
            for headers in (a, b):
                assert headers["webhook-timestamp"].isdigit()
                assert headers["webhook-signature"].startswith("v1,")
            assert [x["outcome"] for x in _attempts(conn, delivery_id)] == ["retryable", "success"]


def _only(destination_id: str) -> Cohort:
    return Cohort(destination_ids=(destination_id,))


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
    "timeout": (
        Reply(delay_seconds=2.0),
        {"timeout_seconds": 0.3},
        "pending",
        "ambiguous",
        None,
        "read timeout",
    ),
    "dropped": (
        Reply(drop=True),
        {},
        "pending",
        "ambiguous",
        None,
        "connection lost after the request was sent",
    ),
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
def test_each_answer_is_recorded_as_the_contract_says(node, node_env, conn, case):
    reply, settings, state, outcome, status, words = ANSWERS[case]
    with Receiver(reply=reply) as receiver:
        add_destination(conn, "cdn", url=receiver.url, **settings)
        add_deliveries(conn, "cdn", 1)
        before = datetime.now(UTC)
        report = worker_report(run_worker(node, "cdn", "--json", env=node_env))
        # One request (a slow answer's is logged when it ends): no redirect followed, no resend.
        assert receiver.wait_for_requests(1, timeout=10) and receiver.request_count == 1

    row = delivery(conn, "d-cdn-1")
    (attempt,) = _attempts(conn, "d-cdn-1")
    assert (row["state"], row["last_outcome"]) == (state, outcome)
    assert (attempt["outcome"], attempt["http_status"]) == (outcome, status)
    if words is None:
        assert attempt["error"] is None
    else:
        assert words in attempt["error"]
    counts = report["destinations"]["cdn"]
    assert counts["attempted"] == 1
    assert counts["ambiguous"] == (1 if outcome == "ambiguous" else 0)
    destination = conn.execute("SELECT * FROM webhook_destination").fetchone()
    assert destination["enabled"] is (case != "410")
    if case == "410":
        assert "receiver answered HTTP 410 (Gone)" in destination["disabled_reason"]
    if outcome == "rate_limited":
        wait = {"429-retry-after": 120, "429-bare": 30, "503-retry-after": 60}[case]
        assert row["budget_used"] == 0
        assert (row["next_attempt_at"] - before).total_seconds() == pytest.approx(wait, abs=5)
        assert (destination["paused_until"] - before).total_seconds() == pytest.approx(wait, abs=5)
    if outcome in ("retryable", "ambiguous"):
        assert row["budget_used"] == 1 and row["wait_reason"].startswith("backoff ")
    if case == "oversized-body":
        assert len(attempt["response_excerpt"]) == 4096


def test_a_refused_connection_is_retryable_and_spends_the_budget(node, node_env, conn):
    with Receiver() as receiver:
        url = receiver.url  # a port that nothing listens on once the receiver is gone
    add_destination(conn, "cdn", url=url)
    add_deliveries(conn, "cdn", 1)
    worker_report(run_worker(node, "cdn", "--json", env=node_env))
    row = delivery(conn, "d-cdn-1")
    (attempt,) = _attempts(conn, "d-cdn-1")
    assert (row["state"], row["budget_used"], attempt["outcome"]) == ("pending", 1, "retryable")
    assert attempt["error"].startswith("connection failed: ")


# Limits, the guard, a stop ----------------------------------------------------------------------


def test_the_node_worker_keeps_the_in_flight_and_start_rate_limits(node, node_env, conn):
    rate, burst, count = 20.0, 2, 30
    with Receiver(reply=Reply(delay_seconds=0.1)) as receiver:
        add_destination(
            conn, "cdn", url=receiver.url, max_in_flight=3, rate_per_second=rate, burst=burst
        )
        add_deliveries(conn, "cdn", count)
        worker_report(run_worker(node, "cdn", "--json", env=node_env))
        starts = sorted(r.arrived_monotonic for r in receiver.requests)
        assert receiver.max_in_flight <= 3
    assert states(conn) == {"succeeded": count}
    for i, first in enumerate(starts):
        for j in range(i + 1, len(starts)):
            assert j - i + 1 <= burst + rate * (starts[j] - first + 0.02), (i, j)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"], ids=["address", "name"])
def test_an_address_refused_at_connect_time_disables_the_destination_not_the_deliveries(
    node, node_env, conn, host
):
    """The guard judges the address connected to: a literal one before the request, a name's
    after its lookup. Nothing is sent; the destination is disabled saying why; the deliveries
    keep their budget."""
    guarded = {k: v for k, v in node_env.items() if k != "MEDIA_HOOKS_ALLOW_PRIVATE_URLS"}
    with Receiver() as receiver:
        url = receiver.url.replace("127.0.0.1", host)
        add_destination(conn, "cdn", url=url, max_in_flight=1, max_attempts=1)
        add_deliveries(conn, "cdn", 3)
        report = worker_report(run_worker(node, "cdn", "--json", env=guarded))
        assert receiver.request_count == 0
    counts = report["destinations"]["cdn"]
    assert (counts["guard_refused"], counts["deferred"], counts["dead"]) == (1, 2, 0)
    for row in conn.execute("SELECT * FROM webhook_delivery").fetchall():
        assert (row["state"], row["budget_used"]) == ("pending", 0)
    (attempt,) = conn.execute("SELECT outcome, error FROM delivery_attempt").fetchall()
    assert attempt["outcome"] == "retryable"
    assert attempt["error"].startswith("refused by the SSRF guard: connecting to ")
    destination = conn.execute(
        "SELECT enabled, disabled_reason FROM webhook_destination"
    ).fetchone()
    assert destination["enabled"] is False
    assert (
        "is in 127.0.0.0/8" in destination["disabled_reason"]
        or "::1" in destination["disabled_reason"]
    )
    assert "MEDIA_HOOKS_ALLOW_PRIVATE_URLS=1" in destination["disabled_reason"]
    assert rate_limits.in_flight(conn, "cdn") == []


def test_a_destination_allowed_private_addresses_on_its_own_is_sent_to(node, node_env, conn):
    """`destination add --allow-private-url` opens that destination alone, in the Node worker
    as in the Python one: no deployment setting needed, and the others stay guarded."""
    guarded = {k: v for k, v in node_env.items() if k != "MEDIA_HOOKS_ALLOW_PRIVATE_URLS"}
    with Receiver() as receiver:
        add_destination(conn, "mine", url=receiver.url, allow_private_url=True)
        add_destination(conn, "other", url=receiver.url + "other")
        add_deliveries(conn, "mine", 2)
        add_deliveries(conn, "other", 1)
        report = worker_report(run_worker(node, "mine", "other", "--json", env=guarded))
        assert {r.webhook_id for r in receiver.requests} == {"d-mine-1", "d-mine-2"}
    assert report["destinations"]["mine"]["succeeded"] == 2
    assert report["destinations"]["other"]["guard_refused"] == 1
    rows = conn.execute("SELECT destination_id, enabled FROM webhook_destination").fetchall()
    assert {r["destination_id"]: r["enabled"] for r in rows} == {"mine": True, "other": False}


def test_sigterm_hands_back_what_it_holds_and_exits_143(node, node_env, conn):
    with Receiver() as receiver:
        add_destination(conn, "cdn", url=receiver.url, rate_per_second=2, burst=1)
        add_deliveries(conn, "cdn", 600)
        worker = start_worker(
            node, "cdn", "--json", "--run-id", "run-stopped", "--page-size", "250", env=node_env
        )
        try:
            wait_for(lambda: receiver.request_count >= 2, "two sends", timeout=30)
            worker.send_signal(signal.SIGTERM)
            out, err = worker.communicate(timeout=30)
        finally:
            worker.kill()
            worker.wait()
        sent = receiver.request_count
    assert worker.returncode == 143, err
    report = json.loads(out)["destinations"]["cdn"]
    assert (report["claimed"], report["succeeded"], report["deferred"]) == (250, sent, 250 - sent)
    assert states(conn) == {"succeeded": sent, "pending": 600 - sent}
    assert rate_limits.in_flight(conn, "cdn") == []
    waiting = conn.execute(
        "SELECT DISTINCT wait_reason FROM webhook_delivery WHERE state = 'pending' "
        "AND wait_reason IS NOT NULL"
    ).fetchall()
    assert [r["wait_reason"] for r in waiting] == ["due again: run run-stopped was stopped"]


@pytest.mark.parametrize(
    ("change", "status", "words"),
    [
        ({"MEDIA_HOOKS_DATABASE_URL": None}, 2, "MEDIA_HOOKS_DATABASE_URL is not set"),
        (
            {"MEDIA_HOOKS_DATABASE_URL": "postgresql://nobody@127.0.0.1:9/none"},
            1,
            "cannot connect to PostgreSQL at postgresql://nobody@127.0.0.1:9/none: ",
        ),
        ({"MEDIA_HOOKS_DATABASE_URL": "not a url"}, 2, "is not a valid PostgreSQL URL"),
        ({"MEDIA_HOOKS_LEASE_SECONDS": "-1"}, 2, "MEDIA_HOOKS_LEASE_SECONDS must be"),
        ({"MEDIA_HOOKS_ALLOW_PRIVATE_URLS": "yes"}, 2, "MEDIA_HOOKS_ALLOW_PRIVATE_URLS must be"),
        ({"MEDIA_HOOKS_SECRET_KEY": "nope"}, 2, "MEDIA_HOOKS_SECRET_KEY: key 1 of 1"),
        ({"args": ["nope"]}, 2, "no destination 'nope'"),
        ({"args": ["cdn", "--page-size", "0"]}, 2, "--page-size must be a whole number"),
        ({"args": ["cdn", "--bogus"]}, 2, "Unknown option '--bogus'"),
        ({"args": ["bad.id"]}, 2, "destination id 'bad.id' contains '.'"),
    ],
)
def test_bad_settings_say_so_in_one_line_and_exit_nonzero(
    node, node_env, conn, change, status, words
):
    add_destination(conn, "cdn")
    add_deliveries(conn, "cdn", 2)
    env = dict(node_env)
    args = change.get("args", ["cdn"])
    for name, value in change.items():
        if name == "args":
            continue
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    done = run_worker(node, *args, env=env, timeout=60)
    assert done.returncode == status, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("media-hooks-node: "), done.stderr
    assert words in lines[0]
    assert states(conn) == {"pending": 2}
    assert conn.execute("SELECT count(*) AS n FROM dispatch_outbox").fetchone()["n"] == 0


def test_a_database_without_the_schema_names_the_fix(node, node_env, empty_database_url):
    env = dict(node_env, MEDIA_HOOKS_DATABASE_URL=empty_database_url)
    done = run_worker(node, "cdn", env=env, timeout=60)
    assert done.returncode == 1
    assert done.stderr == (
        "media-hooks-node: the database has no media_hooks schema: run `media-hooks db migrate`\n"
    )


def test_a_password_never_appears_in_its_error(node, node_env):
    env = dict(node_env, MEDIA_HOOKS_DATABASE_URL="postgresql://u:hunter2@127.0.0.1:9/x")
    done = run_worker(node, "cdn", env=env, timeout=60)
    assert done.returncode == 1
    assert "hunter2" not in done.stderr and "u:***@127.0.0.1:9" in done.stderr
