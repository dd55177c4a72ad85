"""The Node.js worker (node/bin/media-hooks-node.js) against real PostgreSQL and the project's
receiver: the same bytes and headers as the Python sender, a stop that hands back what it
holds, and settings it refuses. What it shares with the Python engine (the outcome classes,
the same key and bytes on every attempt, the limits, the SSRF guard) is tested on both
runtimes at once: media_hooks_tests/engine/test_conformance.py."""

from __future__ import annotations

import base64
import json
import signal

import psycopg
import pytest

from media_hooks.devtools.receiver import ReceivedRequest, Receiver, Reply, by_attempt
from media_hooks.engine.delivery_run import deliver_due
from media_hooks.observe import figures
from media_hooks.outbox import rate_limits
from media_hooks.outbox.cohort import Cohort
from media_hooks.store import migrations, sqlfiles
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
        "SELECT * FROM delivery_attempt_all WHERE delivery_id = %s ORDER BY attempt_no",
        (delivery_id,),
    ).fetchall()


def _contract_headers(request: ReceivedRequest) -> dict[str, str]:
    lowered = {k.lower(): v for k, v in request.headers.items()}
    return {name: lowered.get(name) for name in CONTRACT_HEADERS}


def test_node_and_python_send_the_same_bytes_and_headers(node, node_env, conn, pool, settings):
    """One delivery sent by each runtime in turn (its first answer is a 500): the receiver
    gets the same body bytes and the same contract headers, each signature verifying."""
    with Receiver(secrets=[SECRET], script=by_attempt(Reply(status=500))) as receiver:
        for name in ("python-first", "node-first"):
            add_destination(conn, name, url=receiver.url, secrets=[SECRET])
            add_deliveries(conn, name, 1)

        def make_due() -> None:
            conn.execute(
                "UPDATE webhook_delivery_all SET next_attempt_at = now() WHERE state = 'pending'"
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


# A stop, bad settings ---------------------------------------------------------------------------


def test_sigterm_hands_back_what_it_holds_and_exits_143(node, node_env, conn):
    with Receiver() as receiver:
        add_destination(conn, "cdn", url=receiver.url, rate_per_second=2, burst=1)
        add_deliveries(conn, "cdn", 600)
        worker = start_worker(
            node, "cdn", "--json", "--run-id", "run-stopped", "--page-size", "250", env=node_env
        )
        try:
            wait_for(lambda: receiver.request_count >= 2, "two sends", timeout=30)
            # Its sessions name this release's generation, as the Python runtime's do.
            (running,) = figures.connected_sessions(conn)
            assert running.release == "this" and running.roles.get("worker", 0) >= 1
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
        "SELECT DISTINCT wait_reason FROM webhook_delivery_all WHERE state = 'pending' "
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


def test_its_own_migrations_behind_a_waiting_contract_migration_are_awaited(
    node, node_env, empty_database_url
):
    """During a rollout a contract migration waits for the release before it to go, and with it
    the migrations after it: this release has one, so its Node worker does not run yet and
    says why, in the Python runtime's words. (A release whose migrations end with contract
    migrations runs meanwhile: node/test/db.test.js.)"""
    contract = next(m for m in sqlfiles.load_migrations() if m.contract)
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        migrations.migrate(conn, up_to=contract.version - 1)
    env = dict(node_env, MEDIA_HOOKS_DATABASE_URL=empty_database_url)
    done = run_worker(node, "cdn", env=env, timeout=60)
    assert done.returncode == 1
    assert (
        f"applies {contract.version:04d} and those after it once no session of a release "
        "before it is connected" in done.stderr
    ), done.stderr
