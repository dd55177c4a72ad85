"""`media-hooks demo` end to end as a real process, and its reset of its own data only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from psycopg import conninfo

from media_hooks.cli import demo_commands
from media_hooks.devtools import demo
from media_hooks_tests.conftest import drop_database, run_cli
from media_hooks_tests.factories import add_deliveries, add_destination, add_dispatches


@pytest.fixture
def demo_env(cli_env, server_url, database_url):
    # The demo must not need the user to allow private addresses: it allows them for its own
    # loopback destinations only.
    env = {k: v for k, v in cli_env.items() if k != "MEDIA_HOOKS_ALLOW_PRIVATE_URLS"}
    yield env
    # Dagster's run storage goes to a database beside the test's (media_hooks.orchestration).
    drop_database(server_url, conninfo.conninfo_to_dict(database_url)["dbname"] + "_dagster")


def _expected(conn, destination_id: str) -> dict:
    return conn.execute(
        """
        SELECT
          (SELECT count(*) FROM webhook_delivery_all WHERE destination_id = %(d)s) AS deliveries,
          (SELECT count(*) FROM webhook_delivery_all
            WHERE destination_id = %(d)s AND state = 'succeeded') AS delivered,
          (SELECT count(*) FROM webhook_delivery_all
            WHERE destination_id = %(d)s AND state = 'dead') AS dead,
          (SELECT count(*) FROM delivery_attempt_all WHERE destination_id = %(d)s) AS attempts,
          (SELECT count(*) FROM delivery_attempt_all
            WHERE destination_id = %(d)s AND outcome IN ('retryable', 'ambiguous')) AS retried,
          (SELECT count(*) FROM delivery_attempt_all
            WHERE destination_id = %(d)s AND outcome = 'rate_limited') AS rate_limited,
          (SELECT count(*) FROM delivery_attempt_all
            WHERE destination_id = %(d)s AND outcome = 'ambiguous') AS ambiguous
        """,
        {"d": destination_id},
    ).fetchone()


@pytest.mark.one_server
def test_demo_runs_end_to_end_and_its_summary_matches_the_database(conn, demo_env):
    add_destination(conn, "someone-else", "http://127.0.0.1:9/theirs")
    (theirs,) = add_deliveries(conn, "someone-else", 1)

    result = run_cli("demo", "--json", env=demo_env, timeout=90)
    assert result.returncode == 0, result.stderr[-3000:]
    document = json.loads(result.stdout)
    # How long it takes is the benchmarks' business (a timed assertion fails on a busy machine);
    # here only that the summary reports it.
    assert document["seconds"] > 0

    rows = {row["destination_id"]: row for row in document["destinations"]}
    assert set(rows) == {d.destination_id for d in demo.DESTINATIONS}
    for destination_id, row in rows.items():
        expected = _expected(conn, destination_id)
        assert {key: row[key] for key in expected} == expected, destination_id
        # Starts in any one clock second stay within the limit plus its burst.
        assert row["peak_starts_per_second"] <= row["rate_per_second"] + row["burst"]
    partner = rows[demo.MISBEHAVING]
    assert partner["dead"] == 1 and partner["rate_limited"] == 2 and partner["ambiguous"] == 1
    assert partner["retried"] == 5
    # The counts add up on the page, as the line under the table says.
    for row in rows.values():
        assert row["attempts"] == (
            row["delivered"] + row["dead"] + row["retried"] + row["rate_limited"]
        ), row
    # Each run's line: what it claimed is the sum of where its deliveries went.
    run_lines = [line for line in result.stderr.splitlines() if ": claimed " in line]
    assert len(run_lines) == len(document["runs"])
    for line in run_lines:
        claimed, parts = line.split(": claimed ", 1)[1].split(" = ")
        assert int(claimed) == sum(int(part.rsplit(" ", 1)[1]) for part in parts.split(" + "))
    # Its destinations, and only they, may reach its receiver on 127.0.0.1: runs of
    # `media-hooks dev` send to them too, whatever that process's environment.
    allowed = conn.execute(
        "SELECT destination_id FROM webhook_destination WHERE allow_private_url ORDER BY 1"
    ).fetchall()
    assert [r["destination_id"] for r in allowed] == sorted(
        d.destination_id for d in demo.DESTINATIONS
    )
    assert all(rows[d]["delivered"] == rows[d]["deliveries"] for d in ("demo-cdn", "demo-archive"))

    # The receiver saw each delivered event once as an effect, whatever the retries.
    delivered = sum(row["delivered"] for row in rows.values())
    assert document["receiver"]["accepted_ids"] == delivered
    assert document["receiver"]["rejected_signatures"] == 0
    # Every run the demo reports is the run that claimed the demo's outbox rows.
    outbox_runs = {
        row["run_id"] for row in conn.execute("SELECT DISTINCT run_id FROM dispatch_outbox")
    }
    assert outbox_runs == {run["run_id"] for run in document["runs"]}

    # Progress says what is left after each run and what the demo does next: never a wait of
    # 0.0s for something already due.
    progress = [line for line in result.stderr.splitlines() if "to send again" in line]
    for line in progress:
        assert "(last outcome: " in line, line
        assert line.endswith(("the next run starts at once", "the next run starts then")), line
    assert "due in 0.0s" not in result.stderr

    chart = Path(document["chart"])
    assert chart == Path(demo_env["MEDIA_HOOKS_HOME"]) / "demo" / "request_rate.png"
    assert chart.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")

    # Someone else's delivery was neither sent nor touched.
    other = conn.execute(
        "SELECT state, attempt_count FROM webhook_delivery_all WHERE delivery_id = %s", (theirs,)
    ).fetchone()
    assert other == {"state": "pending", "attempt_count": 0}


def test_reset_removes_only_the_demos_own_data(conn):
    add_destination(conn, "demo-cdn")
    add_destination(conn, "kept")
    demo_ids = add_deliveries(conn, "demo-cdn", 3)
    kept = add_deliveries(conn, "kept", 2)
    add_dispatches(conn, [*demo_ids, *kept], published=False)
    add_dispatches(conn, demo_ids[:1], published=False)
    removed = demo.reset(conn)
    assert removed == {"deliveries": 3, "destinations": 1}
    left = conn.execute("SELECT delivery_id FROM webhook_delivery_all ORDER BY 1").fetchall()
    assert [row["delivery_id"] for row in left] == sorted(kept)
    outbox = conn.execute("SELECT count(*) AS n FROM dispatch_outbox").fetchone()["n"]
    assert outbox == 2
    destinations = conn.execute("SELECT destination_id FROM webhook_destination").fetchall()
    assert destinations == [{"destination_id": "kept"}]


def test_what_a_run_left_is_told_with_its_reasons_and_what_happens_next(conn):
    for d in demo.DESTINATIONS:
        add_destination(conn, d.destination_id)
    retry = add_deliveries(conn, "demo-partner", 2, prefix="retry", due_seconds_ago=1)
    later = add_deliveries(conn, "demo-partner", 1, prefix="later", due_seconds_ago=-30)
    paused = add_deliveries(conn, "demo-cdn", 1, prefix="paused", due_seconds_ago=5)
    add_deliveries(conn, "demo-archive", 1, state="leased")
    add_deliveries(conn, "demo-archive", 1, state="succeeded")
    for ids, outcome in ((retry, "retryable"), (later, "ambiguous"), (paused, "rate_limited")):
        conn.execute(
            "UPDATE webhook_delivery_all SET last_outcome = %s WHERE delivery_id = ANY (%s)",
            (outcome, ids),
        )
    # A 429's Retry-After paused demo-cdn: its delivery waits although its own time has come.
    conn.execute(
        "UPDATE webhook_destination SET paused_until = now() + interval '1 minute' "
        "WHERE destination_id = 'demo-cdn'"
    )

    left = demo._fetch(conn, "demo_unfinished", {"destination_ids": demo._ids()})[0]
    assert {k: left[k] for k in ("unfinished", "due_now", "waiting", "held_by_a_run")} == {
        "unfinished": 5,
        "due_now": 2,
        "waiting": 2,
        "held_by_a_run": 1,
    }
    assert left["earliest"] == sorted(retry)[0]
    assert -2 < left["due_in_seconds"] < 0
    assert demo.left_to_send(left) == (
        "5 delivery(ies) to send again (last outcome: 1 ambiguous, 1 rate_limited, "
        "2 retryable, 1 still held by a run)"
    )
    assert demo.next_run(max(left["due_in_seconds"], 0)) == (
        "due now, so the next run starts at once"
    )

    conn.execute("DELETE FROM webhook_delivery_all WHERE delivery_id = ANY (%s)", (retry,))
    waiting = demo._fetch(conn, "demo_unfinished", {"destination_ids": demo._ids()})[0]
    assert waiting["due_now"] == 0 and 25 < waiting["due_in_seconds"] <= 30
    assert waiting["earliest"] == later[0]
    assert demo.next_run(29.96).startswith("the first is due in 30.0s (retry backoff, or a pause")


def test_the_page_explains_its_counts_in_one_line_under_the_table(tmp_path):
    row = {
        "destination_id": "demo-partner",
        "deliveries": 100,
        "delivered": 99,
        "retried": 5,
        "rate_limited": 2,
        "ambiguous": 1,
        "dead": 1,
        "attempts": 107,
        "achieved_rate": 8.6,
        "peak_starts_per_second": 10,
        "rate_per_second": 10.0,
    }
    result = demo.DemoResult(
        destinations=[row],
        runs=[{"run_id": "r1"}],
        receiver={"requests": 107, "accepted_ids": 99, "duplicate_requests": 1,
                  "rejected_signatures": 0},
        chart=tmp_path / "chart.png",
        seconds=22.0,
        examples={"rate_limited_then_succeeded": "a", "ambiguous_then_succeeded": "b",
                  "dead": "c"},
    )  # fmt: skip
    lines = demo_commands.render(result, embedded=True).splitlines()
    table_end = next(i for i, line in enumerate(lines) if line.startswith("demo-partner"))
    assert lines[table_end + 1] == demo_commands.COUNTS_EXPLAINED
    assert "attempts = delivered + dead + retried + rate-limited" in lines[table_end + 1]
    assert '"to send again"' in lines[table_end + 1]
