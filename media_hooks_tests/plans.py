"""What statements really read, in tests: from EXPLAIN (ANALYZE, FORMAT JSON) plans, and from
the server's statistics for a whole series of statements."""

from __future__ import annotations

import re

import psycopg
from psycopg.rows import tuple_row

from media_hooks.store.sqlfiles import query
from media_hooks_tests.interleaving import wait_for

# This release's layout (migration 0034): open deliveries and their timers, and what is
# written once.
LAYOUT_TABLES = (
    "delivery_state",
    "delivery_timer",
    "delivery_body",
    "delivery_history",
    "dispatch_outbox_v3",
    "delivery_attempt_v2",
)
# Where deliveries, their dispatches, attempts and identities are kept, in both layouts (the
# previous one's tables since migration 0034 renamed them, and this one's).
HISTORY_TABLES = (
    *LAYOUT_TABLES,
    "delivery_identity",
    "webhook_delivery_v1",
    "dispatch_outbox_v2",
    "delivery_attempt_v1",
)


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


def table_of(relation: str) -> str:
    """The table a plan's relation belongs to: a partition (``<table>_p<epoch>``,
    ``<table>_before``: media_hooks_make_partitions_v1, migration 0034) is read as its table."""
    return re.sub(r"_(p[0-9]+|before)$", "", relation)


def seq_scans(conn: psycopg.Connection, plan: dict, tables: set[str]) -> list[str]:
    """The sequential scans in ``plan`` (a top node of EXPLAIN (FORMAT JSON)) of ``tables``
    (their partitions included) but of the relations ``conn``'s database's statistics say are
    empty: a partition made ahead, or a range nothing was created in, is read whole for nothing,
    and by index once it holds rows."""
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute("SELECT relname FROM pg_class WHERE relkind = 'r' AND reltuples = 0")
        empty = {name for (name,) in cur}
    return _seq_scans(plan, tables, empty)


def _seq_scans(plan: dict, tables: set[str], empty: set[str]) -> list[str]:
    found = []
    relation = plan.get("Relation Name", "")
    if (
        plan.get("Node Type") == "Seq Scan"
        and table_of(relation) in tables
        and relation not in empty
    ):
        found.append(
            f"{relation} ({plan.get('Parent Relationship')}, {plan.get('Subplan Name', '')})"
        )
    for child in plan.get("Plans", []):
        found.extend(_seq_scans(child, tables, empty))
    return found


def rows_read(plan: dict, relation: str) -> int:
    """Rows a plan's scans of ``relation`` (its partitions included) fetched, the ones its
    filters removed included."""
    read = 0
    if table_of(plan.get("Relation Name", "")) == relation:
        loops = plan.get("Actual Loops", 1)
        read += (plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)) * loops
    return read + sum(rows_read(child, relation) for child in plan.get("Plans", []))


def rows_fetched(conn: psycopg.Connection) -> int:
    """Rows the history tables (their partitions included) have handed to scans in this
    database so far (read in order, or found by their indexes), as the statistics count them:
    the difference of two calls is what the statements between them read, on any connection
    that has closed. ``conn``: autocommit, the only session left open in its database."""
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
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(
            "SELECT t.relname, coalesce(t.seq_tup_read, 0)"
            "       + coalesce((SELECT sum(i.idx_tup_read) FROM pg_stat_user_indexes AS i"
            "                   WHERE i.relid = t.relid), 0)"
            " FROM pg_stat_user_tables AS t"
        )
        return int(sum(n for relation, n in cur if table_of(relation) in HISTORY_TABLES))


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
