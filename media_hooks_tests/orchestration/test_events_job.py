"""Issue 14 through a Dagster run: an event fanned out to subscribed destinations, one ordered,
one coalescing, delivered by ``deliver_webhooks`` runs in order and latest-wins."""

from __future__ import annotations

import json

from media_hooks.outbox.emit import FanOutEvent, emit_event
from media_hooks_tests.factories import add_destination
from media_hooks_tests.orchestration.conftest import deliver


def _revisions(receiver, path: str) -> list[int]:
    return [
        json.loads(r.body)["data"]["revision"]
        for r in sorted(receiver.requests, key=lambda r: r.arrived_monotonic)
        if r.path.endswith(path)
    ]


def test_runs_deliver_fanned_out_revisions_in_order_and_latest_wins(
    instance, database_url, conn, receiver
):
    add_destination(conn, "ordered", receiver.url + "ordered", ordering="asset")
    add_destination(conn, "latest", receiver.url + "latest", coalescing="asset")
    conn.execute(
        "INSERT INTO destination_subscription (destination_id, pattern) "
        "VALUES ('ordered', 'rights.*'), ('latest', 'rights.updated')"
    )
    for revision in (1, 2, 3):
        result = emit_event(
            conn,
            FanOutEvent(f"rights-a1-{revision}", "a1", "rights.updated", {"revision": revision}),
        )
        assert result.destination_ids == ("latest", "ordered")

    runs = [deliver(instance, database_url) for _ in range(3)]
    assert all(run.success for run in runs)
    claimed = [run.summary.claimed for run in runs]
    assert claimed == [2, 1, 1], "one ordered revision per run, the coalesced one at once"
    assert _revisions(receiver, "ordered") == [1, 2, 3]
    assert _revisions(receiver, "latest") == [3]
