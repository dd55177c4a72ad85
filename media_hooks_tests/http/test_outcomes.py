"""The contract's outcome table (docs/contract.md), row by row, as classification; and
Retry-After parsing.

The same rows from a real receiver over HTTP are in test_sender.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from media_hooks.http.outcomes import (
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


# Properties (hypothesis): whatever a receiver answers, the classification is one of the
# contract's rows and never raises.

HEADER_TEXT = st.one_of(
    st.text(max_size=60),
    st.integers(-(10**6), 10**12).map(str),
    st.text("0123456789.", min_size=1, max_size=400),  # absurd delta-seconds
    st.datetimes(
        min_value=datetime(1, 1, 2), max_value=datetime(9998, 12, 30), timezones=st.just(UTC)
    ).map(lambda d: format_datetime(d, usegmt=True)),
)


@settings(max_examples=500, deadline=None)
@given(
    status=st.integers(0, 1000),
    retry_after=st.none() | HEADER_TEXT,
    header_name=st.sampled_from(["Retry-After", "retry-after", "RETRY-AFTER"]),
)
def test_every_answer_is_classified_by_the_contract(status, retry_after, header_name):
    headers = {} if retry_after is None else {header_name: retry_after}
    got = classify_response(status, headers, now=NOW)
    parsed = parse_retry_after(retry_after, NOW)
    assert got.outcome in (SUCCESS, RATE_LIMITED, RETRYABLE, REJECTED)
    assert got.disable_destination == (status == 410)
    if 200 <= status <= 299:
        assert got == Classification(SUCCESS)
    elif status == 429:
        assert got == Classification(RATE_LIMITED, parsed)
    elif status == 503:
        expected = (
            Classification(RETRYABLE) if parsed is None else Classification(RATE_LIMITED, parsed)
        )
        assert got == expected
    elif status in (408, 425) or 500 <= status <= 599:
        assert got == Classification(RETRYABLE)
    elif 300 <= status <= 499:
        assert got.outcome == REJECTED
    else:
        assert got == Classification(RETRYABLE)  # not an HTTP final status: a broken server
    if got.retry_after_seconds is not None:
        assert got.outcome == RATE_LIMITED
        assert 0 <= got.retry_after_seconds <= 3600


@settings(max_examples=500, deadline=None)
@given(value=HEADER_TEXT, cap=st.floats(1, 10**6))
def test_retry_after_is_none_or_within_zero_and_the_cap(value, cap):
    seconds = parse_retry_after(value, NOW, cap_seconds=cap)
    assert seconds is None or (0 <= seconds <= cap and seconds == seconds)


@settings(max_examples=300, deadline=None)
@given(seconds=st.integers(0, 10**9), spaces=st.sampled_from(["", " ", "\t"]))
def test_retry_after_delta_seconds_are_read_exactly(seconds, spaces):
    assert parse_retry_after(f"{spaces}{seconds}{spaces}", NOW) == min(seconds, 3600)


@settings(max_examples=300, deadline=None)
@given(offset=st.integers(-(10**8), 10**8))
def test_retry_after_dates_are_seconds_from_now(offset):
    when = NOW + timedelta(seconds=offset)
    assert parse_retry_after(format_datetime(when, usegmt=True), NOW) == min(max(offset, 0), 3600)
