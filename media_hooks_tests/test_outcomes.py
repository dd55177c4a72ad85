"""CONTRACT.md's outcome table, row by row, as classification; and Retry-After parsing.

The same rows from a real receiver over HTTP are in test_sender.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from media_hooks.outcomes import (
    AMBIGUOUS,
    RATE_LIMITED,
    REJECTED,
    RETRYABLE,
    SUCCESS,
    Classification,
    classify_response,
    parse_retry_after,
)

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("status", "headers", "expected"),
    [
        (200, {}, Classification(SUCCESS)),
        (204, {}, Classification(SUCCESS)),
        (299, {}, Classification(SUCCESS)),
        (429, {}, Classification(RATE_LIMITED)),
        (429, {"Retry-After": "7"}, Classification(RATE_LIMITED, 7.0)),
        (503, {"retry-after": "30"}, Classification(RATE_LIMITED, 30.0)),
        (503, {}, Classification(RETRYABLE)),
        (503, {"Retry-After": "soon"}, Classification(RETRYABLE)),
        (408, {}, Classification(RETRYABLE)),
        (425, {}, Classification(RETRYABLE)),
        (500, {}, Classification(RETRYABLE)),
        (502, {"Retry-After": "5"}, Classification(RETRYABLE)),
        (599, {}, Classification(RETRYABLE)),
        (410, {}, Classification(REJECTED, disable_destination=True)),
        (400, {}, Classification(REJECTED)),
        (404, {}, Classification(REJECTED)),
        (499, {}, Classification(REJECTED)),
        (301, {"Location": "/x"}, Classification(REJECTED)),
        (302, {}, Classification(REJECTED)),
        (304, {}, Classification(REJECTED)),
    ],
)
def test_status_rows(status: int, headers: dict, expected: Classification) -> None:
    assert classify_response(status, headers, now=NOW) == expected


def test_outcome_names_match_the_schema() -> None:
    # webhook_delivery.last_outcome's CHECK constraint lists exactly these.
    assert {SUCCESS, RATE_LIMITED, RETRYABLE, AMBIGUOUS, REJECTED} == {
        "success",
        "rate_limited",
        "retryable",
        "ambiguous",
        "rejected",
    }


def test_retry_after_delta_seconds() -> None:
    assert parse_retry_after("120", NOW) == 120.0
    assert parse_retry_after(" 0 ", NOW) == 0.0
    assert parse_retry_after("1.5", NOW) == 1.5


def test_retry_after_http_date() -> None:
    later = NOW + timedelta(seconds=90)
    assert parse_retry_after(format_datetime(later, usegmt=True), NOW) == 90.0
    assert parse_retry_after("Sun, 01 Mar 2026 12:05:00 -0000", NOW) == 300.0


def test_retry_after_is_capped_and_never_negative() -> None:
    assert parse_retry_after("86400", NOW) == 3600.0
    assert parse_retry_after("86400", NOW, cap_seconds=60) == 60.0
    far = format_datetime(NOW + timedelta(days=30), usegmt=True)
    assert parse_retry_after(far, NOW) == 3600.0
    past = format_datetime(NOW - timedelta(hours=1), usegmt=True)
    assert parse_retry_after(past, NOW) == 0.0


@pytest.mark.parametrize("garbage", [None, "", "soon", "-5", "1e9", "inf", "nan", "Someday 99"])
def test_retry_after_garbage_is_none(garbage: str | None) -> None:
    assert parse_retry_after(garbage, NOW) is None


def test_retry_after_cap_applies_through_classification() -> None:
    assert classify_response(429, {"Retry-After": "999999"}, now=NOW, cap_seconds=10) == (
        Classification(RATE_LIMITED, 10.0)
    )
