"""``python -m bench.sustained --size ci``: the sustained-load benchmark runs and reports.

The figures of a 10,000-delivery run on a shared machine mean little, so this checks what the
run must have done whatever the machine (every window closed, the failing publishers made
retries and dead letters, retention purged behind the load, the counters moved) and the shape
of what it writes (the JSON, the summary, one PNG per metric), never a speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from media_hooks_tests.conftest import REPO

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.one_server
def test_ci_size_runs_every_window_under_load_and_writes_its_report(
    server_url: str, tmp_path: Path
):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEDIA_HOOKS_", "DAGSTER_"))}
    env.update(MEDIA_HOOKS_DATABASE_URL=server_url, MEDIA_HOOKS_HOME=str(tmp_path / "home"))
    out = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "-m", "bench.sustained", "--size", "ci", "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    document = json.loads((out / "sustained.json").read_text())
    assert document["complete"]
    # PostgreSQL 16 on counts WAL by relation and updates that left their page.
    sixteen_on = int(document["postgres"]["version"].split(".")[0]) >= 16
    assert document["role_exits"] == {"producer": 0, "retention": 0, "engine": 0}
    windows = document["windows"]
    assert [w["window"] for w in windows] == list(range(1, 21))
    size = document["size"]["deliveries"]
    assert document["deliveries_done"] >= size
    for window in windows:
        assert window["deliveries"] > 0 and window["per_second"] > 0, window["window"]
        assert window["wal_bytes"] > 0, window["window"]
        assert window["tables"]["delivery_state"]["total_bytes"] > 0
        # The full-page images among it, counted.
        assert window["fpi_per_delivery"] >= 0, window["window"]
    # And read from the WAL (a superuser's session on a server with pg_walinspect, as both test
    # servers are), where a checkpoint has not recycled the window's WAL before it was read.
    assert sum(w["fpi_bytes_per_delivery"] is not None for w in windows) >= 15
    # What the WAL is made of: by kind of record (the producer's inserts, the engine's
    # updates, every transaction's commit) and, from PostgreSQL 16 on, by relation.
    totals = document["totals"]
    kinds = totals["wal_by_kind_per_delivery"]
    if kinds:  # empty where a checkpoint recycled a stretch before it was read
        for kind in ("Heap/INSERT", "Heap/UPDATE", "Transaction/COMMIT"):
            assert kinds.get(kind, 0) > 0, (kind, kinds)
        assert sum(kinds.values()) <= totals["wal_bytes_per_delivery"] * 1.02
        if sixteen_on:
            relations = totals["wal_by_relation_per_delivery"]
            assert relations.get("delivery_state", 0) > 0, relations
    # The producer kept emitting to the end: no window drained a backlog without load.
    assert windows[-1]["emitted_so_far"] > windows[-1]["deliveries_done"]
    # Every kind of statement was timed.
    for kind in ("claim", "lease", "record"):
        assert sum(w[f"{kind}_statements"] for w in windows) > 0, kind
        assert any(w[f"{kind}_p99_ms"] for w in windows), kind
    # The failing publisher made retries (more attempts than deliveries) and dead letters.
    assert document["dead_by_the_end"] > 0
    recorded = document["attempts_recorded_by_the_end"]
    assert recorded > document["succeeded_by_the_end"] + document["dead_by_the_end"]
    assert sum(w["tables"]["delivery_attempt_v2"]["inserts"] for w in windows) > 0
    # Retention ran behind the load: ranges of terminal deliveries dropped whole, each with its
    # bodies, attempts and dispatches (the same range of every history table).
    purged = {k: sum(w["purged"][k] for w in windows) for k in windows[0]["purged"]}
    assert purged["deliveries"] > 0 and purged["partitions_dropped"] > 0
    for table in ("delivery_history", "delivery_body", "delivery_attempt_v2", "dispatch_outbox_v3"):
        assert sum(w["tables"][table]["dropped_rows"] for w in windows) > 0, table
    assert totals["wal_bytes_per_delivery"] > 0
    # Each delivery moves its state row at least three times: the claim and the lease update
    # it, the record deletes it (the delivery ends: history) or updates it (a retry). The
    # counters come from pg_stat_user_tables, which a busy backend flushes up to a second late,
    # so a short run's last window misses some of its moves: the bounds allow for that.
    assert totals["updates_per_delivery"]["delivery_state"] >= 1.5
    ended = sum(w["tables"]["delivery_state"]["deletes"] for w in windows)
    assert ended >= 0.75 * document["deliveries_done"], ended
    assert 0 <= totals["hot_ratio"]["delivery_state"] <= 1
    # Where the server counts them (16 on), the state moves whose new version left its page.
    left = totals["new_page_ratio"]["delivery_state"]
    if sixteen_on:
        assert 0 <= left <= 1
    else:
        assert left is None
    assert document["postgres"]["settings"]["autovacuum"] == "on"
    # `check --all` ran once every role had stopped, and the invariants held.
    check = document["check_at_end"]
    assert check["since"] is None and check["holds"], check

    summary = (out / "SUMMARY.md").read_text()
    assert summary.startswith("# Sustained load: ci")
    for heading in ("## Targets (issue 34)", "## Windows (5% of the run each)", "## Whole run"):
        assert heading in summary, heading
    if kinds:
        assert "All of the WAL by kind of record, bytes per delivery:" in summary
    assert summary.count("| met") + summary.count("| **not met**") >= 5
    assert (
        "per delivery a second of each window's throughput, the last quarter's peak is" in summary
    )
    assert len(document["plots"]) >= 8
    for filename in document["plots"].values():
        assert f"]({filename})" in summary, filename
        assert (out / filename).read_bytes().startswith(PNG_MAGIC), filename


@pytest.mark.embedded_only
def test_autovacuum_is_on_for_the_run_and_back_off_after_it_where_the_server_had_it_off(
    server_url: str,
):
    from bench.sustained import autovacuum_at_defaults

    def autovacuum() -> str:
        with psycopg.connect(server_url) as conn:
            return conn.execute("SHOW autovacuum").fetchone()[0]

    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET autovacuum = off")
        conn.execute("SELECT pg_reload_conf()")
    try:
        from bench.sustained import _wait_for_setting

        _wait_for_setting(server_url, "autovacuum", "off")
        with autovacuum_at_defaults(server_url) as found:
            assert found["autovacuum_found"] == "off" and found["turned_on_for_the_run"]
            assert autovacuum() == "on"
        _wait_for_setting(server_url, "autovacuum", "off")
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM RESET autovacuum")
            conn.execute("SELECT pg_reload_conf()")
    _wait_for_setting(server_url, "autovacuum", "on")


def test_a_preloaded_history_is_delivered_history_every_invariant_accepts(database_url: str, conn):
    """``--history``: what it writes is what delivery runs leave (a succeeded delivery, its
    published outbox row, its success attempt, its identity), spread oldest first over the
    span, vacuumed; and `check --all` holds on it."""
    from bench.sustained_history import preload
    from media_hooks.observe import checks
    from media_hooks_tests.factories import add_destination, states

    for name in ("dest-1", "dest-2"):
        add_destination(conn, name, url="http://127.0.0.1:9/")
    preload(database_url, 500, ["dest-1", "dest-2"], span_seconds=3_600)

    assert states(conn) == {"succeeded": 500}
    counts = conn.execute(
        "SELECT (SELECT count(*) FROM dispatch_outbox WHERE published_at IS NOT NULL) AS outbox,"
        " (SELECT count(*) FROM delivery_attempt_all WHERE outcome = 'success') AS attempts,"
        " (SELECT count(*) FROM delivery_identity) AS identities,"
        " (SELECT count(DISTINCT destination_id) FROM webhook_delivery_all) AS destinations,"
        " (SELECT extract(epoch FROM max(created_at) - min(created_at)) FROM webhook_delivery_all)"
        "   AS span,"
        " (SELECT max(updated_at) <= now() FROM webhook_delivery_all) AS past"
    ).fetchone()
    assert counts["outbox"] == counts["attempts"] == counts["identities"] == 500
    assert counts["destinations"] == 2 and counts["past"]
    assert 3_500 < counts["span"] <= 3_600
    oldest = conn.execute(
        "SELECT delivery_id FROM webhook_delivery_all ORDER BY created_at LIMIT 1"
    ).fetchone()
    assert oldest["delivery_id"] == "history-1"
    assert checks.run(conn, checks.Options(full=True)).holds


def test_a_rate_holds_the_producer_to_it_over_the_run(database_url: str, conn, tmp_path: Path):
    """``--rate``: the producer emits no faster than the rate over the run (each batch starts
    once the run's emits, that batch included, are within the rate), while the engine would
    take more: no backlog stops it here. Unpaced, the same emits take a fraction of the time."""
    from media_hooks_tests.factories import add_destination

    add_destination(conn, "dest-1", url="http://127.0.0.1:9/")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEDIA_HOOKS_", "DAGSTER_"))}
    env.update(MEDIA_HOOKS_DATABASE_URL=database_url, MEDIA_HOOKS_HOME=str(tmp_path / "home"))
    rate, batch = 400, 40
    command = [sys.executable, "-m", "bench.sustained_roles", "producer", "--backlog", "100000",
               "--batch", str(batch), "--destinations", "dest-1", "--rate", str(rate)]  # fmt: skip
    started = time.monotonic()
    with subprocess.Popen(
        command, cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as producer:
        lines = []
        try:
            while not lines or lines[-1]["emitted"] < 4 * rate:
                assert time.monotonic() - started < 60, lines[-1:]
                lines.append(json.loads(producer.stdout.readline()))
        finally:
            producer.stdin.close()
            assert producer.wait(timeout=30) == 0
    for line in lines:
        began = line["at"] - line["seconds"]
        assert line["emitted"] <= rate * (began - started), line
