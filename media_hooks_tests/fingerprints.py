"""Fingerprints of a database for before/after comparisons: its schema, and its content."""

from __future__ import annotations

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row

_SCHEMA_QUERIES = {
    "columns": """
        SELECT table_name || '.' || column_name || ' ' || data_type || ' '
               || is_nullable || ' ' || coalesce(column_default, '')
        FROM information_schema.columns WHERE table_schema = 'public'
    """,
    "constraints": """
        SELECT conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid)
               || CASE WHEN convalidated THEN '' ELSE ' NOT VALID' END
        FROM pg_constraint WHERE connamespace = 'public'::regnamespace
    """,
    "indexes": """
        SELECT pg_get_indexdef(i.indexrelid) || CASE WHEN i.indisvalid THEN '' ELSE ' INVALID' END
        FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
        WHERE c.relnamespace = 'public'::regnamespace
    """,
    "functions": """
        SELECT pg_get_functiondef(p.oid) FROM pg_proc AS p
        WHERE p.pronamespace = 'public'::regnamespace AND p.prokind = 'f'
    """,
    "triggers": """
        SELECT pg_get_triggerdef(t.oid) FROM pg_trigger AS t
        JOIN pg_class AS c ON c.oid = t.tgrelid
        WHERE c.relnamespace = 'public'::regnamespace AND NOT t.tgisinternal
    """,
    "tables": """
        SELECT c.relname || ' ' || c.relpersistence::text || ' ' || coalesce(array_to_string(c.reloptions, ','), '')
        FROM pg_class AS c WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r'
    """,
}


def schema_fingerprint(conn: psycopg.Connection) -> dict[str, list[str]]:
    """Every table, column, constraint, index, function and trigger definition, sorted."""
    with conn.cursor(row_factory=tuple_row) as cur:
        return {
            kind: sorted(row[0] for row in cur.execute(statement).fetchall())
            for kind, statement in _SCHEMA_QUERIES.items()
        }


def content_fingerprint(conn: psycopg.Connection) -> dict[str, str]:
    """Each table's rows as one digest (order-independent): equal means nothing was written."""
    with conn.cursor(row_factory=tuple_row) as cur:
        tables = [
            name
            for (name,) in cur.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename"
            ).fetchall()
        ]
        digests = {}
        for table in tables:
            statement = sql.SQL(
                "SELECT count(*) || ':' || coalesce(md5(string_agg(md5(t::text), '' ORDER BY md5(t::text))), '') FROM {} AS t"
            ).format(sql.Identifier(table))
            digests[table] = cur.execute(statement).fetchone()[0]
    return digests
