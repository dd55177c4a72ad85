"""`media-hooks check` as a process: exit 0 when every invariant holds, 1 with the broken one
named and its id, and the --json document's shape."""

from __future__ import annotations

import json

from media_hooks.observe import checks
from media_hooks_tests.conftest import run_cli
from media_hooks_tests.factories import add_deliveries, add_destination


def test_check_holds_then_fails_with_the_id(conn, cli_env):
    add_destination(conn, "pub")
    add_deliveries(conn, "pub", 3, state="leased")
    # Leased by hand, and their timers lost: no sweep would find them again.
    conn.execute("DELETE FROM delivery_timer")
    clean = run_cli("check", env={**cli_env, "MEDIA_HOOKS_LEASE_SECONDS": "90"})
    assert clean.returncode == 1, clean.stderr
    broken = [line.split(maxsplit=1) for line in clean.stdout.splitlines() if "broken:" in line]
    assert broken == [
        ["open_without_its_timer", "3 broken: leased-pub-1, leased-pub-2, leased-pub-3"]
    ]
    assert clean.stdout.rstrip().endswith("1 invariant(s) broken")
    conn.execute(
        "UPDATE webhook_delivery_all SET state = 'dead', lease_token = NULL, lease_until = NULL"
    )
    fixed = run_cli("check", env=cli_env)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert fixed.stdout.rstrip().endswith("every invariant holds")
    rows = [line.split() for line in fixed.stdout.splitlines()[2:-1]]
    assert [row[1:] for row in rows] == [["holds"]] * (len(checks.CHECKS) + 1)


def test_check_json_shape(conn, cli_env):
    add_destination(conn, "pub")
    add_deliveries(conn, "pub", 2, state="enqueued")
    result = run_cli("check", "--json", "--all", env=cli_env)
    assert result.returncode == 1, result.stderr
    document = json.loads(result.stdout)
    assert set(document) == {"holds", "checked_at", "since", "checks"}
    assert document["holds"] is False and document["since"] is None
    by_name = {c["name"]: c for c in document["checks"]}
    assert set(by_name) == {c.name for c in checks.CHECKS} | {"counts_by_state"}
    assert by_name["enqueued_without_outbox"] == {
        "name": "enqueued_without_outbox",
        "invariant": by_name["enqueued_without_outbox"]["invariant"],
        "holds": False,
        "violations": 2,
        "examples": ["enqueued-pub-1", "enqueued-pub-2"],
    }
    assert all(
        c["holds"] and c["examples"] == []
        for n, c in by_name.items()
        if n != "enqueued_without_outbox"
    )
