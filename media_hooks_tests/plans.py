"""What statements really read, in tests: from EXPLAIN (ANALYZE, FORMAT JSON) plans, and from
the server's statistics for a whole series of statements."""

from __future__ import annotations

import psycopg

from media_hooks.store.sqlfiles import query
from media_hooks_tests.interleaving import wait_for

HISTORY_TABLES = ("webhook_delivery", "dispatch_outbox_v2", "delivery_attempt", "delivery_identity")


def analyzed(conn: psycopg.Connection, name: str, params: dict | None = None) -> dict:
    """The plan of the statement ``name`` (sql/queries) as it ran under EXPLAIN ANALYZE with
    ``params``: its top node. It really runs: a caller whose statement writes rolls it back."""
    statement = f"EXPLAIN (ANALYZE, FORMAT JSON) {query(name)}"
    (plan,) = conn.execute(statement.encode(), params).fetchone()["QUERY PLAN"]
    return plan["Plan"]


def through_index(
    conn: psycopg.Connection, index: str, statement: str, params: tuple | None = None
) -> list[dict]:
    """The rows of ``statement`` read through ``index`` alone (no sequential or bitmap scan),
    which must be valid: an index built concurrently must hold every row written meanwhile.
    ``conn``: autocommit, dict rows."""
    valid = conn.execute(
        "SELECT indisvalid AS v FROM pg_index WHERE indexrelid = %s::regclass", (index,)
    ).fetchone()
    assert valid["v"], index
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL enable_seqscan = off")
        conn.execute("SET LOCAL enable_bitmapscan = off")
        plan = "\n".join(r["QUERY PLAN"] for r in conn.execute("EXPLAIN " + statement, params))
        rows = conn.execute(statement, params).fetchall()
    assert index in plan, plan
    return rows


def rows_read(plan: dict, relation: str) -> int:
    """Rows a plan's scans of ``relation`` fetched, the ones its filters removed included."""
    read = 0
    if plan.get("Relation Name") == relation:
        loops = plan.get("Actual Loops", 1)
        read += (plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)) * loops
    return read + sum(rows_read(child, relation) for child in plan.get("Plans", []))


def rows_fetched(conn: psycopg.Connection) -> int:
    """Rows the history tables have handed to scans in this database so far (read in order,
    or found by their indexes), as the statistics count them: the difference of two calls is
    what the statements between them read, on any connection that has closed. ``conn``:
    autocommit, the only session left open in its database."""
    # Another session's counts reach the statistics as its server process exits, after its
    # client has closed it (later still on a busy machine); waiting for the processes to go
    # waits for their counts.
    wait_for(
        lambda: _other_sessions(conn) == 0, "the other sessions' processes to exit", timeout=30
    )
    # This session's counts reach the statistics when it goes idle; the flush is forced, and
    # the cached snapshot of them dropped, so that the next read sees every statement before.
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT (SELECT sum(seq_tup_read) FROM pg_stat_user_tables WHERE relname = ANY(%(t)s))"
        "     + (SELECT sum(idx_tup_read) FROM pg_stat_user_indexes WHERE relname = ANY(%(t)s))"
        "       AS n",
        {"t": list(HISTORY_TABLES)},
    ).fetchone()
    return int(row["n"] if isinstance(row, dict) else row[0])


def sql_block(markdown: str) -> list[str]:
    """The statements of a Markdown text's SQL block (what the UI shows an operator to run)."""
    block = markdown.split("```sql\n", 1)[1].split("```", 1)[0]
    return [part.strip() for part in block.split(";") if part.strip()]


def _other_sessions(conn: psycopg.Connection) -> int:
    row = conn.execute(
        "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database()"
        " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
    ).fetchone()
    return int(row["n"] if isinstance(row, dict) else row[0])
