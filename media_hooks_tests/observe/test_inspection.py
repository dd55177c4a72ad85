"""A delivery's story and verdict (media_hooks.observe.inspection), one delivery per condition."""

from __future__ import annotations

import pytest

from media_hooks.core.errors import UserError
from media_hooks.observe.inspection import format_age, inspect_delivery
from media_hooks_tests.factories import add_dispatches
from media_hooks_tests.operator_data import RUN, prepare


@pytest.fixture
def prepared(conn) -> dict[str, str]:
    return prepare(conn)


@pytest.mark.parametrize(
    ("condition", "kind", "words"),
    [
        ("succeeded", "succeeded", ["succeeded at", "after 1 attempt(s)"]),
        ("dead", "dead", ["dead because the receiver rejected it", "HTTP 422"]),
        ("waiting", "waiting", ["waiting by policy until", "backoff ", " s after attempt 1"]),
        ("leased", "leased", [f"leased by run {RUN} until", "in flight"]),
        (
            "lease_expired",
            "lease_expired",
            [f"leased by run {RUN}", "lease expired at", "the next sweep makes it due again"],
        ),
        ("enqueued", "enqueued", [f"enqueued by run {RUN} since"]),
        ("due", "due", ["due now, waiting for a run (since"]),
        ("requeued", "due", ["due now", "requeued by tester: receiver fixed its routes"]),
        (
            "paused",
            "waiting",
            ["waiting by policy", "destination beta is paused until", "Retry-After 3600"],
        ),
        ("disabled", "waiting", ["destination gamma is disabled", "HTTP 410"]),
    ],
)
def test_each_kind_of_delivery_gets_its_verdict(conn, prepared, condition, kind, words):
    story = inspect_delivery(conn, prepared[condition])
    assert story.verdict.kind == kind, story.verdict.text
    for word in words:
        assert word in story.verdict.text, story.verdict.text


def test_the_story_is_in_time_order_with_every_dispatch_attempt_and_requeue(conn, prepared):
    story = inspect_delivery(conn, prepared["requeued"])
    kinds = [event.kind for event in story.events]
    assert kinds == ["recorded", "dispatched", "attempt", "requeued"]
    times = [event.at for event in story.events]
    assert times == sorted(times)
    attempt = story.events[2]
    assert "rejected" in attempt.text and "HTTP 404" in attempt.text
    assert attempt.details["run_id"] == RUN
    assert "was dead" in story.events[3].text and "tester" in story.events[3].text
    assert "published by its claim" in story.events[1].text
    # From a delivery to its Dagster runs.
    assert story.run_ids == (RUN,)


def test_a_retried_attempt_says_when_and_why_it_goes_again(conn, prepared):
    story = inspect_delivery(conn, prepared["waiting"])
    (attempt,) = [e for e in story.events if e.kind == "attempt"]
    assert "retryable" in attempt.text and "HTTP 500" in attempt.text
    # The wait the database chose: attempt 1's backoff on a base of 600 s, with its jitter.
    row = conn.execute(
        "SELECT wait_reason, extract(epoch FROM next_attempt_at - updated_at) AS wait"
        " FROM webhook_delivery_all WHERE delivery_id = %s",
        (prepared["waiting"],),
    ).fetchone()
    assert 480 <= row["wait"] <= 720
    assert row["wait_reason"].startswith("backoff ")
    assert "next attempt" in attempt.text and row["wait_reason"] in attempt.text


def test_a_dispatch_says_whether_its_claim_published_it(conn, prepared):
    """This release's claim publishes what it writes; an earlier release's relay published just
    after its claim, and a dispatch another program wrote may not be published at all."""
    delivery_id = prepared["due"]
    add_dispatches(conn, [delivery_id], published=False)
    add_dispatches(conn, [delivery_id], published=False)
    conn.execute(
        "UPDATE dispatch_outbox_v3 SET published_at = created_at + interval '2 seconds'"
        " WHERE message_id = %s",
        (f"{delivery_id}:2",),
    )
    texts = [e.text for e in inspect_delivery(conn, delivery_id).events if e.kind == "dispatched"]
    assert len(texts) == 2
    assert texts[0].endswith("not published)")
    assert "published 20" in texts[1] and "by its claim" not in texts[1]


def test_a_never_dispatched_delivery_has_no_runs(conn, prepared):
    story = inspect_delivery(conn, prepared["due"])
    assert [e.kind for e in story.events] == ["recorded"]
    assert story.run_ids == ()


def test_the_json_document_holds_the_story(conn, prepared):
    document = inspect_delivery(conn, prepared["succeeded"]).as_dict()
    assert document["verdict"]["kind"] == "succeeded"
    assert document["delivery"]["delivery_id"] == prepared["succeeded"]
    assert [e["kind"] for e in document["events"]] == ["recorded", "dispatched", "attempt"]
    assert isinstance(document["events"][0]["at"], str)


def test_an_unknown_delivery_is_a_user_error(conn, prepared):
    with pytest.raises(UserError, match="no delivery 'nope'"):
        inspect_delivery(conn, "nope")
    with pytest.raises(UserError, match="delivery id"):
        inspect_delivery(conn, "has.dot")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "none"),
        (0.4, "0.4s"),
        (42, "42s"),
        (200, "3m 20s"),
        (7500, "2h 5m"),
        (3 * 86400 + 4 * 3600, "3d 4h"),
    ],
)
def test_ages_read_in_human_units(seconds, text):
    assert format_age(seconds) == text
