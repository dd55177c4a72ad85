"""The vectors the Node package's unit tests check (node/test/vectors/*.json) are what the
Python engine computes: the two runtimes are pinned to one set of signatures, SSRF verdicts,
outcome classes, canonical payloads, delivery ids, sealed secrets and Pipes parameters. These
need no Node: a change on the Python side that the vectors no longer match fails here."""

from __future__ import annotations

import base64
import json
from datetime import datetime

import pytest
from cryptography.fernet import Fernet
from dagster_pipes import decode_param

from media_hooks.http import outcomes, signing, ssrf
from media_hooks.outbox.emit import (
    _body_parts,
    _payload_json,
    derive_delivery_id,
    event_delivery_id,
)
from media_hooks.store.secret_store import SecretBox
from media_hooks_tests.node.conftest import NODE_DIR


def _vectors(name: str):
    return json.loads((NODE_DIR / "test" / "vectors" / f"{name}.json").read_text(encoding="utf-8"))


def test_signatures_and_secrets():
    shared = _vectors("signing")
    for case in shared["cases"]:
        body = base64.b64decode(case["body_base64"])
        assert (
            signing.sign(case["secrets"], case["msg_id"], case["timestamp"], body)
            == case["signature"]
        )
    for case in shared["secrets"]:
        if case["error"] is None:
            assert signing.decode_secret(case["secret"]).hex() == case["key_hex"]
        else:
            with pytest.raises(signing.InvalidSecret) as refused:
                signing.decode_secret(case["secret"])
            assert str(refused.value) == case["error"]


def test_ssrf_verdicts():
    for case in _vectors("ssrf"):
        assert ssrf.refusal(case["address"]) == case["refusal"], case["address"]


def test_outcome_classes():
    shared = _vectors("outcomes")
    now = datetime.fromisoformat(shared["now"])
    for case in shared["cases"]:
        headers = {} if case["retry_after"] is None else {"Retry-After": case["retry_after"]}
        got = outcomes.classify_response(case["status"], headers, now, cap_seconds=float("inf"))
        assert (got.outcome, got.retry_after_seconds, got.disable_destination) == (
            case["outcome"],
            case["retry_after_seconds"],
            case["disable_destination"],
        ), case


def test_canonical_payloads_and_identities():
    shared = _vectors("canonical")
    for case in shared["cases"]:
        payload = json.loads(case["payload"])
        assert _payload_json(payload) == case["canonical"]
        assert (
            derive_delivery_id("cdn:eu-1", "rights.updated", "asset/é 1", payload)
            == case["derived_id"]
        )
        head, tail = _body_parts("rights.updated", "asset/é 1", case["canonical"])
        assert (head.decode(), tail.decode()) == (case["body_head"], case["body_tail"])
    for case in shared["event_delivery_ids"]:
        assert event_delivery_id(case["event_id"], case["destination_id"]) == case["delivery_id"]


def test_sealed_secret():
    shared = _vectors("fernet")
    box = SecretBox((Fernet(shared["other_key"]), Fernet(shared["key"])))
    assert box.open(shared["stored"], "destination 'cdn'") == shared["secret"]


def test_pipes_parameter():
    shared = _vectors("pipes")
    assert decode_param(shared["encoded"]) == shared["value"]
