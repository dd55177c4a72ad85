"""A migration applied while the release before it delivers: the release keeps delivering
through it, nothing is lost or sent twice, and the rows written after it are written as the
migration intends. (docs/upgrading.md: schema first, then workers.)

The run started before a migration is the engine of the release before 0034 (its statements,
fixtures/queries.31a39f9.sql, and this code, which differs from it only where it makes and
measures partitions and moves deliveries between layouts), with the statements of the releases
before it where they differ: the ones that write the outbox by its former table's name
(fixtures/outbox_writes.03cabe3.sql, which migration 0027 replaced), and the ones that read or
write an asset's queue without the queued column of migration 0029
(fixtures/queue_reads.4740194.sql). `check` runs after, with this release's statements, on the
schema brought up to date."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import NamedTuple
from unittest import mock

import psycopg
import pytest
from psycopg.rows import dict_row

from media_hooks.core.errors import RuntimeFailure
from media_hooks.devtools.receiver import Receiver, Reply, RequestInfo
from media_hooks.engine.delivery_run import deliver_due
from media_hooks.observe import checks, figures
from media_hooks.outbox import claims, leases
from media_hooks.outbox.cohort import Cohort
from media_hooks.outbox.emit import Event, emit, emit_many
from media_hooks.outbox.maintenance import partitions, retention, sweeps
from media_hooks.store import db, migrations, sqlfiles
from media_hooks.store.sqlfiles import query
from media_hooks_tests.factories import (
    ROOMY,
    add_deliveries,
    add_destination,
    add_dispatches,
    answer,
)
from media_hooks_tests.interleaving import in_background, open_session, wait_for, wait_until_gone
from media_hooks_tests.plans import through_index

COUNT = 600
FIXTURES = Path(__file__).parent / "fixtures"
RELEASE_0033 = sqlfiles.parse_queries((FIXTURES / "queries.31a39f9.sql").read_text())
PREVIOUS_STATEMENTS = {
    **RELEASE_0033,
    **sqlfiles.parse_queries((FIXTURES / "outbox_writes.03cabe3.sql").read_text()),
    **sqlfiles.parse_queries((FIXTURES / "queue_reads.4740194.sql").read_text()),
}


def _claimed_then_published(claim):
    """The previous release's claim: the page written unpublished, then its relay's update."""

    def claim_and_publish(conn: psycopg.Connection, *args, **kwargs) -> list:
        page = claim(conn, *args, **kwargs)
        if page:
            ids = [m.message_id for m in page]
            conn.execute(query("publish_messages"), {"message_ids": ids})
        return page

    return claim_and_publish


@contextmanager
def release_0033(statements: dict[str, str] = RELEASE_0033) -> Iterator[None]:
    """This process as the release before 0034 (``statements`` run by name): it had no
    partitions to make or to measure and no previous layout to move."""
    with (
        mock.patch.dict(sqlfiles.queries(), statements),
        # Its checks are those its statements name.
        mock.patch.object(
            checks, "CHECKS", tuple(c for c in checks.CHECKS if f"check_{c.name}" in statements)
        ),
        mock.patch.object(partitions, "make_ahead", lambda conn: 0),
        mock.patch.object(partitions, "ahead_seconds", lambda conn: None),
        mock.patch.object(sweeps, "convert_previous_pending", lambda conn: 0),
    ):
        yield


@contextmanager
def previous_release() -> Iterator[None]:
    """The release before 0034, with the statements of the releases before it where they
    wrote the outbox, or read or wrote an asset's queue; and pages published after their
    claim, as their engine did."""
    claim = claims.claim_destination_page
    with (
        release_0033(PREVIOUS_STATEMENTS),
        mock.patch.object(claims, "claim_destination_page", _claimed_then_published(claim)),
    ):
        yield


def _version(name: str) -> int:
    """The version of the migration file ``name``."""
    return next(m.version for m in sqlfiles.load_migrations() if m.name == name)


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
    apply ``name`` while it delivers; the run delivers each once (the caller then checks the
    rest: ``_holds_when_current``)."""
    version = _version(name)
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
            with previous_release(), in_background(deliver) as run:
                wait_for(lambda: len(receiver.requests) >= COUNT // 8, "a run under way", 60)
                applied = migrations.migrate(conn, up_to=version).applied
                during = len(receiver.requests)
            result = run.result()
        requests = receiver.requests_by_id
    assert during < COUNT, "the migration applied while the run still delivered"
    assert result.totals.succeeded == COUNT
    assert len(requests) == COUNT and set(requests.values()) == {1}
    return MidRun(applied, during)


def _deliver_later(conn: psycopg.Connection, url: str, settings, count: int) -> tuple:
    """After a migration: ``count`` more deliveries to cdn, delivered to a receiver of its own
    by the run ``run-after`` of the release before 0034 on the schema it needs (up to 0033),
    the release that followed the migrations these tests are about; the run's result and the
    requests it got."""
    migrations.migrate(conn, up_to=_version("0033_dispatches_written_once.sql"))
    add_deliveries(conn, "cdn", count, prefix="later")
    with release_0033(), Receiver() as receiver, db.open_pool(url, max_size=4) as pool:
        conn.execute("UPDATE webhook_destination SET url = %s", (receiver.url,))
        return deliver_due(pool, "run-after", settings), receiver.requests


def _holds_when_current(conn: psycopg.Connection) -> None:
    """`check` holds once the schema is brought up to date, as this release needs it."""
    migrations.migrate(conn)
    assert checks.run(conn).holds


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
        if change.dropped_index is not None:
            wait_for(lambda: _updates(conn, change.table)[0] >= COUNT, "the statistics", 30)
            updates, hot = _updates(conn, change.table)
            assert hot >= (COUNT - during) // 2, f"{hot} of {updates} of {change.table} heap-only"
            assert change.dropped_index not in _indexes(conn)
        _holds_when_current(conn)


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
        counted = through_index(
            conn,
            "webhook_delivery_succeeded_by_destination",
            RELEASE_0033["figures_succeeded_counts"],
        )
        assert counted == [{"key": "cdn", "state": "succeeded", "n": COUNT}]
        _holds_when_current(conn)


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
        statement = "SELECT count(*) AS n FROM dispatch_outbox WHERE run_id = 'run-upgrade'"
        (row,) = through_index(conn, "dispatch_outbox_by_run", statement)
        counted = row["n"]
        assert counted == conn.execute("SELECT count(*) AS n FROM dispatch_outbox").fetchone()["n"]
        assert counted >= COUNT
        _holds_when_current(conn)


def _one(conn: psycopg.Connection, statement: str, *params):
    return next(iter(conn.execute(statement, params).fetchone().values()))


def _count(conn: psycopg.Connection, relation: str, where: str = "true") -> int:
    return conn.execute(f"SELECT count(*) AS n FROM {relation} WHERE {where}").fetchone()["n"]


def test_the_outbox_stops_copying_bodies_while_the_previous_release_delivers(
    empty_database_url, settings
):
    """0027 applied mid-run. The previous release, which inserts each dispatch with its body
    into dispatch_outbox by name, publishes and purges it so, delivers every delivery once
    through the swap: its dispatches made before it stay in the former table
    (dispatch_outbox_v1), those after it reach dispatch_outbox_v2 through the view's trigger,
    without a body; the view shows each with its delivery's body, published. This release then
    delivers more, writing dispatch_outbox_v2 itself, and the receiver gets the bodies the view
    shows. The previous release's purge and this release's then empty both tables."""
    name = "0027_outbox_body_read_from_its_delivery.sql"
    with psycopg.connect(empty_database_url, autocommit=True, row_factory=dict_row) as conn:
        assert _migrate_mid_run(conn, empty_database_url, settings, name).applied == [name]
        before, after = _count(conn, "dispatch_outbox_v1"), _count(conn, "dispatch_outbox_v2")
        assert before > 0 and after > 0 and before + after == COUNT
        columns = conn.execute(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_name = 'dispatch_outbox_v2'"
        ).fetchall()
        assert "body" not in {r["column_name"] for r in columns}
        not_its_body = "o.body IS DISTINCT FROM d.body"
        joined = "dispatch_outbox o JOIN webhook_delivery d USING (delivery_id)"
        assert _count(conn, joined, not_its_body) == 0
        assert _count(conn, "dispatch_outbox", "published_at IS NULL") == 0

        result, requests = _deliver_later(conn, empty_database_url, settings, 50)
        sent = {r.webhook_id: r.body for r in requests}
        assert result.totals.succeeded == 50
        assert _count(conn, "dispatch_outbox_v2") == after + 50
        shown = conn.execute(
            "SELECT delivery_id, body FROM dispatch_outbox WHERE run_id = 'run-after'"
        ).fetchall()
        assert {r["delivery_id"]: bytes(r["body"]) for r in shown} == sent
        assert _count(conn, "dispatch_outbox", "published_at IS NULL") == 0

        later = datetime.now(UTC) + timedelta(hours=1)
        with previous_release():
            batch = conn.execute(
                query("purge_terminal_batch"), {"cutoff": later, "batch_size": 300}
            ).fetchone()
        assert (batch["deliveries"], batch["outbox_rows"]) == (300, 300)
        with release_0033():
            rest = retention.purge_terminal(conn, later, batch_size=1000, max_batches=10)
        assert (rest.deliveries, rest.outbox_rows) == (COUNT + 50 - 300, COUNT + 50 - 300)
        for table in ("dispatch_outbox_v1", "dispatch_outbox_v2", "webhook_delivery"):
            assert _count(conn, table) == 0, table
        _holds_when_current(conn)


def test_a_dispatch_whose_body_is_not_its_deliverys_is_refused(conn):
    """What the previous release inserts into dispatch_outbox is kept without its body, which
    must then be its delivery's: another body is refused, and nothing is written."""
    add_destination(conn, "cdn", "http://127.0.0.1:9/")
    (delivery_id,) = add_deliveries(conn, "cdn", 1, previous_release=True)
    insert = (
        "INSERT INTO dispatch_outbox (message_id, delivery_id, dispatch_no, destination_id,"
        " run_id, body) SELECT delivery_id || ':1', delivery_id, 1, destination_id, 'r', {}"
        " FROM webhook_delivery"
    )
    with pytest.raises(psycopg.errors.CheckViolation, match="not its delivery's"):
        conn.execute(insert.format("'another body'::bytea"))
    assert _count(conn, "dispatch_outbox") == 0
    conn.execute(insert.format("body"))
    (row,) = conn.execute(
        "SELECT o.message_id, o.body = d.body AS same FROM dispatch_outbox o"
        " JOIN webhook_delivery d USING (delivery_id)"
    ).fetchall()
    assert row == {"message_id": f"{delivery_id}:1", "same": True}
    with pytest.raises(psycopg.errors.CheckViolation, match="only published_at changes"):
        conn.execute("UPDATE dispatch_outbox SET body = 'another body'")


def test_the_roles_that_could_write_the_outbox_still_can_after_0027(empty_database_url):
    """The previous release connecting as an application role (docs/deployment/kubernetes.md),
    or as the role that owns the tables while a superuser migrates, keeps inserting,
    publishing and purging its dispatches through the view before anyone grants it anything
    new: 0027 gives the view and the new table the former table's owner and grants."""
    suffix = uuid.uuid4().hex[:12]
    owner, app = f"mh_owner_{suffix}", f"mh_app_{suffix}"
    version = _version("0027_outbox_body_read_from_its_delivery.sql")
    with psycopg.connect(empty_database_url, autocommit=True, row_factory=dict_row) as conn:
        migrations.migrate(conn, up_to=version - 1)
        add_destination(conn, "cdn", "http://127.0.0.1:9/")
        (delivery_id,) = add_deliveries(conn, "cdn", 1)
        conn.execute(f"CREATE ROLE {owner}")
        conn.execute(f"CREATE ROLE {app}")
        try:
            conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {owner}")
            conn.execute(f"ALTER TABLE dispatch_outbox OWNER TO {owner}")
            conn.execute(
                f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {app}"
            )
            migrations.migrate(conn, up_to=version)
            for role in (owner, app):
                with conn.transaction(force_rollback=True):
                    conn.execute(f"SET LOCAL ROLE {role}")
                    conn.execute(
                        "INSERT INTO dispatch_outbox (message_id, delivery_id, dispatch_no,"
                        " destination_id, run_id, body) SELECT delivery_id || ':1', delivery_id,"
                        " 1, destination_id, 'r', body FROM webhook_delivery"
                    )
                    conn.execute("UPDATE dispatch_outbox SET published_at = now()")
                    published = "published_at IS NOT NULL"
                    assert _count(conn, "dispatch_outbox_v2", published) == 1, role
                    conn.execute(
                        "DELETE FROM dispatch_outbox WHERE delivery_id = %s", (delivery_id,)
                    )
                    assert _count(conn, "dispatch_outbox") == 0, role
        finally:
            for role in (owner, app):
                conn.execute(f"REASSIGN OWNED BY {role} TO current_user")
                conn.execute(f"DROP OWNED BY {role}")
                conn.execute(f"DROP ROLE {role}")


def test_tombstones_keep_refusing_repeats_while_0028_drops_their_index(empty_database_url):
    """0028 applied while retention purges (each batch writes its deliveries' tombstones, into
    the index 0028 drops, until it is gone): every purged id is refused afterwards, by the
    bulk emit and by emit_one, and found by tombstone_exists, through the identity's primary
    key; nothing is written twice and `check --all` holds."""
    total, batch = 3000, 10
    name = "0028_tombstones_found_by_the_identity_key.sql"
    version = _version(name)
    later = datetime.now(UTC) + timedelta(hours=1)
    with psycopg.connect(empty_database_url, autocommit=True, row_factory=dict_row) as conn:
        migrations.migrate(conn, up_to=version - 1)
        add_destination(conn, "cdn", "http://127.0.0.1:9/")
        ids = add_deliveries(conn, "cdn", total, state="succeeded")
        with (
            release_0033(),
            psycopg.connect(empty_database_url, autocommit=True, row_factory=dict_row) as purger,
            in_background(
                lambda: retention.purge_terminal(purger, later, batch_size=batch, max_batches=total)
            ) as purge,
        ):
            tombstones = partial(_count, conn, "delivery_identity", "final_state IS NOT NULL")
            wait_for(lambda: tombstones() >= total // 8, "a purge under way", 60)
            assert migrations.migrate(conn, up_to=version).applied == [name]
            during = tombstones()
        assert during < total, "the migration applied while the purge still tombstoned"
        assert purge.result().deliveries == total
        assert "delivery_identity_tombstone" not in _indexes(conn)
        assert (_count(conn, "webhook_delivery"), tombstones()) == (0, total)
        migrations.migrate(conn)  # this release's emits need the schema up to date

        again = [Event("cdn", "asset-1", "transcode.completed", {}, delivery_id=i) for i in ids]
        with conn.transaction():
            counts = emit_many(conn, again)
            first = emit(conn, again[0])
        assert (counts.inserted, counts.already_present, first.inserted) == (0, total, False)
        assert retention.is_tombstoned(conn, ids[-1])
        assert _count(conn, "webhook_delivery") == 0
        assert checks.run(conn, checks.Options(full=True)).holds


def test_the_contract_migration_drops_what_only_the_previous_release_read_mid_run(
    empty_database_url, settings
):
    """0030 (a contract migration) applied while a run delivers, none of the previous
    release's sessions connected: its three indexes go, the run delivers each delivery once and
    `check` holds; status's oldest-due figures and the checks' windows read per destination."""
    name = "0030_indexes_only_the_previous_release_read.sql"
    with psycopg.connect(empty_database_url, autocommit=True, row_factory=dict_row) as conn:
        assert _migrate_mid_run(conn, empty_database_url, settings, name).applied == [name]
        dropped = {
            "webhook_delivery_asset_queue",
            "webhook_delivery_due",
            "delivery_attempt_started",
        }
        assert dropped.isdisjoint(_indexes(conn))
        oldest = add_deliveries(conn, "cdn", 3, prefix="later")[0]
        due_at = _one(
            conn, "SELECT next_attempt_at FROM webhook_delivery WHERE delivery_id = %s", oldest
        )
        with release_0033():
            measured = figures.measure(conn)
        assert measured.oldest_due_at == due_at
        assert measured.oldest_due_any_age_seconds == measured.oldest_due_age_seconds
        _holds_when_current(conn)


def test_asset_queues_are_kept_where_they_are_read_while_the_previous_release_delivers(
    empty_database_url, settings
):
    """0029 applied mid-run (a column added under the previous release's writes, the queue's
    index built concurrently beside the old one): the previous release's deliveries, which say
    nothing of a queue (NULL), count as queued and are all in the new index, which the rule the
    claim reads now uses."""
    name = "0029_asset_queues_where_they_are_read.sql"
    with psycopg.connect(empty_database_url, autocommit=True, row_factory=dict_row) as conn:
        assert _migrate_mid_run(conn, empty_database_url, settings, name).applied == [name]
        assert _count(conn, "webhook_delivery", "queued IS NOT NULL") == 0
        add_deliveries(conn, "cdn", 3, prefix="held", asset_id="film")
        # The old queue's index (0030 drops it) answers the same query at the same cost while the
        # previous release's rows are in both; out of the way, the new one must answer alone.
        with conn.transaction(force_rollback=True):
            conn.execute("DROP INDEX webhook_delivery_asset_queue")
            (row,) = through_index(
                conn,
                "webhook_delivery_queue",
                "SELECT count(*) AS n FROM webhook_delivery WHERE destination_id = 'cdn'"
                " AND asset_id = 'film' AND queued IS NOT FALSE"
                " AND state <> 'succeeded' AND closed_reason IS NULL",
            )
        assert row["n"] == 3
        _holds_when_current(conn)


def test_moves_stop_locking_their_rows_twice_while_the_previous_release_delivers(
    empty_database_url, settings
):
    """0031 applied mid-run (the trigger swapped and the attempts' key dropped under the
    run's leases and records, the recording function replaced while it is called): the run
    delivers each delivery once and `check` holds; the identity columns are still refused, now
    after the update, and the recording function reads its rows without a lock."""
    name = "0031_moves_without_extra_row_locks.sql"
    with psycopg.connect(empty_database_url, autocommit=True, row_factory=dict_row) as conn:
        assert _migrate_mid_run(conn, empty_database_url, settings, name).applied == [name]
        timing = _one(
            conn,
            "SELECT CASE WHEN tgtype & 2 = 2 THEN 'before' ELSE 'after' END FROM pg_trigger"
            " WHERE tgname = 'webhook_delivery_immutable'",
        )
        assert timing == "after"
        keys = (
            "SELECT count(*) FROM pg_constraint WHERE conname = 'delivery_attempt_delivery_id_fkey'"
        )
        assert _one(conn, keys) == 0
        recording = "SELECT prosrc FROM pg_proc WHERE proname = 'media_hooks_record_outcomes_v1'"
        assert "FOR UPDATE OF d" not in _one(conn, recording)
        with pytest.raises(psycopg.errors.CheckViolation, match="is immutable"):
            conn.execute(
                "UPDATE webhook_delivery SET body = 'changed'::bytea"
                " WHERE delivery_id = (SELECT min(delivery_id) FROM webhook_delivery)"
            )
        _holds_when_current(conn)


# What 0032 drops from the outbox, and what it adds.
DISPATCHES_0032 = "0032_dispatches_found_by_their_message_ids.sql"
KEYS_0032 = {"dispatch_outbox_v2_one_row_per_dispatch", "dispatch_outbox_v2_delivery_id_fkey"}


def _outbox_constraints(conn: psycopg.Connection) -> set[str]:
    rows = conn.execute(
        "SELECT conname FROM pg_constraint WHERE conrelid = 'dispatch_outbox_v2'::regclass"
    )
    return {r["conname"] for r in rows}


def test_dispatches_are_found_by_their_message_ids_once_the_previous_release_has_gone(
    empty_database_url, settings
):
    """0032 (a contract migration) applied while a run delivers: the outbox's second key and
    its foreign key go, after the constraint that makes the primary key say one row per dispatch
    is validated on the run's rows. A message id that does not name its dispatch is refused, a
    dispatch written twice too, and the purge still takes every dispatch with its delivery."""
    name = DISPATCHES_0032
    with psycopg.connect(empty_database_url, autocommit=True, row_factory=dict_row) as conn:
        assert _migrate_mid_run(conn, empty_database_url, settings, name).applied == [name]
        constraints = _outbox_constraints(conn)
        assert KEYS_0032.isdisjoint(constraints | _indexes(conn))
        assert "dispatch_outbox_v2_message_id_names_dispatch" in constraints
        dispatch = (
            "INSERT INTO dispatch_outbox_v2 (message_id, delivery_id, dispatch_no,"
            " destination_id, run_id) VALUES (%s, 'd-cdn-1', %s, 'cdn', 'r')"
        )
        with pytest.raises(psycopg.errors.CheckViolation, match="names_dispatch"):
            conn.execute(dispatch, ("d-cdn-1:9", 2))
        with pytest.raises(psycopg.errors.UniqueViolation, match="dispatch_outbox_v2_pkey"):
            conn.execute(dispatch, ("d-cdn-1:1", 1))
        # A second dispatch of some, as a retry's claim makes it.
        add_dispatches(conn, [f"d-cdn-{n}" for n in range(1, 11)])
        dispatches = _one(conn, "SELECT sum(dispatch_count)::int FROM webhook_delivery")
        assert dispatches >= COUNT + 10 and _count(conn, "dispatch_outbox") == dispatches
        with release_0033():
            purged = conn.execute(
                query("purge_terminal_batch"), {"cutoff": "infinity", "batch_size": COUNT}
            ).fetchone()
            assert (purged["deliveries"], purged["outbox_rows"]) == (COUNT, dispatches)
            assert _count(conn, "dispatch_outbox") == 0
            assert checks.run(conn, checks.Options(full=True)).holds


def test_a_dispatch_another_program_wrote_with_another_id_stops_0032_until_corrected(
    empty_database_url,
):
    """0032's constraint is validated before either key goes: a message id that does not name
    its dispatch stops the migration with the constraint's name, both keys still there, and
    once the row is corrected `db migrate` applies it."""
    name = DISPATCHES_0032
    with psycopg.connect(empty_database_url, autocommit=True, row_factory=dict_row) as conn:
        migrations.migrate(conn, up_to=_version(name) - 1)
        add_destination(conn, "cdn")
        (delivery_id,) = add_deliveries(conn, "cdn", 1)
        conn.execute(
            "INSERT INTO dispatch_outbox_v2 (message_id, delivery_id, dispatch_no,"
            " destination_id, run_id) VALUES ('a1b2c3', %s, 1, 'cdn', 'other-program')",
            (delivery_id,),
        )
        with pytest.raises(RuntimeFailure, match="dispatch_outbox_v2_message_id_names_dispatch"):
            migrations.migrate(conn)
        assert KEYS_0032 <= _outbox_constraints(conn)
        conn.execute(
            "UPDATE dispatch_outbox_v2 SET message_id = delivery_id || ':' || dispatch_no"
            " WHERE message_id <> delivery_id || ':' || dispatch_no"
        )
        assert migrations.migrate(conn).applied[0] == name  # and the migrations after it
        assert KEYS_0032.isdisjoint(_outbox_constraints(conn))


def test_dispatches_fill_their_pages_once_the_previous_release_has_gone(
    empty_database_url, settings
):
    """0033 (a contract migration) applied while a run of the previous release delivers, which
    publishes each page it claims by an update: every delivery is delivered once and every
    dispatch published. This release's claims then write each dispatch published, never updated,
    and the pages they fill are filled whole (0022 had left half of each free for the update)."""
    name = "0033_dispatches_written_once.sql"
    with psycopg.connect(empty_database_url, autocommit=True, row_factory=dict_row) as conn:
        assert _migrate_mid_run(conn, empty_database_url, settings, name).applied == [name]
        options = "SELECT reloptions FROM pg_class WHERE relname = 'dispatch_outbox_v2'"
        assert _one(conn, options) is None
        assert _count(conn, "dispatch_outbox", "published_at IS NULL") == 0

        result, _ = _deliver_later(conn, empty_database_url, settings, 400)
        assert result.totals.succeeded == 400
        written = "run_id = 'run-after' AND published_at = created_at"
        assert _count(conn, "dispatch_outbox_v2", written) == 400
        # The bytes of each page that only this release's dispatches filled (the last, still
        # filling, aside): a row's size and its line pointer.
        used = conn.execute(
            """
            WITH placed AS (
                SELECT (ctid::text::point)[0] AS page, pg_column_size(o.*) + 4 AS size, run_id
                FROM dispatch_outbox_v2 AS o
            )
            SELECT page, sum(size) AS bytes
            FROM placed
            GROUP BY page
            HAVING bool_and(run_id = 'run-after') AND page < (SELECT max(page) FROM placed)
            """
        ).fetchall()
        assert used and all(r["bytes"] > 0.8 * 8192 for r in used), used
        _holds_when_current(conn)


LEAN = "0034_lean_hot_path.sql"
CONTRACT_NAMES = "0035_contract_names_read_both_layouts.sql"


def _events(destination_id: str, prefix: str, count: int) -> list[Event]:
    """``count`` events for ``destination_id``, deliveries ``<prefix>-<n>``."""
    return [
        Event(destination_id, f"asset-{n}", "transcode.completed", {"n": n}, f"{prefix}-{n}")
        for n in range(1, count + 1)
    ]


def _refuses_every_tenth_run_delivery(info: RequestInfo) -> Reply:
    """A receiver that refuses every tenth delivery of the run for good (they end dead) and
    takes a moment over the others, so that the run is still delivering while 0034 applies."""
    prefix, _, n = info.webhook_id.rpartition("-")
    if prefix == "run" and int(n) % 10 == 0:
        return Reply(status=400)
    return Reply(delay_seconds=0.05)


def test_every_delivery_is_kept_once_from_the_previous_release_into_the_lean_layout(
    empty_database_url, settings
):
    """Issue 34, done when. The previous release's data, written by its own statements on the
    schema up to 0033: deliveries pending, leased by a worker of it that is still connected,
    then dead (refused), succeeded, with their attempts and dispatches, as its run delivers.
    0034 applies while that run delivers (its claims, leases and records go on through the
    contract's names, now views over its renamed tables, and its producers keep recording
    there); its worker answers some of its leases after this release's sweeps moved its pending
    deliveries into this release's layout, and this release's run delivers them. `db migrate`
    leaves 0035 pending while that worker is connected and applies it once it has gone, ending
    the leases it left (an ambiguous attempt each, due again: this release delivers them) and
    its tokens with them (it comes back and records nothing). At the end every delivery is in
    webhook_delivery once, in the state its answers made; every request was sent once, every
    dispatch is in the outbox once, and `check --all` holds."""
    url = empty_database_url
    rejected = COUNT // 10
    with (
        psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn,
        Receiver(script=_refuses_every_tenth_run_delivery) as receiver,
        # A worker of the previous release, named as its sessions name themselves.
        open_session(url, autocommit=True, application_name="media_hooks:worker:g33") as worker,
    ):
        migrations.migrate(conn, up_to=_version(LEAN) - 1)
        add_destination(conn, "cdn", receiver.url, rate_per_second=500, burst=50, max_in_flight=8)
        add_destination(conn, "other", receiver.url, **ROOMY)
        emitted = _events("cdn", "run", COUNT) + _events("other", "old", 40)
        with release_0033():
            with conn.transaction():
                emit_many(conn, emitted)
            page = claims.claim_destination_page(worker, "run-held", "other", Cohort(), 12)
            held = leases.lease_with_permits(
                worker,
                "run-held",
                "other",
                page,
                holder="run-held",
                lease_seconds=90.0,
                release_slots=[],
            ).leases
            assert len(held) == 12
            later = _events("other", "after", 20)
            with db.open_pool(url, max_size=8) as pool:
                deliver = partial(
                    deliver_due,
                    pool,
                    "run-old",
                    settings,
                    Cohort(destination_ids=("cdn",)),
                    page_size=25,
                )
                with in_background(deliver) as run:
                    wait_for(lambda: len(receiver.requests) >= COUNT // 8, "a run under way", 60)
                    assert migrations.migrate(conn, up_to=_version(LEAN)).applied == [LEAN]
                    during = len(receiver.requests)
                    with conn.transaction():
                        assert emit_many(conn, later).inserted == len(later)
                result = run.result()
        emitted += later
        assert during < COUNT, "0034 applied while the run still delivered"
        assert (result.totals.succeeded, result.totals.dead) == (COUNT - rejected, rejected)
        assert _count(conn, "webhook_delivery_v1") == len(emitted)

        # This release's sweeps move every pending delivery of the previous layout, not the
        # ones its worker holds.
        sweeps.run_sweeps(conn, settings)
        holding = {lease.delivery_id for lease in held}
        pending = {e.delivery_id for e in emitted if e.destination_id == "other"} - holding
        moved = conn.execute("SELECT delivery_id FROM delivery_state").fetchall()
        assert {r["delivery_id"] for r in moved} == pending
        assert _count(conn, "webhook_delivery_v1", "state = 'pending'") == 0

        answered, abandoned = held[:8], held[8:]
        with release_0033():
            recorded = leases.record_classified(
                worker,
                [answer(lease, "success", 200) for lease in answered[:4]]
                + [answer(lease, "retryable", 503) for lease in answered[4:]],
            )
        assert sorted(recorded.states.values()) == ["pending"] * 4 + ["succeeded"] * 4
        with db.open_pool(url, max_size=4) as pool:
            assert deliver_due(pool, "run-new", settings).totals.succeeded == len(pending)

        waiting = migrations.migrate(conn)
        assert (waiting.applied, waiting.deferred) == ([], [CONTRACT_NAMES])
        assert waiting.waiting_for == "worker 1 (g33)"
        pid = worker.info.backend_pid
        worker.close()
        wait_until_gone(conn, pid)
        assert migrations.migrate(conn).applied == [CONTRACT_NAMES]
        # A worker of it that comes back can record nothing: the contract's names no longer
        # take its writes.
        with release_0033(), pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
            leases.record_classified(conn, [answer(lease, "success", 200) for lease in abandoned])
        with db.open_pool(url, max_size=4) as pool:
            assert deliver_due(pool, "run-last", settings).totals.succeeded == len(abandoned)

        rows = conn.execute("SELECT delivery_id, state FROM webhook_delivery").fetchall()
        assert sorted(r["delivery_id"] for r in rows) == sorted(e.delivery_id for e in emitted)
        assert Counter(r["state"] for r in rows) == {
            "succeeded": len(emitted) - rejected - 4,
            "dead": rejected,
            "pending": 4,  # the worker's retryable answers, due after their backoff
        }
        assert (
            _count(conn, "webhook_delivery_v1", "state IN ('pending', 'enqueued', 'leased')") == 0
        )
        # The previous release's worker answered without a request (the test answers for it).
        answered_ids = {lease.delivery_id for lease in answered}
        assert receiver.requests_by_id == {
            e.delivery_id: 1 for e in emitted if e.delivery_id not in answered_ids
        }
        assert _count(conn, "delivery_attempt", "outcome = 'ambiguous'") == len(abandoned)
        dispatches = _one(conn, "SELECT sum(dispatch_count)::int FROM webhook_delivery")
        assert (
            _one(conn, "SELECT count(DISTINCT message_id)::int FROM dispatch_outbox") == dispatches
        )
        assert _count(conn, "dispatch_outbox") == dispatches
        assert checks.run(conn, checks.Options(full=True)).holds
