"""The schema as it stands after every migration, as one readable file (``sql/schema.sql``).

The migrations are history: to see a table or a function as it is today a reader would replay
fifteen files in their head. This dumps a migrated database's own schema from the catalogs in
a stable order (tables with their columns, constraints and storage settings, then views,
indexes, triggers, sequences and functions, each by name), in the server's own words
(``pg_get_*def``), so the same migrations give the same text on PostgreSQL 15 and 18.
``media_hooks_tests/store/test_schema.py`` fails when the committed file differs from what the
migrations produce.

    python -m media_hooks.store.schema DATABASE_URL > sql/schema.sql
"""

from __future__ import annotations

import re
import sys

import psycopg
from psycopg.rows import dict_row

HEADER = """\
-- The schema as the migrations in sql/migrations leave it: generated, never edited by hand.
-- Regenerate with: python -m media_hooks.store.schema DATABASE_URL > sql/schema.sql
-- (DATABASE_URL: a database migrated with `media-hooks db migrate`). The state machine's
-- statements are in sql/queries; the invariants they keep are in docs/architecture.md.
"""

_PUBLIC = "c.relnamespace = 'public'::regnamespace"


def _tables(conn: psycopg.Connection) -> list[str]:
    blocks = []
    tables = conn.execute(
        f"SELECT c.oid, c.relname, c.reloptions FROM pg_class c "
        f"WHERE {_PUBLIC} AND c.relkind IN ('r', 'p') ORDER BY c.relname"
    ).fetchall()
    for table in tables:
        columns = conn.execute(
            """
            SELECT a.attname, format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull,
                   pg_get_expr(d.adbin, d.adrelid) AS default_value, a.attgenerated,
                   a.attidentity
            FROM pg_attribute a
            LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
            WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
            ORDER BY a.attnum
            """,
            (table["oid"],),
        ).fetchall()
        lines = []
        for column in columns:
            line = f"    {column['attname']} {column['type']}"
            if column["attidentity"]:
                kind = "ALWAYS" if column["attidentity"] == "a" else "BY DEFAULT"
                line += f" GENERATED {kind} AS IDENTITY"
            elif column["attgenerated"]:
                line += f" GENERATED ALWAYS AS ({column['default_value']}) STORED"
            elif column["default_value"] is not None:
                line += f" DEFAULT {column['default_value']}"
            if column["attnotnull"]:
                line += " NOT NULL"
            lines.append(line)
        # Not-null constraints are catalogued as constraints from PostgreSQL 18 on: they are
        # the columns' NOT NULL above, on every version.
        constraints = conn.execute(
            "SELECT conname, pg_get_constraintdef(oid) AS definition FROM pg_constraint "
            "WHERE conrelid = %s AND contype <> 'n' ORDER BY conname",
            (table["oid"],),
        ).fetchall()
        lines += [f"    CONSTRAINT {c['conname']} {c['definition']}" for c in constraints]
        block = f"CREATE TABLE {table['relname']} (\n" + ",\n".join(lines) + "\n)"
        if table["reloptions"]:
            block += f" WITH ({', '.join(table['reloptions'])})"
        blocks.append(block + ";")
    return blocks


def _views(conn: psycopg.Connection) -> list[str]:
    blocks = []
    views = conn.execute(
        f"""
        SELECT c.relname, pg_get_viewdef(c.oid, true) AS definition,
               array(SELECT DISTINCT r.relname FROM pg_rewrite w
                     JOIN pg_depend d ON d.objid = w.oid AND d.classid = 'pg_rewrite'::regclass
                     JOIN pg_class r ON r.oid = d.refobjid AND r.oid <> c.oid
                     WHERE w.ev_class = c.oid) AS reads
        FROM pg_class c WHERE {_PUBLIC} AND c.relkind = 'v' ORDER BY c.relname
        """
    ).fetchall()
    for view in views:
        definition = view["definition"].rstrip().rstrip(";")
        if len(view["reads"]) == 1:
            # PostgreSQL 16 stopped qualifying the columns of a view over one table; 15 did.
            definition = re.sub(rf"\b{re.escape(view['reads'][0])}\.", "", definition)
        blocks.append(f"CREATE VIEW {view['relname']} AS\n{definition};")
    return blocks


def _definitions(conn: psycopg.Connection, statement: str) -> list[str]:
    return [row["definition"].strip().rstrip(";") + ";" for row in conn.execute(statement)]


def dump(conn: psycopg.Connection) -> str:
    """The schema of ``conn``'s database (the public schema), as text."""
    sections = {
        "Tables": _tables(conn),
        "Views": _views(conn),
        "Indexes": _definitions(
            conn,
            f"SELECT pg_get_indexdef(c.oid) AS definition FROM pg_class c "
            f"WHERE {_PUBLIC} AND c.relkind = 'i' ORDER BY c.relname",
        ),
        "Triggers": _definitions(
            conn,
            f"SELECT pg_get_triggerdef(t.oid) AS definition FROM pg_trigger t "
            f"JOIN pg_class c ON c.oid = t.tgrelid "
            f"WHERE {_PUBLIC} AND NOT t.tgisinternal ORDER BY c.relname, t.tgname",
        ),
        "Sequences": [
            f"CREATE SEQUENCE {row['relname']};"
            for row in conn.execute(
                # An identity column's own sequence is implied by its column.
                f"SELECT c.relname FROM pg_class c WHERE {_PUBLIC} AND c.relkind = 'S' "
                "AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.objid = c.oid "
                "AND d.classid = 'pg_class'::regclass AND d.deptype = 'i') ORDER BY c.relname"
            )
        ],
        "Functions": _definitions(
            conn,
            "SELECT pg_get_functiondef(p.oid) AS definition FROM pg_proc p "
            "WHERE p.pronamespace = 'public'::regnamespace "
            "ORDER BY p.proname, pg_get_function_identity_arguments(p.oid)",
        ),
    }
    parts = [HEADER]
    for title, blocks in sections.items():
        if blocks:
            parts.append(f"-- {title} " + "-" * (95 - len(title)) + "\n\n" + "\n\n".join(blocks))
    return "\n\n".join(parts) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m media_hooks.store.schema DATABASE_URL", file=sys.stderr)
        return 2
    with psycopg.connect(argv[0], row_factory=dict_row) as conn:
        sys.stdout.write(dump(conn))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
