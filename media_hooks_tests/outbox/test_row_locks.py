"""What a delivery's moves write to the WAL besides the moves: no row lock of their own.

An update locks its row itself; a lock taken before it is logged as a record of its own (about
54 bytes), and migration 0031 took out three that came for nothing: the immutability trigger ran
BEFORE the update (PostgreSQL locks the row before any BEFORE UPDATE row trigger), the attempts'
foreign key locked the delivery again, and the record read its rows FOR UPDATE. The purge writes
the tombstone by an update, not an upsert, which locks first too.

Read with pg_walinspect's block info (PostgreSQL 16 and later; skipped where the server has
none). The claim's lock stays: ``FOR UPDATE SKIP LOCKED`` is how two claims pass each other.
An update whose new version goes to another page logs a lock of its own too, while it looks for
the page: the counts leave those out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
import pytest

from bench import wal
from media_hooks.outbox import leases
from media_hooks.outbox.cohort import Cohort
from media_hooks.store.sqlfiles import query
from media_hooks_tests.factories import (
    ROOMY,
    add_deliveries,
    add_destination,
    answer,
    claim_messages,
    lease_all,
    states,
)

# Each row lock and each update, by relation, that does not move its row to another page.
LOCKS = """
WITH records AS (
    SELECT c.relname, b.record_type, b.start_lsn, count(*) AS blocks
    FROM pg_get_wal_block_info(%(start)s::pg_lsn, %(end)s::pg_lsn, false) AS b
    JOIN pg_class AS c ON c.relfilenode = b.relfilenode
    WHERE b.resource_manager = 'Heap' AND b.record_type IN ('LOCK', 'UPDATE', 'HOT_UPDATE')
    GROUP BY 1, 2, 3
)
SELECT relname,
       count(*) FILTER (WHERE record_type = 'LOCK') AS locks,
       count(*) FILTER (WHERE record_type <> 'LOCK' AND blocks = 2) AS moved_away
FROM records
GROUP BY 1
"""


@pytest.fixture
def walinspect(conn: psycopg.Connection) -> psycopg.Connection:
    if not wal.has_block_info(conn):
        pytest.skip("the server has no pg_get_wal_block_info (PostgreSQL 16 and later)")
    return conn


@contextmanager
def locks_written(conn: psycopg.Connection) -> Iterator[Callable[[str], int]]:
    """The row locks logged on a relation in the block, beyond one for each update of it that
    moved its row to another page (``found(relation)`` once the block has run)."""
    position = "SELECT pg_current_wal_insert_lsn()::text AS lsn"
    start = conn.execute(position).fetchone()["lsn"]
    counts: dict[str, int] = {}
    yield lambda relation: counts.get(relation, 0)
    end = conn.execute(position).fetchone()["lsn"]
    for row in conn.execute(LOCKS, {"start": start, "end": end}):
        counts[row["relname"]] = row["locks"] - row["moved_away"]


def _dispatched(conn: psycopg.Connection, count: int) -> list:
    add_destination(conn, "cdn", **ROOMY)
    add_deliveries(conn, "cdn", count)
    return claim_messages(conn, "run-1", Cohort())


def test_a_lease_and_a_record_lock_no_row_beyond_their_update(walinspect):
    conn = walinspect
    messages = _dispatched(conn, 6)
    with locks_written(conn) as found:
        leased = lease_all(conn, "run-1", messages)
        leases.record_classified(conn, [answer(lease, "success", 200) for lease in leased[:3]])
        leases.record_classified(conn, [answer(lease, "retryable", 500) for lease in leased[3:]])
    assert states(conn) == {"succeeded": 3, "pending": 3}
    assert found("webhook_delivery") == 0
    assert found("delivery_attempt") == 0


def test_the_purge_makes_its_tombstones_without_locking_them_first(walinspect):
    """The previous layout's deliveries, which retention still purges row by row (this
    layout's go a range at a time and write nothing per delivery)."""
    conn = walinspect
    add_destination(conn, "cdn")
    add_deliveries(conn, "cdn", 6, state="succeeded", previous_release=True)
    with locks_written(conn) as found:
        purged = conn.execute(
            query("purge_terminal_batch"), {"cutoff": "infinity", "batch_size": 100}
        ).fetchone()
    assert (purged["deliveries"], purged["tombstones"]) == (6, 6)
    assert found("delivery_identity") == 0
    final = conn.execute(
        "SELECT count(*) AS n FROM delivery_identity WHERE final_state = 'succeeded'"
    ).fetchone()
    assert final["n"] == 6
