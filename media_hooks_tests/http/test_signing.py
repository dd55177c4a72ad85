"""Standard Webhooks signatures, checked against the independent ``standardwebhooks`` package."""

from __future__ import annotations

import base64
import os
import time

import pytest
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from media_hooks.http.signing import InvalidSecret, VerificationError, decode_secret, sign, verify


def new_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


BODY = b'{"type": "asset.transcoded", "data": {"bitrate": 5000, "title": "caf\xc3\xa9"}}'


def headers_for(secrets: list[str], msg_id: str = "dlv_1", timestamp: int | None = None) -> dict:
    timestamp = int(time.time()) if timestamp is None else timestamp
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secrets, msg_id, timestamp, BODY),
    }


def test_one_secret_verifies_with_the_reference_implementation() -> None:
    secret = new_secret()
    headers = headers_for([secret])
    assert headers["webhook-signature"].startswith("v1,")
    assert Webhook(secret).verify(BODY, headers) == {
        "type": "asset.transcoded",
        "data": {"bitrate": 5000, "title": "café"},
    }


def test_two_active_secrets_each_verify_alone() -> None:
    old, new = new_secret(), new_secret()
    headers = headers_for([old, new])
    entries = headers["webhook-signature"].split(" ")
    assert len(entries) == 2 and all(e.startswith("v1,") for e in entries)
    Webhook(old).verify(BODY, headers)
    Webhook(new).verify(BODY, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(new_secret()).verify(BODY, headers)


def test_signature_covers_id_timestamp_and_body() -> None:
    secret = new_secret()
    headers = headers_for([secret])
    for changed in (
        {**headers, "webhook-id": "dlv_2"},
        {**headers, "webhook-timestamp": str(int(headers["webhook-timestamp"]) + 1)},
    ):
        with pytest.raises(WebhookVerificationError):
            Webhook(secret).verify(BODY, changed)
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(BODY + b" ", headers)


def test_our_verify_accepts_reference_signatures_from_any_active_secret() -> None:
    old, new = new_secret(), new_secret()
    msg_id, now = "dlv_9", int(time.time())
    reference = Webhook(new).sign(msg_id, _utc(now), BODY.decode())
    verify(
        [old, new],
        {"Webhook-Id": msg_id, "Webhook-Timestamp": str(now), "Webhook-Signature": reference},
        BODY,
    )


def _utc(seconds: int):
    from datetime import UTC, datetime

    return datetime.fromtimestamp(seconds, UTC)


def test_verify_rejects_a_bad_signature_without_naming_the_secret() -> None:
    secret = new_secret()
    headers = headers_for([new_secret()])
    with pytest.raises(VerificationError) as caught:
        verify([secret], headers, BODY)
    assert "no webhook-signature entry matches" in str(caught.value)
    assert secret[6:] not in str(caught.value)


@pytest.mark.parametrize("offset", [-301, 301])
def test_verify_rejects_a_timestamp_outside_the_tolerance(offset: int) -> None:
    secret = new_secret()
    now = int(time.time())
    headers = headers_for([secret], timestamp=now + offset)
    with pytest.raises(VerificationError, match="tolerance"):
        verify([secret], headers, BODY, now=now)
    verify([secret], headers, BODY, tolerance_seconds=302, now=now)


def test_verify_rejects_missing_headers_and_garbage() -> None:
    secret = new_secret()
    headers = headers_for([secret])
    for name in headers:
        partial = {k: v for k, v in headers.items() if k != name}
        with pytest.raises(VerificationError, match=f"missing {name}"):
            verify([secret], partial, BODY)
    with pytest.raises(VerificationError, match="not Unix seconds"):
        verify([secret], {**headers, "webhook-timestamp": "yesterday"}, BODY)
    with pytest.raises(VerificationError):
        verify([secret], {**headers, "webhook-signature": "v1,@@@ v2,abc nonsense"}, BODY)


def test_unpadded_secret_decodes_like_the_reference() -> None:
    key = os.urandom(31)
    unpadded = "whsec_" + base64.b64encode(key).decode().rstrip("=")
    assert decode_secret(unpadded) == key
    Webhook(unpadded).verify(BODY, headers_for([unpadded]))


@pytest.mark.parametrize("bad", ["sk_live_abc", "whsec_", "whsec_!!notbase64!!"])
def test_malformed_secret_is_a_user_error_that_does_not_echo_it(bad: str) -> None:
    with pytest.raises(InvalidSecret) as caught:
        sign([bad], "dlv_1", 1, BODY)
    assert bad not in str(caught.value) or bad == "whsec_"
