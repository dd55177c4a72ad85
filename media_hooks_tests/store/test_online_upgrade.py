"""A migration applied while the release before it delivers: the release keeps delivering
through it, nothing is lost or sent twice, and the rows written after it are written as the
migration intends. (docs/upgrading.md: schema first, then workers.)"""

from __future__ import annotations

from functools import partial

import psycopg
from psycopg.rows import dict_row

from media_hooks.devtools.receiver import Receiver, Reply
from media_hooks.engine.delivery_run import deliver_due
from media_hooks.observe import checks
from media_hooks.store import db, migrations, sqlfiles
from media_hooks_tests.factories import add_deliveries, add_destination
from media_hooks_tests.interleaving import in_background, wait_for

IN_PLACE = "0022_outbox_published_in_place.sql"
COUNT = 600


def _updates(conn: psycopg.Connection, table: str) -> tuple[int, int]:
    """A table's updates and heap-only updates, as the server's statistics have them (a
    backend reports its own when it ends, so after the run's pool closed: all of them)."""
    row = conn.execute(
        "SELECT n_tup_upd AS updates, n_tup_hot_upd AS hot"
        " FROM pg_stat_user_tables WHERE relname = %s",
        (table,),
    ).fetchone()
    return row["updates"], row["hot"]


def test_the_outbox_goes_in_place_while_the_previous_release_delivers(empty_database_url, settings):
    """0022 applied mid-run: the run started on 0021's schema delivers every delivery once,
    `check` holds, and the publications made after the migration are heap-only updates (before
    it, none can be: dispatch_outbox_unpublished names the column they change)."""
    url = empty_database_url
    files = sqlfiles.load_migrations()
    before = next(m.version for m in files if m.name == IN_PLACE) - 1
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        migrations.migrate(conn, up_to=before)
        # A reply that takes a moment keeps the run going while the migration applies.
        with Receiver(reply=Reply(delay_seconds=0.05)) as receiver:
            add_destination(
                conn, "cdn", url=receiver.url, rate_per_second=500, burst=50, max_in_flight=8
            )
            add_deliveries(conn, "cdn", COUNT)
            with db.open_pool(url, max_size=8) as pool:
                # Small pages: most of the run's claims come after the migration.
                deliver = partial(deliver_due, pool, "run-upgrade", settings, page_size=25)
                with in_background(deliver) as run:
                    wait_for(lambda: len(receiver.requests) >= COUNT // 8, "a run under way", 60)
                    applied = migrations.migrate(conn).applied
                    during = len(receiver.requests)
                result = run.result()
            requests = receiver.requests_by_id
        assert applied == [IN_PLACE]
        assert during < COUNT, "the migration applied while the run still delivered"
        assert result.totals.succeeded == COUNT
        assert len(requests) == COUNT and set(requests.values()) == {1}
        assert checks.run(conn).holds
        wait_for(lambda: _updates(conn, "dispatch_outbox")[0] >= COUNT, "the statistics", 30)
        updates, hot = _updates(conn, "dispatch_outbox")
        assert hot >= (COUNT - during) // 2, f"{hot} of {updates} publications heap-only"
        indexes = {r["indexname"] for r in conn.execute("SELECT indexname FROM pg_indexes")}
        assert "dispatch_outbox_unpublished" not in indexes
