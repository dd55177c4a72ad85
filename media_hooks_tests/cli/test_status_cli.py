"""`media-hooks status`: its figures against direct SQL on a prepared database."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from media_hooks.observe import figures
from media_hooks.store import sqlfiles
from media_hooks_tests.conftest import run_cli
from media_hooks_tests.interleaving import open_session
from media_hooks_tests.operator_data import prepare


@pytest.fixture
def prepared(conn) -> dict[str, str]:
    return prepare(conn)


def _status(cli_env) -> dict:
    result = run_cli("status", "--json", env=cli_env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_status_json_matches_the_database(conn, prepared, cli_env):
    document = _status(cli_env)
    measured_at = datetime.fromisoformat(document["measured_at"])

    rows = conn.execute(
        "SELECT destination_id, state, count(*) AS n FROM webhook_delivery_all GROUP BY 1, 2"
    ).fetchall()
    expected: dict[str, dict[str, int]] = {}
    for row in rows:
        expected.setdefault(row["destination_id"], {})[row["state"]] = row["n"]
    assert document["counts"] == expected
    # Every state is present in the prepared database.
    assert all(document["totals"][state] > 0 for state in figures.STATES)

    sql = conn.execute(
        """
        SELECT
          (SELECT count(*) FROM webhook_delivery_all
            WHERE state = 'leased' AND lease_until < %(at)s) AS expired_leases,
          (SELECT count(*) FROM webhook_delivery_all WHERE state = 'dead') AS dead_letters,
          (SELECT min(d.next_attempt_at) FROM webhook_delivery_all d
             JOIN webhook_destination w USING (destination_id)
            WHERE d.state = 'pending' AND d.next_attempt_at <= %(at)s AND w.enabled
              AND (w.paused_until IS NULL OR w.paused_until <= %(at)s)) AS oldest_due_at,
          (SELECT min(next_attempt_at) FROM webhook_delivery_all
            WHERE state = 'pending' AND next_attempt_at <= %(at)s) AS oldest_due_any_at,
          (SELECT min(created_at) FROM dispatch_outbox WHERE published_at IS NULL) AS unpublished
        """,
        {"at": measured_at},
    ).fetchone()
    assert document["expired_leases"] == sql["expired_leases"] == 1
    assert document["dead_letters"] == sql["dead_letters"] == 1
    assert document["oldest_due_age_seconds"] == pytest.approx(
        (measured_at - sql["oldest_due_at"]).total_seconds(), abs=1e-3
    )
    assert document["oldest_due_any_age_seconds"] == pytest.approx(
        (measured_at - sql["oldest_due_any_at"]).total_seconds(), abs=1e-3
    )
    # The paused and disabled destinations' deliveries are due longer than any sendable one.
    assert document["oldest_due_any_age_seconds"] >= document["oldest_due_age_seconds"]
    assert document["relay_lag_seconds"] is None and sql["unpublished"] is None
    # How far the history's partitions reach: the least of the four tables' last ones.
    reach = conn.execute(
        "SELECT min(last) AS upper_at FROM (SELECT max(upper_at) AS last"
        " FROM media_hooks_partition GROUP BY parent) AS tables"
    ).fetchone()["upper_at"]
    assert document["partitions_ahead_seconds"] == pytest.approx(
        (reach - measured_at).total_seconds(), abs=1.0
    )
    assert document["partitions_ahead_seconds"] > 6 * 86400

    (paused,) = document["paused"]
    assert paused["destination_id"] == "beta"
    assert paused["paused_reason"] == "HTTP 429 with Retry-After 3600 s"
    (disabled,) = document["disabled"]
    assert disabled["destination_id"] == "gamma"
    assert "410" in disabled["disabled_reason"]

    attempts = conn.execute(
        "SELECT outcome, count(*) AS n FROM delivery_attempt_all "
        "WHERE finished_at > %s - interval '1 hour' GROUP BY outcome",
        (measured_at,),
    ).fetchall()
    assert document["attempts_last_hour"] == {row["outcome"]: row["n"] for row in attempts}
    assert document["attempts_last_hour"] == {"rejected": 2, "retryable": 1, "success": 1}


def test_status_text_is_aligned_with_human_ages(conn, prepared, cli_env):
    result = run_cli("status", env=cli_env)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "expired leases         1" in out
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("destination  pending"))
    alpha = next(line for line in lines if line.startswith("alpha "))
    # Columns line up: each count starts under its header.
    assert alpha.index("1", len("alpha")) >= header.index("pending")
    assert any(line.startswith("beta") and "paused" in line for line in lines)
    assert any(line.startswith("gamma") and "disabled" in line for line in lines)
    assert "success" in out and "last hour" in out
    # No other session holds a transaction open (the command's own does not count).
    assert any(line.split() == ["oldest", "snapshot", "none"] for line in lines)
    assert any(line.startswith("partitions made ahead") and "d" in line for line in lines)


def test_status_on_an_unreachable_database_is_a_runtime_failure(cli_env):
    env = {**cli_env, "MEDIA_HOOKS_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"}
    result = run_cli("status", env=env)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "cannot connect" in result.stderr


def test_status_shows_which_releases_are_connected(conn, database_url, cli_env):
    """During a rolling upgrade: an earlier release's worker (its sessions named no generation)
    beside one of this release; the command's own session is not counted."""
    ours = f"g{sqlfiles.generation()}"
    quiet = run_cli("status", env=cli_env)
    assert quiet.stdout.rstrip().endswith("connected: no other media_hooks session")
    with (
        open_session(database_url, application_name="media_hooks:worker"),
        open_session(database_url, application_name=f"media_hooks:worker:{ours}"),
    ):
        text = run_cli("status", env=cli_env).stdout
        assert text.rstrip().endswith(
            f"connected:\n  this release ({ours}): worker 1\n"
            "  an earlier release (generation unnamed): worker 1"
        )
        assert [(r["release"], r["roles"]) for r in _status(cli_env)["sessions"]] == [
            ("this", {"worker": 1}),
            ("earlier", {"worker": 1}),
        ]
