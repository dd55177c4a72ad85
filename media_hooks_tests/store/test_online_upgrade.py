"""A migration applied while the release before it delivers: the release keeps delivering
through it, nothing is lost or sent twice, and the rows written after it are written as the
migration intends. (docs/upgrading.md: schema first, then workers.)"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import psycopg
import pytest
from psycopg.rows import dict_row

from media_hooks.devtools.receiver import Receiver, Reply
from media_hooks.engine.delivery_run import deliver_due
from media_hooks.observe import checks
from media_hooks.store import db, migrations, sqlfiles
from media_hooks.store.sqlfiles import query
from media_hooks_tests.factories import add_deliveries, add_destination
from media_hooks_tests.interleaving import in_background, wait_for

COUNT = 600


class InPlace(NamedTuple):
    """What a migration changes in place: a table's pages left part free, and where it drops
    the index that named the column of the table's one update, that update made heap-only."""

    table: str
    fillfactor: int
    dropped_index: str | None


IN_PLACE = {
    "0022_outbox_published_in_place.sql": InPlace(
        "dispatch_outbox", 50, "dispatch_outbox_unpublished"
    ),
    "0023_attempts_ended_in_place.sql": InPlace(
        "delivery_attempt", 50, "delivery_attempt_finished"
    ),
    "0024_delivery_moves_on_their_page.sql": InPlace("webhook_delivery", 70, None),
}


def _updates(conn: psycopg.Connection, table: str) -> tuple[int, int]:
    """A table's updates and heap-only updates, as the server's statistics have them (a
    backend reports its own when it ends, so after the run's pool closed: all of them)."""
    row = conn.execute(
        "SELECT n_tup_upd AS updates, n_tup_hot_upd AS hot"
        " FROM pg_stat_user_tables WHERE relname = %s",
        (table,),
    ).fetchone()
    return row["updates"], row["hot"]


class MidRun(NamedTuple):
    applied: list[str]
    # Requests the receiver had when the migration was done: fewer than COUNT, or it was not
    # applied mid-run.
    during: int


def _migrate_mid_run(conn: psycopg.Connection, url: str, settings, name: str) -> MidRun:
    """Migrate to the migration before ``name``, start a run delivering COUNT deliveries and
    apply ``name`` while it delivers; the run delivers each once and `check` holds after."""
    version = next(m.version for m in sqlfiles.load_migrations() if m.name == name)
    migrations.migrate(conn, up_to=version - 1)
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
                applied = migrations.migrate(conn, up_to=version).applied
                during = len(receiver.requests)
            result = run.result()
        requests = receiver.requests_by_id
    assert during < COUNT, "the migration applied while the run still delivered"
    assert result.totals.succeeded == COUNT
    assert len(requests) == COUNT and set(requests.values()) == {1}
    assert checks.run(conn).holds
    return MidRun(applied, during)


def _indexes(conn: psycopg.Connection) -> set[str]:
    return {r["indexname"] for r in conn.execute("SELECT indexname FROM pg_indexes")}


@pytest.mark.parametrize("name", sorted(IN_PLACE))
def test_an_update_goes_in_place_while_the_previous_release_delivers(
    empty_database_url, settings, name
):
    """The migration applied mid-run: the run started on the schema before it delivers every
    delivery once, `check` holds, and the table's pages are left part free; where an index
    goes, the table's updates made after the migration are heap-only (before it, none can be:
    the index names a column they change). 0022: the outbox's publications; 0023: the
    attempts' endings; 0024: the deliveries' state moves, on their own page."""
    change = IN_PLACE[name]
    with psycopg.connect(empty_database_url, autocommit=True, row_factory=dict_row) as conn:
        applied, during = _migrate_mid_run(conn, empty_database_url, settings, name)
        assert applied == [name]
        (options,) = (
            conn.execute("SELECT reloptions FROM pg_class WHERE relname = %s", (change.table,))
            .fetchone()
            .values()
        )
        assert options == [f"fillfactor={change.fillfactor}"]
        if change.dropped_index is None:
            return
        wait_for(lambda: _updates(conn, change.table)[0] >= COUNT, "the statistics", 30)
        updates, hot = _updates(conn, change.table)
        assert hot >= (COUNT - during) // 2, f"{hot} of {updates} of {change.table} heap-only"
        assert change.dropped_index not in _indexes(conn)


def test_the_counts_index_is_swapped_while_the_previous_release_delivers(
    empty_database_url, settings
):
    """0025 applied mid-run: the index every state move wrote (destination_id, state) goes,
    the succeeded deliveries' own index comes, complete (built concurrently while the run
    moved rows into it), and `status` counts through it what the rows hold."""
    name = "0025_one_index_fewer_per_move.sql"
    with psycopg.connect(empty_database_url, autocommit=True, row_factory=dict_row) as conn:
        assert _migrate_mid_run(conn, empty_database_url, settings, name).applied == [name]
        indexes = _indexes(conn)
        assert "webhook_delivery_destination_state" not in indexes
        assert "webhook_delivery_succeeded_by_destination" in indexes
        valid = conn.execute(
            "SELECT indisvalid AS v FROM pg_index"
            " WHERE indexrelid = 'webhook_delivery_succeeded_by_destination'::regclass"
        ).fetchone()
        assert valid["v"]
        with conn.transaction(force_rollback=True):
            # Through the new index alone: it holds every delivery the run moved.
            conn.execute("SET LOCAL enable_seqscan = off")
            conn.execute("SET LOCAL enable_bitmapscan = off")
            statement = query("figures_succeeded_counts")
            plan = "\n".join(r["QUERY PLAN"] for r in conn.execute("EXPLAIN " + statement))
            counted = conn.execute(statement).fetchall()
        assert "webhook_delivery_succeeded_by_destination" in plan, plan
        assert counted == [{"key": "cdn", "state": "succeeded", "n": COUNT}]


def test_the_run_index_is_narrowed_while_the_previous_release_delivers(
    empty_database_url, settings
):
    """0026 applied mid-run: the outbox's run index keeps run_id alone (built concurrently
    while the run dispatched into it, complete: the run's recovery finds every dispatch by it),
    and the attempts' run index, which nothing read, goes."""
    name = "0026_run_indexes_without_history.sql"
    with psycopg.connect(empty_database_url, autocommit=True, row_factory=dict_row) as conn:
        assert _migrate_mid_run(conn, empty_database_url, settings, name).applied == [name]
        indexes = _indexes(conn)
        assert {"dispatch_outbox_run", "delivery_attempt_run"}.isdisjoint(indexes)
        valid = conn.execute(
            "SELECT indisvalid AS v FROM pg_index"
            " WHERE indexrelid = 'dispatch_outbox_by_run'::regclass"
        ).fetchone()
        assert valid["v"]
        with conn.transaction(force_rollback=True):
            conn.execute("SET LOCAL enable_seqscan = off")
            conn.execute("SET LOCAL enable_bitmapscan = off")
            statement = "SELECT count(*) AS n FROM dispatch_outbox WHERE run_id = 'run-upgrade'"
            plan = "\n".join(r["QUERY PLAN"] for r in conn.execute("EXPLAIN " + statement))
            (counted,) = conn.execute(statement).fetchone().values()
        assert "dispatch_outbox_by_run" in plan, plan
        assert counted == conn.execute("SELECT count(*) AS n FROM dispatch_outbox").fetchone()["n"]
        assert counted >= COUNT
