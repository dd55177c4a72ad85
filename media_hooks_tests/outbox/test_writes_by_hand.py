"""An operator's write by hand through the contract's view, while the engine moves the same row.

``webhook_delivery_all`` (and ``webhook_delivery`` after the contract migration) is a view whose
trigger writes the delivery where its layout keeps it. A table's update waits for a row another
session holds, then reads it again; a view's trigger only has the row as its statement read it.
Written as read, a move committed meanwhile would be undone: the claim's dispatch count (so the
same message id claimed twice), a lease, an ending. The trigger locks the row where it is and
compares: a row that moved fails the statement as a serialization conflict, with nothing
written, and the engine's move stands.
"""

from __future__ import annotations

import psycopg
import pytest

from media_hooks.observe import checks
from media_hooks.outbox.claims import claim_destination_page
from media_hooks.outbox.cohort import Cohort
from media_hooks.outbox.leases import record_classified
from media_hooks_tests.factories import (
    ROOMY,
    add_deliveries,
    add_destination,
    answer,
    claim_messages,
    delivery,
    lease_all,
)
from media_hooks_tests.interleaving import in_background, open_session, wait_until_blocked

BY_HAND = (
    "UPDATE webhook_delivery_all SET next_attempt_at = now() - interval '1 minute' "
    "WHERE delivery_id = %s"
)


def _by_hand_while(conn: psycopg.Connection, database_url: str, delivery_id: str, move) -> None:
    """The update by hand reads the row, then waits for the engine's ``move`` (run in a
    session of its own, its transaction open) to commit; it must fail, having written nothing."""
    engine = open_session(database_url, autocommit=True)
    operator = open_session(database_url, autocommit=True)
    try:
        engine.execute("BEGIN")
        move(engine)

        def by_hand() -> None:
            with pytest.raises(psycopg.errors.SerializationFailure, match="changed after"):
                operator.execute(BY_HAND, (delivery_id,))

        with in_background(by_hand) as refused:
            wait_until_blocked(conn, operator.info.backend_pid, refused)
            engine.execute("COMMIT")
    finally:
        engine.close()
        operator.close()


def _holds(conn: psycopg.Connection) -> None:
    report = checks.run(conn)
    assert report.holds, report.failed


def test_a_claim_committed_while_an_update_by_hand_waits_is_not_undone(conn, database_url):
    add_destination(conn, "pub", **ROOMY)
    [delivery_id] = add_deliveries(conn, "pub", 1)

    def claim(engine: psycopg.Connection) -> None:
        [message] = claim_destination_page(engine, "run-1", "pub", Cohort(), 10)
        assert message.message_id == f"{delivery_id}:1"

    _by_hand_while(conn, database_url, delivery_id, claim)

    row = delivery(conn, delivery_id)
    assert (row["state"], row["dispatch_count"]) == ("enqueued", 1)
    _holds(conn)
    # Still one dispatch per message: a requeue makes it due, and the next claim numbers it 2.
    conn.execute(
        "UPDATE webhook_delivery_all SET state = 'pending' WHERE delivery_id = %s", (delivery_id,)
    )
    [again] = claim_destination_page(conn, "run-2", "pub", Cohort(), 10)
    assert again.message_id == f"{delivery_id}:2"


def test_a_delivery_that_ended_while_an_update_by_hand_waits_stays_ended(conn, database_url):
    add_destination(conn, "pub", **ROOMY)
    [delivery_id] = add_deliveries(conn, "pub", 1)
    [lease] = lease_all(conn, "run-1", claim_messages(conn, "run-1"))

    def succeed(engine: psycopg.Connection) -> None:
        record_classified(engine, [answer(lease, "success", 200)])

    _by_hand_while(conn, database_url, delivery_id, succeed)

    row = delivery(conn, delivery_id)
    assert row["state"] == "succeeded"
    _holds(conn)
