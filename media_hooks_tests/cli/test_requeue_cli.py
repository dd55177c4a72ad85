"""`media-hooks requeue`: a dry run changes nothing; the real one moves exactly the matching rows,
with its audit row."""

from __future__ import annotations

import getpass
import json

from media_hooks_tests.conftest import run_cli
from media_hooks_tests.factories import add_deliveries, add_destination


def _snapshot(conn) -> list[dict]:
    return conn.execute(
        "SELECT delivery_id, state, next_attempt_at, budget_used, updated_at "
        "FROM webhook_delivery_all ORDER BY delivery_id"
    ).fetchall()


def _prepare(conn) -> None:
    for name in ("one", "two"):
        add_destination(conn, name)
        add_deliveries(conn, name, 3, prefix="dead", event_type="rights.updated")
        add_deliveries(conn, name, 2, prefix="deadt", event_type="transcode.completed")
        add_deliveries(conn, name, 2, prefix="live")
    conn.execute(
        "UPDATE webhook_delivery_all SET state = 'dead', budget_used = 5, "
        "wait_reason = 'dead: retry budget spent (5 attempts)' "
        "WHERE delivery_id LIKE 'dead%%'"
    )
    # Two of destination one's rights dead letters were recorded long ago.
    for table in ("delivery_body", "delivery_history", "delivery_state"):
        conn.execute(
            f"UPDATE {table} SET created_at = '2020-01-01T00:00:00Z' "
            "WHERE delivery_id IN ('dead-one-1', 'dead-one-2')"
        )


COHORT = ("--destination", "one", "--event-type", "rights.updated", "--since", "2024-01-01")


def test_dry_run_changes_nothing_and_shows_what_would_move(conn, cli_env):
    _prepare(conn)
    before = _snapshot(conn)
    result = run_cli(
        "requeue", *COHORT, "--reason", "receiver fixed", "--dry-run", "--json", env=cli_env
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["dry_run"] is True
    assert document["matched"] == 1 and document["moved"] == 0
    assert document["by_state"] == {"dead": 1}
    assert document["sample"] == ["dead-one-3"]
    assert _snapshot(conn) == before
    assert conn.execute("SELECT count(*) AS n FROM delivery_requeue").fetchone()["n"] == 0


def test_requeue_moves_exactly_the_matching_rows_with_an_audit_row(conn, cli_env):
    _prepare(conn)
    before = {row["delivery_id"]: row for row in _snapshot(conn)}
    result = run_cli(
        "requeue",
        "--destination",
        "one",
        "--event-type",
        "rights.updated",
        "--reason",
        "receiver fixed",
        env=cli_env,
    )
    assert result.returncode == 0, result.stderr
    assert "requeued 3 delivery(ies)" in result.stdout
    after = {row["delivery_id"]: row for row in _snapshot(conn)}
    moved = {d for d in after if after[d] != before[d]}
    assert moved == {"dead-one-1", "dead-one-2", "dead-one-3"}
    assert all(after[d]["state"] == "pending" and after[d]["budget_used"] == 0 for d in moved)
    audit = conn.execute("SELECT * FROM delivery_requeue").fetchone()
    assert audit["requested_by"] == getpass.getuser()
    assert audit["reason"] == "receiver fixed" and audit["moved"] == 3
    items = conn.execute(
        "SELECT delivery_id, previous_state FROM delivery_requeue_item ORDER BY 1"
    ).fetchall()
    assert items == [{"delivery_id": d, "previous_state": "dead"} for d in sorted(moved)]


def test_until_and_state_select_the_cohort(conn, cli_env):
    _prepare(conn)
    result = run_cli(
        "requeue",
        "--until",
        "2021-01-01T00:00:00+00:00",
        "--state",
        "dead",
        "--state",
        "pending",
        "--reason",
        "old ones",
        "--json",
        env=cli_env,
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["moved"] == 2 and sorted(document["sample"]) == ["dead-one-1", "dead-one-2"]


def test_bad_input_exits_2_and_writes_nothing(conn, cli_env):
    _prepare(conn)
    before = _snapshot(conn)
    for args, words in [
        (("--since", "yesterday", "--reason", "x"), "--since must be an ISO 8601 time"),
        (("--until", "2024-13-01", "--reason", "x"), "--until must be an ISO 8601 time"),
        (("--state", "succeeded", "--reason", "x"), "cannot requeue state 'succeeded'"),
        (("--reason", "  "), "needs a --reason"),
        (("--dry-run",), "--reason"),
    ]:
        result = run_cli("requeue", *args, env=cli_env)
        assert result.returncode == 2, (args, result.stderr)
        assert words in result.stderr and result.stderr.count("\n") == 1
    assert _snapshot(conn) == before
