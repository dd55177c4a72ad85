"""``sql/schema.sql`` is the schema the migrations produce: a reader sees every table, index and
function as it stands without replaying the migrations."""

from __future__ import annotations

import os

import psycopg
from psycopg.rows import dict_row

from media_hooks.store import schema
from media_hooks_tests.conftest import REPO

SCHEMA = REPO / "sql" / "schema.sql"
UPDATE = "MEDIA_HOOKS_UPDATE_SCHEMA"


def test_schema_sql_is_what_the_migrations_produce(database_url):
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        produced = schema.dump(conn)
    if os.environ.get(UPDATE) == "1":
        SCHEMA.write_text(produced)
    assert SCHEMA.read_text() == produced, (
        f"sql/schema.sql differs from what the migrations produce: regenerate it with "
        f"{UPDATE}=1 pytest {os.path.relpath(__file__, REPO)} and commit it"
    )


def test_the_dump_reads_what_a_migration_adds(conn):
    """The dump itself: a table, an index, a view and a function added show up in it."""
    conn.execute("CREATE TABLE zz_probe (id bigint PRIMARY KEY, note text DEFAULT 'x')")
    conn.execute("CREATE INDEX zz_probe_note ON zz_probe (note)")
    conn.execute("CREATE VIEW zz_probe_notes AS SELECT note FROM zz_probe")
    conn.execute("CREATE FUNCTION zz_probe_one() RETURNS int LANGUAGE sql AS 'SELECT 1'")
    dumped = schema.dump(conn)
    assert (
        "CREATE TABLE zz_probe (\n    id bigint NOT NULL,\n    note text DEFAULT 'x'::text"
        in dumped
    )
    assert "CREATE INDEX zz_probe_note ON public.zz_probe USING btree (note);" in dumped
    assert "CREATE VIEW zz_probe_notes AS\n SELECT note\n   FROM zz_probe;" in dumped
    assert "FUNCTION public.zz_probe_one()" in dumped
