"""Identifiers (media_hooks.core.identifiers): the validator, the contract and the schema agree."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from media_hooks.core.errors import UserError
from media_hooks.core.identifiers import MAX_IDENTIFIER_LENGTH, validate_identifier

# docs/contract.md, "Identifiers": 1–200 characters of letters, digits, `_`, `-` and `:`.
CONTRACT = re.compile(r"[A-Za-z0-9_:-]{1,200}")
ALPHABET = "abcXYZ019_:-"
CANDIDATES = st.one_of(
    st.text(ALPHABET, max_size=MAX_IDENTIFIER_LENGTH + 5),
    st.text(ALPHABET + ". \n\x00é☃/", max_size=40),
    st.text(max_size=300),
)


def _accepts(value: str) -> bool:
    try:
        assert validate_identifier(value, "id") == value
    except UserError as exc:
        message = str(exc)
        assert "\n" not in message and len(message) < 500 + len(repr(value)), message
        return False
    return True


@settings(max_examples=1000, deadline=None)
@given(value=CANDIDATES)
def test_the_validator_is_the_contract(value):
    assert _accepts(value) == bool(CONTRACT.fullmatch(value))


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=CANDIDATES.filter(lambda v: "\x00" not in v))
def test_the_schema_agrees_with_the_validator(conn, value):
    # The check constraint of webhook_delivery.delivery_id and webhook_destination.destination_id.
    (held,) = (
        conn.execute(
            "SELECT %(v)s ~ '^[A-Za-z0-9_:-]+$' AND length(%(v)s) <= 200 AS held", {"v": value}
        )
        .fetchone()
        .values()
    )
    assert held == _accepts(value)


@pytest.mark.parametrize("value", [None, 5, b"bytes", ["x"]])
def test_non_strings_are_refused(value):
    with pytest.raises(UserError, match="must be a string"):
        validate_identifier(value, "id")
