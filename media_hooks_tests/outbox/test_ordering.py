"""Per-asset order (issue 14, part 2; docs/architecture.md invariant 10): on a destination with
``--ordering asset`` no delivery is sent while an earlier one of its asset is not terminal;
other assets keep flowing; a dead head holds its successors until it is requeued or
discarded."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from media_hooks.core import crashpoints
from media_hooks.devtools.receiver import Receiver, Reply
from media_hooks.engine.delivery_run import deliver_due
from media_hooks.observe import checks, figures
from media_hooks.observe.inspection import inspect_delivery
from media_hooks.outbox.claims import claim_destination_page
from media_hooks.outbox.cohort import Cohort
from media_hooks.outbox.destinations import DestinationSpec, upsert_destination
from media_hooks.outbox.emit import Event, emit
from media_hooks.outbox.leases import (
    Classified,
    lease_with_permits,
    record_classified,
)
from media_hooks.outbox.maintenance import sweeps
from media_hooks.outbox.maintenance.discard import discard
from media_hooks.outbox.maintenance.requeue import requeue
from media_hooks_tests.conftest import REPO
from media_hooks_tests.factories import add_destination, claim_all, states
from media_hooks_tests.interleaving import in_background, open_session, wait_until_blocked
from media_hooks_tests.queues import claimed, revisions_received, settle


def _emit_revisions(conn, destination_id: str, assets: dict[str, int]) -> dict[tuple, str]:
    """Revisions 1..n of each asset, emitted in order; (asset, revision) -> delivery_id."""
    ids = {}
    for revision in range(1, max(assets.values()) + 1):
        for asset, count in assets.items():
            if revision <= count:
                event = Event(destination_id, asset, "rights.updated", {"revision": revision})
                ids[(asset, revision)] = emit(conn, event).delivery_id
    return ids


def test_an_ordered_destination_claims_only_the_head_of_each_assets_queue(conn):
    add_destination(conn, "ordered", ordering="asset")
    add_destination(conn, "plain")
    ordered = _emit_revisions(conn, "ordered", {"a1": 3, "a2": 1})
    plain = _emit_revisions(conn, "plain", {"a1": 3})

    first = claimed(conn, "run-1")
    assert first == {ordered[("a1", 1)], ordered[("a2", 1)], *plain.values()}
    assert claimed(conn, "run-2") == set(), "a1's revision 2 waits while revision 1 is enqueued"

    settle(conn, ordered[("a1", 1)], "succeeded")
    assert claimed(conn, "run-3") == {ordered[("a1", 2)]}


def test_two_reconcilers_at_once_never_claim_past_an_uncommitted_head(conn, database_url):
    """Interleaving: run A has claimed a1's head and not committed; run B, meanwhile, skips the
    locked head and must not take revision 2 (it still sees revision 1 pending: open)."""
    add_destination(conn, "ordered", ordering="asset")
    ids = _emit_revisions(conn, "ordered", {"a1": 2})
    with open_session(database_url) as a, open_session(database_url) as b:
        claim_all(a, "run-a", Cohort())  # inside A's open transaction (no commit)
        b_claimed = claimed(b, "run-b")
        b.commit()
        assert b_claimed == set()
        a.commit()
    assert claimed(conn, "run-c") == set()
    owners = conn.execute("SELECT delivery_id, run_id FROM dispatch_outbox").fetchall()
    assert [(r["delivery_id"], r["run_id"]) for r in owners] == [(ids[("a1", 1)], "run-a")]


def test_a_dead_head_holds_its_asset_until_discarded_and_is_said(conn):
    add_destination(conn, "ordered", ordering="asset")
    ids = _emit_revisions(conn, "ordered", {"a1": 3, "a2": 1})
    head, second = ids[("a1", 1)], ids[("a1", 2)]
    settle(conn, head, "dead")

    assert claimed(conn, "run-1") == {ids[("a2", 1)]}, "other assets flow"
    verdict = inspect_delivery(conn, second).verdict
    assert (verdict.kind, f"held behind dead delivery {head}" in verdict.text) == ("held", True)
    (dead_head,) = figures.measure(conn).dead_heads
    assert (dead_head.delivery_id, dead_head.holding) == (head, 2)

    result = discard(conn, [head, second], reason="revision 1 obsolete", requested_by="op")
    assert result.discarded == (head,) and result.refused == {second: "pending"}
    discarded = inspect_delivery(conn, head).verdict
    assert discarded.kind == "discarded"
    assert discarded.text.startswith("discarded by op: revision 1 obsolete")
    measured = figures.measure(conn)
    assert (measured.dead_letters, measured.totals["discarded"], measured.dead_heads) == (0, 1, ())
    assert claimed(conn, "run-2") == {second}
    moved = requeue(conn, Cohort(), states=("dead",), reason="again", requested_by="op")
    assert moved.matched == 0, "a discarded delivery stays closed"


def test_a_requeued_dead_head_goes_first(conn):
    add_destination(conn, "ordered", ordering="asset")
    ids = _emit_revisions(conn, "ordered", {"a1": 2})
    settle(conn, ids[("a1", 1)], "dead")
    requeue(conn, Cohort(), states=("dead",), reason="receiver fixed", requested_by="op")
    assert claimed(conn, "run-1") == {ids[("a1", 1)]}


def _make_due(conn) -> None:
    conn.execute("UPDATE webhook_delivery_all SET next_attempt_at = now() WHERE state = 'pending'")
    conn.execute("UPDATE webhook_destination SET paused_until = NULL")


def _flaky(info) -> Reply:
    """Every delivery's first request fails (503), its second is rate limited (429), then 200."""
    if info.seen_before == 0:
        return Reply(status=503)
    if info.seen_before == 1:
        return Reply(status=429, headers={"Retry-After": "1"})
    return Reply()


def test_retries_a_429_and_two_runs_at_once_never_deliver_an_asset_out_of_order(
    conn, pool, settings
):
    assets = {f"asset-{n}": 4 for n in range(3)}
    with Receiver(script=_flaky) as receiver:
        add_destination(
            conn, "ordered", url=receiver.url, ordering="asset", rate_per_second=1000,
            burst=100, max_in_flight=8,
        )  # fmt: skip
        _emit_revisions(conn, "ordered", assets)
        for round_no in range(40):
            if states(conn) == {"succeeded": 12}:
                break
            _make_due(conn)
            runs = [
                threading.Thread(target=deliver_due, args=(pool, f"run-{round_no}-{n}", settings))
                for n in range(2)
            ]
            for run in runs:
                run.start()
            for run in runs:
                run.join(timeout=60)
        assert states(conn) == {"succeeded": 12}
        seen = revisions_received(receiver)
    for asset, revisions in seen.items():
        assert revisions == sorted(revisions), f"{asset} received out of order: {revisions}"
        assert sorted(set(revisions)) == [1, 2, 3, 4]
        assert revisions.count(1) == 3, "each revision was retried (503, 429) before the next"


RUN = """
import sys
from media_hooks.store import db
from media_hooks.core.config import Settings
from media_hooks.engine.delivery_run import deliver_due
from media_hooks.outbox.destinations import DestinationSpec, upsert_destination
with db.open_pool(sys.argv[1]) as pool:
    deliver_due(pool, sys.argv[2], Settings.from_env())
"""


def _run(database_url: str, run_id: str, crash_at: str | None = None) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEDIA_HOOKS_")}
    env.update(MEDIA_HOOKS_ALLOW_PRIVATE_URLS="1", MEDIA_HOOKS_LEASE_SECONDS="1")
    if crash_at:
        env["MEDIA_HOOKS_CRASH_AT"] = crash_at
    done = subprocess.run(
        [sys.executable, "-c", RUN, database_url, run_id],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return done.returncode


def test_a_run_killed_after_the_receiver_accepted_never_lets_the_next_revision_overtake(
    conn, database_url
):
    with Receiver() as receiver:
        add_destination(
            conn, "ordered", url=receiver.url, ordering="asset", max_in_flight=1,
            timeout_seconds=0.2,
        )  # fmt: skip
        ids = _emit_revisions(conn, "ordered", {"a1": 3})
        crashed = _run(database_url, "run-killed", crashpoints.AFTER_RECEIVER_ACCEPTED)
        assert crashed == crashpoints.CRASH_EXIT_STATUS
        assert revisions_received(receiver) == {"a1": [1]}
        assert claimed(conn, "run-probe") == set(), "revision 2 waits behind the lost lease"
        for n in range(10):
            if states(conn) == {"succeeded": 3}:
                break
            conn.execute(
                "UPDATE webhook_delivery_all SET lease_until = now() - interval '1 second' "
                "WHERE state = 'leased'"
            )
            _make_due(conn)
            assert _run(database_url, f"run-after-{n}") == 0
        assert states(conn) == {"succeeded": 3}
        seen = revisions_received(receiver)["a1"]
    assert seen == sorted(seen) and sorted(set(seen)) == [1, 2, 3], seen
    assert len(ids) == 3


@pytest.mark.parametrize("ordering", ["none", "asset"])
def test_the_claim_rule_is_true_at_once_for_plain_destinations(conn, ordering):
    add_destination(conn, "d", ordering=ordering)
    row = conn.execute(
        "SELECT NOT EXISTS (SELECT FROM media_hooks_held_by_v2(%s, 'none', 'd', 'a', 't', "
        "now(), 1, 'x')) AS ok",
        (ordering,),
    ).fetchone()
    assert row["ok"] is True


def _due(conn, delivery_id: str) -> bool:
    row = conn.execute(
        "SELECT next_attempt_at <= now() AS due FROM webhook_delivery_all WHERE delivery_id = %s",
        (delivery_id,),
    ).fetchone()
    return row["due"]


def _version(conn, delivery_id: str) -> str:
    """The row version (its place in the heap and the transaction that wrote it)."""
    row = conn.execute(
        "SELECT ctid::text || '/' || xmin::text AS v FROM delivery_state WHERE delivery_id = %s",
        (delivery_id,),
    ).fetchone()
    return row["v"]


def test_held_deliveries_are_born_parked_and_released_in_order_when_the_head_settles(
    conn, settings
):
    add_destination(conn, "ordered", ordering="asset")
    ids = _emit_revisions(conn, "ordered", {"a1": 3})
    assert [_due(conn, ids[("a1", n)]) for n in (1, 2, 3)] == [True, False, False]
    assert inspect_delivery(conn, ids[("a1", 3)]).verdict.kind == "held"
    versions = [_version(conn, ids[("a1", n)]) for n in (2, 3)]
    assert sweeps.run_sweeps(conn, settings).woken_heads == 0
    assert [_version(conn, ids[("a1", n)]) for n in (2, 3)] == versions, "nothing rewritten"

    settle(conn, ids[("a1", 1)], "succeeded")
    assert [_due(conn, ids[("a1", n)]) for n in (2, 3)] == [True, False]
    discard_head = ids[("a1", 2)]
    settle(conn, discard_head, "dead")
    assert not _due(conn, ids[("a1", 3)]), "a dead head holds"
    assert sweeps.sweep_wake_parked_heads(conn) == 0, "the sweep leaves it held"
    discard(conn, [discard_head], reason="obsolete", requested_by="op")
    assert _due(conn, ids[("a1", 3)])


def test_turning_ordering_off_releases_parked_deliveries(conn, settings):
    add_destination(conn, "ordered", ordering="asset")
    ids = _emit_revisions(conn, "ordered", {"a1": 2})
    assert not _due(conn, ids[("a1", 2)])
    spec = DestinationSpec("ordered", "http://127.0.0.1:9/", ordering="none")
    upsert_destination(conn, spec, settings)
    assert _due(conn, ids[("a1", 2)])


def _slots_held(conn, destination_id: str) -> int:
    row = conn.execute(
        "SELECT count(*) AS n FROM destination_limiter AS l, unnest(l.slot_until) AS until "
        "WHERE l.destination_id = %s AND until > now()",
        (destination_id,),
    ).fetchone()
    return row["n"]


def test_ordering_turned_on_with_a_later_delivery_in_flight(conn, database_url, settings):
    """The model's sequence, shrunk (migration 0021): a worker claims revisions 1 and 2 of an
    asset on a destination that does not order, revision 1's attempt ends retryable (pending
    again), the operator turns ordering on, and the worker offers revision 2 to the lease: it
    is handed back parked behind revision 1, its permit returned, instead of sent before 1."""
    add_destination(conn, "pub")
    r1 = emit(conn, Event("pub", "a1", "media.ready", {"revision": 1})).delivery_id
    r2 = emit(conn, Event("pub", "a1", "media.ready", {"revision": 2})).delivery_id
    with open_session(database_url, autocommit=True) as worker:
        page = claim_destination_page(worker, "run-1", "pub", Cohort(), 3)
        assert [m.delivery_id for m in page] == [r1, r2]
        first = lease_with_permits(
            worker, "run-1", "pub", page[:1], holder="run-1", lease_seconds=30, release_slots=[]
        )
        retry = Classified(first.leases[0], "retryable", 503, None, "HTTP 503", None, 0.0)
        assert record_classified(worker, [retry]).states == {r1: "pending"}
        upsert_destination(
            conn, DestinationSpec("pub", "http://127.0.0.1:9/", ordering="asset"), settings
        )
        second = lease_with_permits(
            worker, "run-1", "pub", page[1:], holder="run-1", lease_seconds=30, release_slots=[]
        )
    assert second.leases == [], "revision 2 is not sent while revision 1 waits"
    assert second.examined == 1, "the worker is done with the offer"
    assert _slots_held(conn, "pub") == 1, "revision 1's permit only: revision 2's came back"
    assert states(conn) == {"pending": 2}, "handed back, not left enqueued"
    assert not _due(conn, r2) and inspect_delivery(conn, r2).verdict.kind == "held"
    assert checks.run(conn, checks.Options(full=True)).holds
    settle(conn, r1, "succeeded")
    assert _due(conn, r2), "released when revision 1 is done, as a delivery born held"


def test_a_request_sent_before_ordering_began_is_not_counted_out_of_order(
    conn, database_url, settings
):
    """Interleaving: revision 2 is leased (its request on its way) while ordering is off;
    revision 1's attempt ends retryable; the operator turns ordering on; revision 2's outcome
    is recorded after. A request cannot be recalled: the check holds throughout, and a
    dispatch after the switch is held to the order."""
    add_destination(conn, "pub")
    r1 = emit(conn, Event("pub", "a1", "media.ready", {"revision": 1})).delivery_id
    r2 = emit(conn, Event("pub", "a1", "media.ready", {"revision": 2})).delivery_id
    with open_session(database_url, autocommit=True) as worker:
        page = claim_destination_page(worker, "run-1", "pub", Cohort(), 3)
        step = lease_with_permits(
            worker, "run-1", "pub", page, holder="run-1", lease_seconds=30, release_slots=[]
        )
        first, second = step.leases
        retry = Classified(first, "retryable", 503, None, "HTTP 503", None, 0.0)
        assert record_classified(worker, [retry]).states == {r1: "pending"}
        upsert_destination(
            conn, DestinationSpec("pub", "http://127.0.0.1:9/", ordering="asset"), settings
        )
        assert states(conn) == {"pending": 1, "leased": 1}
        assert checks.run(conn, checks.Options(full=True)).holds, "leased before the switch"
        done = Classified(second, "success", 200, None, None, None, 0.0)
        assert record_classified(worker, [done]).states == {r2: "succeeded"}
    assert checks.run(conn, checks.Options(full=True)).holds
    r3 = emit(conn, Event("pub", "a1", "media.ready", {"revision": 3})).delivery_id
    assert not _due(conn, r3), "born held behind revision 1: the order holds from the switch"
    conn.execute(
        "UPDATE webhook_delivery_all SET state = 'leased', lease_token = gen_random_uuid(), "
        "lease_until = now() + interval '1 minute', attempt_count = attempt_count + 1 "
        "WHERE delivery_id = %s",
        (r3,),
    )
    # Its attempt in flight is its lease (delivery_attempt_all).
    broken = [r.name for r in checks.run(conn, checks.Options(full=True)).results if not r.holds]
    assert broken == ["sent_out_of_order"], "an attempt started after the switch is counted"


def test_a_lease_waits_for_ordering_being_turned_on_and_then_applies_it(
    conn, database_url, settings
):
    """Interleaving: the operator's change of ordering has not committed when the worker asks
    to lease revision 2: the lease waits for it (the limiter row), then refuses revision 2,
    instead of leasing it under the old rule after ordering began."""
    add_destination(conn, "pub")
    emit(conn, Event("pub", "a1", "media.ready", {"revision": 1}))
    emit(conn, Event("pub", "a1", "media.ready", {"revision": 2}))
    with open_session(database_url, autocommit=True) as worker:
        page = claim_destination_page(worker, "run-1", "pub", Cohort(), 3)
        with open_session(database_url) as operator:
            spec = DestinationSpec("pub", "http://127.0.0.1:9/", ordering="asset")
            upsert_destination(operator, spec, settings)  # inside its open transaction
            with in_background(
                lambda: lease_with_permits(
                    worker,
                    "run-1",
                    "pub",
                    page[1:],
                    holder="run-1",
                    lease_seconds=30,
                    release_slots=[],
                )
            ) as leasing:
                wait_until_blocked(conn, worker.info.backend_pid)
                operator.commit()
            assert leasing.result().leases == []
    assert states(conn) == {"enqueued": 1, "pending": 1}, "revision 1 claimed, 2 handed back"
    assert checks.run(conn, checks.Options(full=True)).holds
