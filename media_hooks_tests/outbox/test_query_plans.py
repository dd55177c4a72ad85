"""The hot statements are index scans on a realistic table, not sequential scans (issue 2).

Each plan is printed (``pytest -s`` shows them) and checked: no statement of the delivery
protocol may read a whole table of deliveries, dispatches or attempts, in either layout while
both hold deliveries (migration 0034: the previous release's beside this one's).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from psycopg.rows import dict_row

from media_hooks.orchestration.metadata import rows_of_run
from media_hooks.outbox import rate_limits
from media_hooks.outbox.claims import claim_destination_page
from media_hooks.outbox.cohort import Cohort
from media_hooks.outbox.emit import Event, emit_many
from media_hooks.store.db import with_database
from media_hooks.store.sqlfiles import queries, query
from media_hooks_tests.conftest import create_database, drop_database
from media_hooks_tests.factories import add_deliveries, add_destination, claim_all
from media_hooks_tests.plans import (
    LAYOUT_TABLES,
    analyzed,
    rows_read,
    seq_scans,
    sql_block,
    table_of,
)

BIG_TABLES = {
    *LAYOUT_TABLES,
    # The previous layout's, which the previous release writes while it runs and retention
    # empties after it.
    "webhook_delivery_v1",
    "dispatch_outbox_v1",
    "dispatch_outbox_v2",
    "delivery_attempt_v1",
}

# The tables a move writes: an open delivery's state row and its timer.
HOT_TABLES = ("delivery_state", "delivery_timer")


def _seq_scans(conn: psycopg.Connection, plan: dict) -> list[str]:
    return seq_scans(conn, plan, BIG_TABLES)


@pytest.fixture(scope="module")
def loaded(server_url, template_name):
    """One loaded database for every plan: EXPLAIN without ANALYZE changes nothing.

    Both layouts hold deliveries, as while the previous release runs beside this one: this
    release's backlog, claimed in part by many runs, and its history (ended deliveries, their
    attempts and dispatches, partitioned by creation time); the previous release's history and
    deliveries in flight in its tables."""
    name = create_database(server_url, template=template_name)
    with psycopg.connect(
        with_database(server_url, name), autocommit=True, row_factory=dict_row
    ) as conn:
        add_destination(conn, "cdn")
        add_deliveries(conn, "cdn", 20_000)
        for run in range(20):  # many runs' dispatches: a run is a small part of the outbox
            claim_all(conn, f"run-{run}", Cohort(), page_size=500, max_rows=500)
        # This release's history: ended deliveries (their attempts and dispatches below).
        add_deliveries(conn, "cdn", 20_000, state="succeeded")
        # The previous release's backlog in its layout, half of it claimed by its runs as its
        # claim did (enqueued, a dispatch each in dispatch_outbox_v2); as in a database migrated
        # past 0027, the older runs' dispatches in the outbox's former table, with their bodies.
        add_deliveries(conn, "cdn", 20_000, prefix="previous", previous_release=True)
        conn.execute(
            """
            WITH claimed AS (
                UPDATE webhook_delivery_v1
                SET state = 'enqueued', dispatch_count = 1,
                    current_message_id = delivery_id || ':1', updated_at = now()
                WHERE split_part(delivery_id, '-', 3)::integer <= 10000
                RETURNING delivery_id, destination_id, current_message_id, body,
                          (split_part(delivery_id, '-', 3)::integer - 1) / 500 AS run_no
            ),
            former AS (
                INSERT INTO dispatch_outbox_v1
                    (message_id, delivery_id, dispatch_no, destination_id, run_id, body,
                     published_at)
                SELECT current_message_id, delivery_id, 1, destination_id,
                       'previous-run-' || run_no, body, now()
                FROM claimed
                WHERE run_no < 2
            )
            INSERT INTO dispatch_outbox_v2
                (message_id, delivery_id, dispatch_no, destination_id, run_id, published_at)
            SELECT current_message_id, delivery_id, 1, destination_id, 'previous-run-' || run_no,
                   now()
            FROM claimed
            WHERE run_no >= 2
            """
        )
        # The outbox's history: five earlier dispatches of every delivery, by runs long gone
        # (a dispatch is a narrow row: a small outbox is read faster whole than by index).
        conn.execute(
            """
            INSERT INTO dispatch_outbox_v3
                (message_id, delivery_id, dispatch_no, destination_id, run_id,
                 delivery_created_at, published_at)
            SELECT d.delivery_id || ':' || n, d.delivery_id, n, d.destination_id, 'history',
                   d.created_at, now()
            FROM (SELECT delivery_id, destination_id, created_at FROM delivery_state
                  UNION ALL
                  SELECT delivery_id, destination_id, created_at FROM delivery_history) AS d
            CROSS JOIN generate_series(101, 105) AS n;
            INSERT INTO dispatch_outbox_v2
                (message_id, delivery_id, dispatch_no, destination_id, run_id, published_at)
            SELECT d.delivery_id || ':' || n, d.delivery_id, n, d.destination_id, 'history',
                   now()
            FROM webhook_delivery_v1 AS d CROSS JOIN generate_series(101, 105) AS n;
            """
        )
        # A history: one finished attempt for every delivery, of its current dispatch if any,
        # in its layout's table (this release's under the delivery's creation time).
        conn.execute(
            """
            INSERT INTO delivery_attempt_v2
                (delivery_id, attempt_no, destination_id, message_id, run_id, lease_token,
                 delivery_created_at, started_at, finished_at, outcome)
            SELECT d.delivery_id, 1, d.destination_id, o.message_id, o.run_id,
                   gen_random_uuid(), d.created_at, now(), now(), 'retryable'
            FROM (SELECT delivery_id, destination_id, created_at, current_message_id
                  FROM delivery_state
                  UNION ALL
                  SELECT delivery_id, destination_id, created_at, current_message_id
                  FROM delivery_history) AS d
            LEFT JOIN dispatch_outbox_v3 AS o
              ON o.message_id = d.current_message_id AND o.delivery_created_at = d.created_at;
            INSERT INTO delivery_attempt_v1 (delivery_id, attempt_no, destination_id, message_id,
                                             run_id, lease_token, finished_at, outcome)
            SELECT d.delivery_id, 1, d.destination_id, o.message_id, o.run_id,
                   gen_random_uuid(), now(), 'retryable'
            FROM webhook_delivery_v1 AS d
            LEFT JOIN dispatch_outbox AS o ON o.message_id = d.current_message_id;
            """
        )
        conn.execute("VACUUM ANALYZE")
        yield conn
    drop_database(server_url, name)


def _ids(n: int) -> list[str]:
    return [f"d-cdn-{i}" for i in range(1, n + 1)]


def _step(run_id: str, offered: list[dict]) -> dict:
    """lease_with_permits' parameters: one worker's step offering ``offered`` on cdn."""
    return {
        "destination_id": "cdn",
        "holder": run_id,
        "hold_seconds": 90,
        "slot_poll_seconds": rate_limits.SLOT_POLL_SECONDS,
        "disabled_poll_seconds": rate_limits.DISABLED_POLL_SECONDS,
        "ahead_seconds": rate_limits.AHEAD_SECONDS,
        "release_slots": [],
        "run_id": run_id,
        "delivery_ids": [r["delivery_id"] for r in offered],
        "message_ids": [r["current_message_id"] for r in offered],
    }


STATEMENTS = {
    "claim_destination_page": lambda: {
        "run_id": "r",
        "destination_id": "cdn",
        "page_size": 250,
        **Cohort().params(),
    },
    "due_destinations": lambda: Cohort().params(),
    "lease_with_permits": lambda: _step(
        "r", [{"delivery_id": i, "current_message_id": f"{i}:1"} for i in _ids(100)]
    ),
    "record_classified_outcomes": lambda: {
        "outcomes": json.dumps(
            [
                {"delivery_id": i, "lease_token": str(uuid.uuid4()), "outcome": "success"}
                for i in _ids(100)
            ]
        )
    },
    "defer_deliveries": lambda: {
        "delivery_ids": _ids(100),
        "message_ids": [f"{i}:1" for i in _ids(100)],
        "delay_seconds": 0.0,
        "reason": "x",
    },
    "sweep_expired_leases": lambda: {"limit_rows": 1000},
    "sweep_stale_enqueues": lambda: {"timeout_seconds": 3600, "limit_rows": 1000},
    # Read for every failed run the recovery sensor finds.
    "run_dispatched": lambda: {"run_id": "run-1"},
    "release_run": lambda: {
        "run_id": "run-1",
        "destination_ids": None,
        "cause": "released: run run-1 failed",
        "error": "run failed before an outcome was recorded",
    },
    # Read by every delivery run's summary and the outbox checks (media_hooks.observe.figures).
    "figures_oldest_due_by_destination": lambda: {"now": None},
    # A delivery's dispatches by their message ids, through the outbox's two primary keys
    # (migration 0032: no index by delivery_id).
    "purge_terminal_batch": lambda: {"cutoff": "infinity", "batch_size": 1000},
    "inspection_dispatches": lambda: {"delivery_id": "d-cdn-1"},
}


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_hot_statement_uses_indexes(loaded, name):
    statement = f"EXPLAIN (FORMAT JSON) {query(name)}"
    (plan,) = loaded.execute(statement.encode(), STATEMENTS[name]()).fetchone()["QUERY PLAN"]
    print(f"\n{name}:\n{json.dumps(plan['Plan'], indent=1)[:4000]}")
    assert _seq_scans(loaded, plan["Plan"]) == []


def test_the_operators_queries_for_a_run_have_an_index_to_go_by(loaded):
    """The queries a delivery run's metadata gives the operator (its dispatches, its attempts)
    can find the run's rows by index, not only in the outbox's or the attempts' whole history.
    With sequential scans priced out, a query with no index path would still scan; on this
    small table the planner may rightly prefer a scan, as it does not on a table of millions."""
    for statement in sql_block(rows_of_run("run-1")):
        with loaded.transaction(force_rollback=True):
            loaded.execute("SET LOCAL enable_seqscan = off")
            (plan,) = loaded.execute(f"EXPLAIN (FORMAT JSON) {statement}").fetchone()["QUERY PLAN"]
        assert _seq_scans(loaded, plan["Plan"]) == [], statement


def _delivery_indexes(plan: dict, relation: str = "delivery_state") -> set[str]:
    """How each node reads ``relation`` (its partitions included): index names, or 'Seq Scan'.
    A bitmap heap scan reads by the indexes of its bitmap index scans."""
    found = set()
    if table_of(plan.get("Relation Name", "")) == relation and "Scan" in plan["Node Type"]:
        if plan["Node Type"] == "Bitmap Heap Scan":
            return _bitmap_indexes(plan)
        found.add(plan.get("Index Name") or plan["Node Type"])
    for child in plan.get("Plans", []):
        found |= _delivery_indexes(child, relation)
    return found


def _bitmap_indexes(plan: dict) -> set[str]:
    found = {plan["Index Name"]} if plan.get("Node Type") == "Bitmap Index Scan" else set()
    for child in plan.get("Plans", []):
        found |= _bitmap_indexes(child)
    return found


@pytest.fixture(scope="module")
def stale(server_url, template_name):
    """Statistics taken while every delivery was pending (every timer due); then all are
    claimed and half leased.

    Right after a claim the planner believes almost nothing is enqueued or leased, and no
    timer in flight. A statement that tests the state or the timer's kind where it should
    look rows up by key would then walk a partial index (the timers in flight), every row in
    it once per row it wants (this made recording outcomes 20 times slower per row in the
    delivery benchmark).
    """
    name = create_database(server_url, template=template_name)
    with psycopg.connect(
        with_database(server_url, name), autocommit=True, row_factory=dict_row
    ) as conn:
        for table in HOT_TABLES:
            conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        add_destination(conn, "cdn")
        add_deliveries(conn, "cdn", 20_000)
        conn.execute(f"VACUUM ANALYZE {', '.join(HOT_TABLES)}")
        claim_all(conn, "run-1", Cohort(), page_size=5000)
        offered = conn.execute(
            "SELECT array_agg(delivery_id) AS d, array_agg(current_message_id) AS m FROM "
            "(SELECT delivery_id, current_message_id FROM delivery_state ORDER BY delivery_id "
            "LIMIT 10000) AS half"
        ).fetchone()
        conn.execute(
            "SELECT count(*) FROM media_hooks_lease_v2('run-1', %s, %s, 90)",
            (offered["d"], offered["m"]),
        )
        yield conn
    drop_database(server_url, name)


def test_classified_outcomes_are_recorded_by_key_whatever_the_statistics_say(stale):
    """The record of migration 0017, with every branch taken (successes, a pause, a 410): each
    statement inside it reads deliveries and their timers by key, and a success's older
    revisions (migration 0020) through one asset's open queue."""
    leased = stale.execute(
        "SELECT delivery_id, lease_token FROM delivery_state WHERE state = 'leased' LIMIT 25"
    ).fetchall()
    answers = [("success", 200)] * 22 + [("rate_limited", 429)] * 2 + [("rejected", 410)]
    document = [
        {
            "delivery_id": r["delivery_id"],
            "lease_token": str(r["lease_token"]),
            "outcome": outcome,
            "http_status": status,
            "finished_ago": 0.01,
        }
        for r, (outcome, status) in zip(leased, answers, strict=True)
    ]
    with _explaining(stale) as plans:
        rows = stale.execute(
            query("record_classified_outcomes"), {"outcomes": json.dumps(document)}
        ).fetchall()
    assert len([r for r in rows if r["state"]]) == 25
    reads = {i for p in plans for i in _hot_indexes(p["Plan"])}
    assert {"delivery_state_pkey", "delivery_timer_pkey"} <= reads <= BY_KEY


@contextmanager
def _explaining(conn: psycopg.Connection) -> Iterator[list[dict]]:
    """auto_explain's plans of what runs inside, nested statements included (the lease runs
    inside media_hooks_lease_v2, where EXPLAIN cannot see)."""
    plans: list[dict] = []

    def collect(diagnostic: psycopg.errors.Diagnostic) -> None:
        text = diagnostic.message_primary or ""
        if "plan:" in text:
            plans.append(json.loads(text.split("plan:", 1)[1]))

    conn.add_notice_handler(collect)
    try:
        with conn.transaction(force_rollback=True):  # the settings and the leases roll back
            for setting in (
                "LOAD 'auto_explain'",
                "SET LOCAL auto_explain.log_min_duration = 0",
                "SET LOCAL auto_explain.log_nested_statements = on",
                "SET LOCAL auto_explain.log_format = json",
                "SET LOCAL auto_explain.log_level = notice",
                "SET LOCAL client_min_messages = notice",
            ):
                conn.execute(setting)
            yield plans
    finally:
        conn.remove_notice_handler(collect)


def _lease_indexes(conn: psycopg.Connection, offered: list[dict]) -> tuple[int, set[str]]:
    """Lease ``offered`` (rolled back); how many were leased and how the lease read deliveries."""
    with _explaining(conn) as plans:
        rows = conn.execute(query("lease_with_permits"), _step("run-2", offered)).fetchall()
    leased = [r for r in rows if r["delivery_id"] is not None]
    # The lease itself, and what it runs when it could not lease all: the hand-back of held
    # offers (migration 0021) and the ending of expired leases.
    nested = [
        p
        for p in plans
        if "WITH wanted AS" in p.get("Query Text", "")
        or "WITH ending AS" in p.get("Query Text", "")
        or "media_hooks_parking_v2(true, now())" in p.get("Query Text", "")
    ]
    assert nested, [p.get("Query Text", "")[:80] for p in plans]
    return len(leased), {i for p in nested for i in _hot_indexes(p["Plan"])}


# By key, and, for the ordering rule (migration 0021), through one asset's open queue.
BY_KEY = {"delivery_state_pkey", "delivery_state_queue", "delivery_timer_pkey"}


def _hot_indexes(plan: dict) -> set[str]:
    """How a plan reads the state rows and their timers."""
    return {i for table in HOT_TABLES for i in _delivery_indexes(plan, table)}


def _enqueued(conn: psycopg.Connection) -> list[dict]:
    return conn.execute(
        "SELECT delivery_id, current_message_id FROM delivery_state WHERE state = 'enqueued' "
        "LIMIT 4"
    ).fetchall()


def test_the_lease_looks_deliveries_up_by_key_whatever_the_statistics_say(stale):
    assert _lease_indexes(stale, _enqueued(stale)) == (4, BY_KEY)


def test_a_takeover_looks_deliveries_up_by_key_whatever_the_statistics_say(stale):
    """A re-offered message whose lease expired: the lease ends it first (migration 0005)."""
    leased = stale.execute(
        "SELECT delivery_id, current_message_id FROM delivery_state WHERE state = 'leased' "
        "ORDER BY delivery_id LIMIT 4"
    ).fetchall()
    with _explaining(stale) as plans:
        stale.execute(
            "UPDATE webhook_delivery_all SET lease_until = now() - interval '1 second' "
            "WHERE delivery_id = ANY (%s)",
            ([r["delivery_id"] for r in leased],),
        )
        rows = stale.execute(query("lease_with_permits"), _step("run-2", leased)).fetchall()
    taken = [r for r in rows if r["delivery_id"] is not None]
    ending = [p for p in plans if "WITH ending AS" in p.get("Query Text", "")]
    assert len(taken) == 4 and ending
    assert {i for p in ending for i in _hot_indexes(p["Plan"])} == {
        "delivery_state_pkey",
        "delivery_timer_pkey",
    }
    # Before the ending, the hand-back of held offers (migration 0021) ran, by key as well.
    handed = [p for p in plans if "media_hooks_parking_v2(true" in p.get("Query Text", "")]
    assert handed and {i for p in handed for i in _hot_indexes(p["Plan"])} <= BY_KEY


def test_a_lease_plan_made_while_the_table_was_empty_stays_a_key_lookup(server_url, template_name):
    """The lease is planned once per session. Made while the table was empty, when a scan looks
    cheapest, the plan must still look deliveries up by key once the table is large."""
    name = create_database(server_url, template=template_name)
    try:
        with psycopg.connect(
            with_database(server_url, name), autocommit=True, row_factory=dict_row
        ) as conn:
            for table in HOT_TABLES:
                conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
            add_destination(conn, "cdn")
            offered = [{"delivery_id": "none", "current_message_id": "none:1"}]
            assert _lease_indexes(conn, offered)[0] == 0  # the session's plan is made here
            add_deliveries(conn, "cdn", 20_000)
            claim_all(conn, "run-1", Cohort(), page_size=5000)
            assert _lease_indexes(conn, _enqueued(conn)) == (4, BY_KEY)
    finally:
        drop_database(server_url, name)


def _check_parameters() -> dict:
    return {
        "since": "2000-01-01T00:00:00Z",
        "lease_margin_seconds": 600.0,
        "hold_seconds": 90.0,
        "clock_slack_seconds": 5.0,
        "succeeded": True,
    }


CHECK_STATEMENTS = sorted(
    n
    for n in queries()
    if n.startswith("check_") and n not in ("check_clock", "check_through_indexes")
)
# The live backlog, which one check reads whole to hold every open delivery to its timer: the
# others reach this layout's open deliveries through their timers.
READ_WHOLE = {"check_open_without_its_timer": {"delivery_state", "delivery_timer"}}


@pytest.mark.parametrize("name", CHECK_STATEMENTS)
def test_the_default_check_reads_through_indexes(loaded, name):
    """`media-hooks check` without --all: every statement reads the big tables through an
    index, with the settings the check runs under (media_hooks.observe.checks.run), but the
    live backlog where a check must see every row of it."""
    with loaded.transaction(force_rollback=True):
        loaded.execute(query("check_through_indexes"))
        statement = f"EXPLAIN (FORMAT JSON) {query(name)}"
        (plan,) = loaded.execute(statement.encode(), _check_parameters()).fetchone()["QUERY PLAN"]
    print(f"\n{name}:\n{json.dumps(plan['Plan'], indent=1)[:4000]}")
    assert seq_scans(loaded, plan["Plan"], BIG_TABLES - READ_WHOLE.get(name, set())) == []


@pytest.mark.parametrize(
    ("name", "params"),
    [("tombstone_exists", {"delivery_id": "d-cdn-1"}), ("emit_staging_insert", {})],
)
def test_a_tombstone_is_looked_up_by_the_identity_key(loaded, name, params):
    """Beside a duplicate window of tombstones (many more than a bulk emit stages), the bulk
    emit and `tombstone_exists` look each id up by delivery_identity's primary key, the only
    index on it by delivery_id since migration 0028: never a read of every identity."""
    with loaded.transaction(force_rollback=True):
        loaded.execute(
            """
            INSERT INTO delivery_identity (delivery_id, destination_id, created_at,
                                           final_state, purged_at)
            SELECT 'purged-' || g, 'cdn', now() - make_interval(secs => g), 'succeeded', now()
            FROM generate_series(1, 200000) AS g
            """
        )
        loaded.execute(query("emit_staging_create"))
        loaded.execute(
            """
            INSERT INTO media_hooks_emit_staging_v3 (ordinal, delivery_id, destination_id,
                asset_id, event_type, payload, body_head, body_tail)
            SELECT g, 'purged-' || (g * 7), 'cdn', 'asset-' || g, 'rights.updated', '{}',
                   '\\x7b', '\\x7d'
            FROM generate_series(1, 1000) AS g
            """
        )
        loaded.execute("ANALYZE delivery_identity")
        loaded.execute("ANALYZE media_hooks_emit_staging_v3")
        statement = f"EXPLAIN (FORMAT JSON) {query(name)}"
        (plan,) = loaded.execute(statement.encode(), params).fetchone()["QUERY PLAN"]
        loaded.execute(query("emit_staging_clear"))
    print(f"\n{name}:\n{json.dumps(plan['Plan'], indent=1)[:6000]}")
    assert _delivery_indexes(plan["Plan"], "delivery_identity") == {"delivery_identity_pkey"}


def _sorts_of_deliveries(plan: dict) -> list[str]:
    """Sort nodes above a read of the timers: a claim that sorts reads every due row of its
    destination before it returns the first."""
    found = []
    if plan.get("Node Type") in ("Sort", "Incremental Sort") and _delivery_indexes(
        plan, "delivery_timer"
    ):
        found.append(plan["Node Type"])
    for child in plan.get("Plans", []):
        found.extend(_sorts_of_deliveries(child))
    return found


def _planned_by_index(conn: psycopg.Connection, name: str, params: dict) -> dict:
    """The plan of ``name`` as the reconciler runs it: after plan_by_index, in its transaction."""
    with conn.transaction(force_rollback=True):
        conn.execute(query("plan_by_index"))
        statement = f"EXPLAIN (FORMAT JSON) {query(name)}"
        (plan,) = conn.execute(statement.encode(), params).fetchone()["QUERY PLAN"]
    return plan


@pytest.fixture(scope="module")
def unanalyzed(server_url, template_name):
    """A freshly loaded backlog that ANALYZE has never seen (autovacuum off): the statistics
    a bulk load leaves until autovacuum comes round, if it ever does (issue 13)."""
    name = create_database(server_url, template=template_name)
    with psycopg.connect(
        with_database(server_url, name), autocommit=True, row_factory=dict_row
    ) as conn:
        # The tables a claim reads and writes: the state rows, their timers, the outbox's and
        # the bodies' partitions (a partitioned table's own statistics are only ANALYZE's).
        for row in conn.execute(
            "SELECT unnest(%s::text[]) AS t UNION ALL SELECT inhrelid::regclass::text "
            "FROM pg_inherits WHERE inhparent IN ('dispatch_outbox_v3'::regclass, "
            "'delivery_body'::regclass)",
            (list(HOT_TABLES),),
        ).fetchall():
            conn.execute(f"ALTER TABLE {row['t']} SET (autovacuum_enabled = false)")
        for n in range(5):
            add_destination(conn, f"pub-{n}")
            add_deliveries(conn, f"pub-{n}", 20_000 if n == 0 else 2_000)
        # An ordered destination's backlog as the bulk emit records it (its held rows parked).
        add_destination(conn, "pub-ordered", ordering="asset")
        emit_many(
            conn,
            (Event("pub-ordered", f"a-{g % 2000}", "t", {"n": g}) for g in range(8_000)),
        )
        yield conn
    drop_database(server_url, name)


@pytest.mark.parametrize("destination", ["pub-0", "pub-4", "pub-ordered"])
def test_a_destination_claims_by_its_index_whatever_the_statistics_say(unanalyzed, destination):
    """Each destination's claim reads its own due rows in index order: no sequential scan, no
    sort, no other destination's rows, with or without statistics."""
    params = {"run_id": "r", "destination_id": destination, "page_size": 250, **Cohort().params()}
    plan = _planned_by_index(unanalyzed, "claim_destination_page", params)
    assert _seq_scans(unanalyzed, plan["Plan"]) == []
    assert _sorts_of_deliveries(plan["Plan"]) == []
    assert "delivery_timer_due" in _hot_indexes(plan["Plan"]) <= BY_KEY | {"delivery_timer_due"}


def test_due_destinations_probe_the_index_whatever_the_statistics_say(unanalyzed):
    plan = _planned_by_index(unanalyzed, "due_destinations", Cohort().params())
    assert _seq_scans(unanalyzed, plan["Plan"]) == []
    assert _hot_indexes(plan["Plan"]) == {"delivery_timer_due", "delivery_state_pkey"}


def test_a_runs_claims_read_the_due_index_in_order_whatever_the_statistics_say(unanalyzed):
    """A run's claims, page after page: each page reads the destination's due index in order
    and stops at its page (without statistics the planner read every due row, then sorted)."""
    with _explaining(unanalyzed) as plans:
        claimed = claim_all(unanalyzed, "r", Cohort(), page_size=250, max_rows=500)
    pages = [p for p in plans if "INSERT INTO dispatch_outbox" in p.get("Query Text", "")]
    assert (claimed.claimed, len(pages)) == (500, 2)
    for page in pages:
        assert _seq_scans(unanalyzed, page["Plan"]) == []
        assert _sorts_of_deliveries(page["Plan"]) == []
        assert "delivery_timer_due" in _delivery_indexes(page["Plan"], "delivery_timer")


def test_a_claim_the_driver_prepared_is_still_planned_for_its_parameters(database_url):
    """psycopg prepares a statement run five times, and the server may then plan it once for
    any parameters (after five plans of its own): for the claim, a plan that cannot see the
    destination or the page size (it read a 100,000-row backlog for 7.4 s a page of 1,000).
    plan_by_index keeps every plan of the claim made for its parameters."""
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as conn:
        add_destination(conn, "pub")
        add_deliveries(conn, "pub", 60)
        pages = [len(claim_destination_page(conn, "r", "pub", Cohort(), 4)) for _ in range(15)]
        assert pages == [4] * 15
        plans = conn.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE '%%INSERT INTO dispatch_outbox_v3%%'"
        ).fetchone()
    assert plans is not None, "the driver never prepared the claim"
    assert (plans["generic_plans"], plans["custom_plans"] > 0) == (0, True), plans


@pytest.fixture(scope="module")
def ordered(server_url, template_name):
    """A destination ordering by asset with a backlog recorded by the bulk emit: 5,000 assets,
    4 revisions each, the later three born parked (migration 0013); beside it the previous
    release's deliveries of the destination, in its layout (an asset's queue holds both while
    the releases overlap)."""
    name = create_database(server_url, template=template_name)
    with psycopg.connect(
        with_database(server_url, name), autocommit=True, row_factory=dict_row
    ) as conn:
        add_destination(conn, "pub", ordering="asset")
        for state, count in [("succeeded", 10_000), ("pending", 2_000)]:
            add_deliveries(
                conn, "pub", count, state=state, prefix=f"previous-{state}", previous_release=True
            )
        emit_many(
            conn,
            (Event("pub", f"asset-{g % 5000}", "rights.updated", {"n": g}) for g in range(20_000)),
        )
        conn.execute("VACUUM ANALYZE")
        yield conn
    drop_database(server_url, name)


_EMITTED = {
    "asset_id": "asset-1",
    "event_type": "rights.updated",
    "payload": "{}",
    "body_head": b"{",
    "body_tail": b"}",
}
ORDERED_STATEMENTS = {
    "claim_destination_page": lambda: {
        "run_id": "r",
        "destination_id": "pub",
        "page_size": 250,
        **Cohort().params(),
    },
    "sweep_wake_parked_heads": lambda: {
        "after_destination": "",
        "after_asset": "",
        "limit_rows": 1000,
    },
    "emit_one": lambda: {**_EMITTED, "destination_id": "pub", "delivery_id": "new-1"},
    "emit_event_one": lambda: {**_EMITTED, "event_id": "ev-1"},
    "emit_staging_insert": dict,
    "destination_park_held": lambda: {"destination_id": "pub"},
}


@pytest.mark.parametrize("name", sorted(ORDERED_STATEMENTS))
def test_ordered_statements_use_indexes(ordered, name):
    """The statements that claim, record and wake the deliveries of an ordered destination read
    its asset queues by index, in both layouts (delivery_state_queue, webhook_delivery_queue;
    the previous layout's parked deliveries, webhook_delivery_parked). The claim is planned as
    the reconciler runs it, after plan_by_index (media_hooks.outbox.claims)."""
    with ordered.transaction(force_rollback=True):
        ordered.execute(query("emit_staging_create"))
        if name == "claim_destination_page":
            ordered.execute(query("plan_by_index"))
        statement = f"EXPLAIN (FORMAT JSON) {query(name)}"
        (plan,) = ordered.execute(statement.encode(), ORDERED_STATEMENTS[name]()).fetchone()[
            "QUERY PLAN"
        ]
    print(f"\n{name}:\n{json.dumps(plan['Plan'], indent=1)[:6000]}")
    assert _seq_scans(ordered, plan["Plan"]) == []
    assert {"delivery_state_queue", "webhook_delivery_queue"} <= _every_index(plan["Plan"])
    if name == "sweep_wake_parked_heads":
        assert "webhook_delivery_parked" in _every_index(plan["Plan"])


def _every_index(plan: dict) -> set[str]:
    """Every index a plan reads, its subplans' included."""
    found = {plan["Index Name"]} if "Index Name" in plan else set()
    for child in plan.get("Plans", []):
        found |= _every_index(child)
    return found


def test_the_circuit_breaker_reads_the_failing_destinations_attempts_not_the_whole_stretch(
    server_url, template_name
):
    """Every delivery run starts with the breaker. Beside a day of attempts of tens of healthy
    destinations (21,000 here; a busy platform's are millions), it reads a few of each one's
    to see a success, and only the failing destination's attempts to count them. Half the
    healthy destinations' attempts are the previous release's, in its layout."""
    healthy = [f"healthy-{n}" for n in range(30)]
    name = create_database(server_url, template=template_name)
    try:
        with psycopg.connect(
            with_database(server_url, name), autocommit=True, row_factory=dict_row
        ) as conn:
            for n, destination in enumerate(healthy):
                add_destination(conn, destination)
                add_deliveries(conn, destination, 700, previous_release=n % 2 == 1)
            add_destination(conn, "flaky")
            add_deliveries(conn, "flaky", 1)
            conn.execute(
                """
                INSERT INTO delivery_attempt_v2 (delivery_id, attempt_no, destination_id,
                    lease_token, delivery_created_at, started_at, finished_at, outcome, error)
                SELECT d.delivery_id, 1, d.destination_id, gen_random_uuid(), d.created_at, t.at,
                       t.at, 'success', NULL
                FROM delivery_state AS d
                CROSS JOIN LATERAL (SELECT now() - make_interval(  -- one every 2 min, 28 h
                    secs => 144 * split_part(d.delivery_id, '-', 4)::integer) AS at) AS t
                WHERE d.destination_id <> 'flaky';
                INSERT INTO delivery_attempt_v1 (delivery_id, attempt_no, destination_id,
                    lease_token, started_at, finished_at, outcome, error)
                SELECT d.delivery_id, 1, d.destination_id, gen_random_uuid(), t.at, t.at,
                       'success', NULL
                FROM webhook_delivery_v1 AS d
                CROSS JOIN LATERAL (SELECT now() - make_interval(
                    secs => 144 * split_part(d.delivery_id, '-', 4)::integer) AS at) AS t;
                INSERT INTO delivery_attempt_v2 (delivery_id, attempt_no, destination_id,
                    lease_token, delivery_created_at, started_at, finished_at, outcome, error)
                SELECT 'd-flaky-1', g, 'flaky', gen_random_uuid(), d.created_at,
                       now() - make_interval(hours => 30) + make_interval(mins => g * 50),
                       now(), 'retryable', 'HTTP 500'
                FROM delivery_state AS d, generate_series(1, 30) AS g
                WHERE d.delivery_id = 'd-flaky-1';
                """
            )
            conn.execute("VACUUM ANALYZE delivery_attempt_v1, delivery_attempt_v2")
            with conn.transaction(force_rollback=True):
                params = {"stretch_seconds": 86400.0, "min_attempts": 20}
                plan = analyzed(conn, "trip_circuit_breakers", params)
                tripped = conn.execute(
                    "SELECT destination_id FROM webhook_destination WHERE NOT enabled"
                ).fetchall()
    finally:
        drop_database(server_url, name)
    print(json.dumps(plan, indent=1)[:6000])
    assert tripped == [{"destination_id": "flaky"}]
    # A few rows a destination, the failing one's 30: not the stretch's 18,000.
    assert rows_read(plan, "delivery_attempt_v1") + rows_read(plan, "delivery_attempt_v2") < 500
