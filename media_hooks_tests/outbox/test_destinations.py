"""Destinations (media_hooks.outbox.destinations) against a real database."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from media_hooks.core.config import Settings
from media_hooks.core.errors import UserError
from media_hooks.core.identifiers import validate_identifier
from media_hooks.outbox.destinations import (
    DestinationSpec,
    disable_destination,
    enable_destination,
    get_destination,
    list_destinations,
    secret_key,
    upsert_destination,
)

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
OTHER_SECRET = "whsec_c2Vjb25kLXNlY3JldC1rZXk="
SETTINGS = Settings(
    database_url="postgresql://unused",
    home=Path("/nonexistent"),
    lease_seconds=90.0,
    enqueue_timeout_seconds=3600.0,
    allow_private_urls=True,
)


def _count(conn) -> int:
    return conn.execute("SELECT count(*) AS n FROM webhook_destination").fetchone()["n"]


def _stored(conn, destination_id: str) -> dict:
    return conn.execute(
        "SELECT * FROM webhook_destination WHERE destination_id = %s", (destination_id,)
    ).fetchone()


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", "must not be empty"),
        ("a" * 201, "at most 200"),
        ("pub.lisher", "'.'"),
        ("with space", "' '"),
        ("é", "'é'"),
        ("line\n", "'\\n'"),
    ],
)
def test_identifier_rules(value, problem):
    with pytest.raises(UserError, match="destination id") as caught:
        validate_identifier(value, "destination id")
    assert problem in str(caught.value)


def test_identifier_accepts_the_contract_alphabet():
    value = "Pub_lisher-1:eu" + "x" * 185
    assert validate_identifier(value, "delivery_id") == value


def test_new_destination_gets_schema_defaults(conn):
    assert upsert_destination(conn, DestinationSpec("pub", "https://pub.example/hooks"), SETTINGS)
    row = _stored(conn, "pub")
    assert row["url"] == "https://pub.example/hooks"
    assert row["secrets"] == []
    assert (row["rate_per_second"], row["burst"], row["max_in_flight"]) == (10, 10, 4)
    assert row["enabled"] is True


def test_update_keeps_options_not_given_and_replaces_secrets(conn):
    first = DestinationSpec(
        "pub", "https://a.example/", secrets=(SECRET,), rate_per_second=2.5, burst=3
    )
    assert upsert_destination(conn, first, SETTINGS) is True
    second = DestinationSpec("pub", "https://b.example/", secrets=(OTHER_SECRET, SECRET))
    assert upsert_destination(conn, second, SETTINGS) is False
    row = _stored(conn, "pub")
    assert row["url"] == "https://b.example/"
    assert (row["rate_per_second"], row["burst"]) == (2.5, 3)
    assert row["secrets"] == [OTHER_SECRET, SECRET]

    upsert_destination(conn, DestinationSpec("pub", "https://b.example/", burst=7), SETTINGS)
    row = _stored(conn, "pub")
    assert row["secrets"] == [OTHER_SECRET, SECRET], "secrets not given are kept"
    assert (row["rate_per_second"], row["burst"]) == (2.5, 7)

    upsert_destination(conn, DestinationSpec("pub", "https://b.example/", secrets=()), SETTINGS)
    assert _stored(conn, "pub")["secrets"] == []


BAD_SPECS = [
    ({"destination_id": "a.b"}, "destination id"),
    ({"url": "ftp://pub.example/"}, "http:// or https://"),
    ({"url": "https:///nohost"}, "must name a host"),
    ({"url": "https://user:pw@pub.example/"}, "credentials"),
    ({"url": "https://pub.example:99999/"}, "not a valid URL .Port out of range"),
    ({"url": "https://[::1/"}, "not a valid URL .Invalid IPv6 URL."),
    ({"url": "ftp://user:pw@pub.example/"}, "credentials"),
    (
        {"rate_per_second": 0.0},
        "rate must be a number of starts per second at least 0.001 and at most 1000000, got 0",
    ),
    (
        {"rate_per_second": 1e-300},
        "rate must be a number of starts per second at least 0.001 and at most 1000000",
    ),
    ({"rate_per_second": 1e7}, "rate must be a number of starts per second at least"),
    ({"rate_per_second": float("nan")}, "rate must be a number of starts per second"),
    ({"burst": 0}, "burst must be a whole number at least 1 and at most 1000000, got 0"),
    ({"burst": 2**40}, "burst must be a whole number at least 1"),
    ({"max_in_flight": 0}, "max in flight must be a whole number at least 1 and at most 1000"),
    ({"max_in_flight": 5000}, "max in flight must be a whole number at least 1 and at most 1000"),
    ({"timeout_seconds": 0.0}, "timeout must be a number of seconds at least 0.1 and at most 600"),
    ({"timeout_seconds": 85.0}, "lease"),
    ({"max_attempts": 0}, "max attempts must be a whole number at least 1 and at most 1000"),
    ({"max_attempts": 10**6}, "max attempts must be a whole number at least 1 and at most 1000"),
    (
        {"backoff_base_seconds": -1.0},
        "backoff base must be a number of seconds at least 0.1 and at most 86400",
    ),
    (
        {"backoff_base_seconds": 1e300, "backoff_cap_seconds": 1e300},
        "backoff base must be a number of seconds at least",
    ),
    (
        {"backoff_cap_seconds": 1e300},
        "backoff cap must be a number of seconds at least 0.1 and at most 2592000",
    ),
    ({"backoff_cap_seconds": float("inf")}, "backoff cap must be a number of seconds"),
    ({"backoff_base_seconds": 10.0, "backoff_cap_seconds": 5.0}, "backoff cap"),
    ({"secrets": ("not-a-secret",)}, "whsec_<base64>"),
    ({"secrets": (SECRET, "whsec_***")}, "secret 2 of 2"),
    ({"secrets": ("whsec_",)}, "key is empty"),
]


@pytest.mark.parametrize(("change", "problem"), BAD_SPECS)
def test_invalid_spec_is_refused_and_nothing_written(conn, change, problem):
    spec = replace(DestinationSpec("pub", "https://pub.example/"), **change)
    with pytest.raises(UserError, match=problem) as caught:
        upsert_destination(conn, spec, SETTINGS)
    assert "not-a-secret" not in str(caught.value)
    assert "***" not in str(caught.value)
    assert _count(conn) == 0


def test_cross_option_rule_checked_against_stored_values(conn):
    upsert_destination(
        conn, DestinationSpec("pub", "https://pub.example/", backoff_base_seconds=60), SETTINGS
    )
    with pytest.raises(UserError, match="backoff cap"):
        upsert_destination(
            conn, DestinationSpec("pub", "https://x.example/", backoff_cap_seconds=30), SETTINGS
        )
    row = _stored(conn, "pub")
    assert (row["url"], row["backoff_cap_seconds"]) == ("https://pub.example/", 28800)


def test_timeout_must_leave_the_lease_margin(conn):
    short_lease = replace(SETTINGS, lease_seconds=20.0)
    with pytest.raises(UserError, match="below 15 s"):
        upsert_destination(
            conn, DestinationSpec("pub", "https://p.example/", timeout_seconds=15), short_lease
        )
    upsert_destination(
        conn, DestinationSpec("pub", "https://p.example/", timeout_seconds=14.5), short_lease
    )
    assert _stored(conn, "pub")["timeout_seconds"] == 14.5


def test_ssrf_guard_applies_without_the_variable(conn):
    guarded = replace(SETTINGS, allow_private_urls=False)
    with pytest.raises(UserError, match="SSRF"):
        upsert_destination(conn, DestinationSpec("pub", "http://10.0.0.7/hooks"), guarded)
    assert _count(conn) == 0
    upsert_destination(conn, DestinationSpec("pub", "https://93.184.216.34/hooks"), guarded)
    assert _count(conn) == 1


def test_one_destination_may_be_allowed_private_addresses_and_keeps_it_until_told(conn):
    """--allow-private-url is the destination's own: stored, kept by an update that does not
    mention it (a new loopback URL passes), taken back only by --no-allow-private-url, after
    which the same URL is refused and nothing is written."""
    guarded = replace(SETTINGS, allow_private_urls=False)
    upsert_destination(
        conn,
        DestinationSpec("mine", "http://127.0.0.1:8765/hook", allow_private_url=True),
        guarded,
    )
    upsert_destination(conn, DestinationSpec("mine", "http://127.0.0.1:8766/hook"), guarded)
    assert _stored(conn, "mine")["allow_private_url"] is True
    assert get_destination(conn, "mine").allow_private_url is True
    assert [(d["destination_id"], d["allow_private_url"]) for d in list_destinations(conn)] == [
        ("mine", True)
    ]
    # Another destination to the same address is refused: the choice was mine's alone.
    with pytest.raises(UserError, match="--allow-private-url"):
        upsert_destination(conn, DestinationSpec("other", "http://127.0.0.1:8766/hook"), guarded)
    with pytest.raises(UserError, match="SSRF"):
        upsert_destination(
            conn,
            DestinationSpec("mine", "http://127.0.0.1:8767/hook", allow_private_url=False),
            guarded,
        )
    assert _stored(conn, "mine")["url"] == "http://127.0.0.1:8766/hook"
    assert _stored(conn, "mine")["allow_private_url"] is True
    assert _count(conn) == 1


def test_secret_key_decodes_base64():
    assert secret_key("whsec_" + "aGVsbG8=") == b"hello"


def test_get_destination_has_secrets_for_the_sender(conn):
    upsert_destination(
        conn, DestinationSpec("pub", "https://p.example/", secrets=(SECRET,), burst=2), SETTINGS
    )
    destination = get_destination(conn, "pub")
    assert destination.secrets == (SECRET,)
    assert destination.burst == 2
    assert destination.enabled
    with pytest.raises(UserError, match="no destination 'nope'"):
        get_destination(conn, "nope")


def test_list_never_contains_secrets(conn):
    upsert_destination(
        conn, DestinationSpec("pub", "https://p.example/", secrets=(SECRET, OTHER_SECRET)), SETTINGS
    )
    (row,) = list_destinations(conn)
    assert row["secret_count"] == 2
    assert "secrets" not in row
    assert SECRET not in repr(row) and OTHER_SECRET not in repr(row)
    assert row["state"] == "enabled"


def test_disable_needs_a_reason_and_enable_clears_it(conn):
    upsert_destination(conn, DestinationSpec("pub", "https://p.example/"), SETTINGS)
    with pytest.raises(UserError, match="reason"):
        disable_destination(conn, "pub", "   ")
    assert _stored(conn, "pub")["enabled"] is True

    disable_destination(conn, "pub", "publisher maintenance")
    (row,) = list_destinations(conn)
    assert (row["state"], row["disabled_reason"]) == ("disabled", "publisher maintenance")
    assert row["disabled_at"] is not None

    enable_destination(conn, "pub")
    (row,) = list_destinations(conn)
    assert (row["state"], row["disabled_reason"], row["disabled_at"]) == ("enabled", None, None)

    with pytest.raises(UserError, match="no destination"):
        enable_destination(conn, "nope")
    with pytest.raises(UserError, match="no destination"):
        disable_destination(conn, "nope", "why")


def test_a_paused_destination_lists_as_paused(conn):
    upsert_destination(conn, DestinationSpec("pub", "https://p.example/"), SETTINGS)
    conn.execute(
        "UPDATE webhook_destination SET paused_until = now() + interval '1 minute', "
        "paused_reason = '429 Retry-After 60'"
    )
    (row,) = list_destinations(conn)
    assert (row["state"], row["paused_reason"]) == ("paused", "429 Retry-After 60")
