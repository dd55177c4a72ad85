"""What `media-hooks dev` prints about the SSRF guard before it starts Dagster: with private
addresses refused, that local destinations will be refused and how to allow one; which
destinations are allowed; and, for a destination the guard disabled, the two commands that send
to it again."""

from __future__ import annotations

import dataclasses

from media_hooks.cli.dev_commands import guard_notes
from media_hooks.engine.delivery_run import deliver_due
from media_hooks_tests.factories import add_deliveries, add_destination


def test_a_guarded_dev_says_how_local_destinations_pass_and_names_the_refused(
    conn, pool, settings, database_url
):
    guarded = dataclasses.replace(settings, allow_private_urls=False)
    add_destination(conn, "lab", "http://10.1.2.3/hook", allow_private_url=True)
    add_destination(conn, "mine", "http://127.0.0.1:9/hook", max_in_flight=1)
    add_deliveries(conn, "mine", 1)
    deliver_due(pool, "run-guarded", guarded)

    notes = guard_notes(guarded, database_url)

    assert notes[0].splitlines() == [
        "SSRF guard: on: destinations may reach only globally reachable addresses (checked "
        "when added and when a run connects)",
        "  local destinations (a receiver on 127.0.0.1, a private network) will be refused, "
        "and disabled by the run that tries them: allow one with `media-hooks destination add "
        "ID --url URL --allow-private-url`, or every one with MEDIA_HOOKS_ALLOW_PRIVATE_URLS=1 "
        "(development only)",
        "  allowed private addresses: lab",
    ]
    assert notes[1:] == [
        "  destination mine is disabled by the SSRF guard; to send to http://127.0.0.1:9/hook "
        "from here: `media-hooks destination add mine --url http://127.0.0.1:9/hook "
        "--allow-private-url`, then `media-hooks destination enable mine`"
    ]


def test_an_open_dev_says_so_in_one_line(database_url, settings):
    assert guard_notes(settings, database_url) == [
        "SSRF guard: off (MEDIA_HOOKS_ALLOW_PRIVATE_URLS=1): destinations may reach loopback, "
        "private and link-local addresses"
    ]
