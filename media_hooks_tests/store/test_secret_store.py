"""Signing secrets at rest (issue 11, part 4): encrypted under MEDIA_HOOKS_SECRET_KEY, decrypted
only where a destination is read for sending, rotated with `secrets rekey`, and a missing or
wrong key a clear error that never shows a key."""

from __future__ import annotations

import base64
import json

import psycopg
import pytest

from media_hooks.core.errors import UserError
from media_hooks.devtools.receiver import Receiver
from media_hooks.engine.delivery_run import deliver_due
from media_hooks.outbox.destinations import (
    DestinationSpec,
    get_destination,
    rekey_secrets,
    secret_inventory,
    upsert_destination,
)
from media_hooks.store.secret_store import ENV, SecretBox, SecretKeyError, generate_key
from media_hooks_tests.conftest import run_cli
from media_hooks_tests.factories import add_deliveries, states

SECRET = "whsec_" + base64.b64encode(b"at-rest-test-secret-0123456789ab").decode()
OTHER = "whsec_" + base64.b64encode(b"another-secret-for-the-rotation").decode()
KEY_A, KEY_B = generate_key(), generate_key()


def _with_env(value: str) -> SecretBox:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ENV, value)
        return SecretBox.from_env()


def _box(*keys: str) -> SecretBox:
    return _with_env(",".join(keys))


def _stored(conn, destination_id: str = "pub") -> list[str]:
    return conn.execute(
        "SELECT secrets FROM webhook_destination WHERE destination_id = %s", (destination_id,)
    ).fetchone()["secrets"]


def _add(conn, settings, box: SecretBox, *secrets: str, destination_id: str = "pub", url=None):
    spec = DestinationSpec(destination_id, url or "https://p.example/", secrets=secrets)
    return upsert_destination(conn, spec, settings, box)


def test_sealed_secrets_open_only_with_a_configured_key():
    a, ba = _box(KEY_A), _box(KEY_B, KEY_A)
    sealed = a.seal(SECRET)
    assert sealed.startswith("fernet:") and SECRET not in sealed
    assert a.open(sealed, "x") == ba.open(sealed, "x") == SECRET
    assert (a.key_number(sealed), ba.key_number(sealed)) == (1, 2)
    assert SecretBox().open(SECRET, "x") == SECRET, "a secret stored as given reads as given"
    with pytest.raises(SecretKeyError, match=f"encrypted, but {ENV} is not set"):
        SecretBox().open(sealed, "destination 'pub'")
    with pytest.raises(SecretKeyError, match="cannot be decrypted with any key") as wrong:
        _box(KEY_B).open(sealed, "destination 'pub'")
    assert KEY_A not in str(wrong.value) and KEY_B not in str(wrong.value)
    assert KEY_A not in repr(a) and KEY_A not in a.describe()


# Named ids: the keys are made per session, and parallel workers must collect the same tests.
@pytest.mark.parametrize(
    "value",
    ["not-a-key", f"{KEY_A},", "x" * 44, f"{KEY_A},{KEY_A[:-2]}"],
    ids=["not-base64", "empty-second", "not-a-fernet-key", "truncated-second"],
)
def test_a_malformed_key_is_refused_without_echoing_it(value):
    with pytest.raises(UserError, match=f"{ENV}: key \\d of \\d is not a Fernet key") as refused:
        _with_env(value)
    assert value.split(",")[0][:20] not in str(refused.value)


def test_destination_add_stores_them_encrypted_and_the_sender_reads_them_decrypted(conn, settings):
    box = _box(KEY_A)
    _add(conn, settings, box, SECRET, OTHER)
    stored = _stored(conn)
    assert all(s.startswith("fernet:") for s in stored)
    assert not any(SECRET in s or OTHER in s for s in stored)
    assert get_destination(conn, "pub", box).secrets == (SECRET, OTHER)
    with pytest.raises(SecretKeyError, match="destination 'pub'"):
        get_destination(conn, "pub", SecretBox())


def test_the_schema_accepts_only_the_two_forms(conn, settings):
    _add(conn, settings, _box(KEY_A), SECRET)
    with pytest.raises(psycopg.errors.CheckViolation, match="secrets_well_formed"):
        conn.execute("UPDATE webhook_destination SET secrets = ARRAY['hunter2']")


def test_without_the_key_no_secret_is_added_in_the_clear_beside_encrypted_ones(conn, settings):
    _add(conn, settings, _box(KEY_A), SECRET)
    with pytest.raises(UserError, match=f"stored encrypted, but {ENV} is not set"):
        _add(conn, settings, SecretBox(), OTHER, destination_id="other")
    assert conn.execute("SELECT count(*) AS n FROM webhook_destination").fetchone()["n"] == 1
    _add(conn, settings, SecretBox(), destination_id="other")  # no secret: nothing to protect


def test_rekey_encrypts_plaintext_and_rotates_to_the_new_key(conn, settings):
    _add(conn, settings, SecretBox(), SECRET)  # before encryption was turned on
    _add(conn, settings, _box(KEY_A), OTHER, destination_id="other")
    rotating = _box(KEY_B, KEY_A)
    assert [e["as_given"] for e in secret_inventory(conn, rotating)] == [0, 1]

    result = rekey_secrets(conn, rotating)
    assert (result.destinations, result.secrets, result.were_plaintext) == (2, 2, 1)
    only_new = _box(KEY_B)
    assert get_destination(conn, "pub", only_new).secrets == (SECRET,)
    assert get_destination(conn, "other", only_new).secrets == (OTHER,)
    inventory = {e["destination_id"]: e for e in secret_inventory(conn, rotating)}
    assert inventory["pub"]["encrypted_by_key"] == {"1": 1}

    back = rekey_secrets(conn, only_new, to_plaintext=True)
    assert back.secrets == 2 and _stored(conn) == [SECRET]


def test_rekey_with_a_key_that_opens_nothing_writes_nothing(conn, settings):
    _add(conn, settings, _box(KEY_A), SECRET)
    _add(conn, settings, SecretBox(), destination_id="plain")
    before = _stored(conn)
    with pytest.raises(SecretKeyError, match="destination 'pub'"):
        rekey_secrets(conn, _box(KEY_B))
    assert _stored(conn) == before
    dry = rekey_secrets(conn, _box(KEY_A), dry_run=True)
    assert dry.secrets == 1 and _stored(conn) == before
    with pytest.raises(UserError, match="not set"):
        rekey_secrets(conn, SecretBox())


def test_deliveries_are_signed_with_the_decrypted_secret(conn, pool, settings, monkeypatch):
    monkeypatch.setenv(ENV, KEY_A)
    with Receiver(secrets=[SECRET]) as receiver:
        _add(conn, settings, SecretBox.from_env(), SECRET, url=receiver.url)
        add_deliveries(conn, "pub", 5)
        report = deliver_due(pool, "run-1", settings)
        assert report.totals.succeeded == 5
        assert receiver.requests and all(r.verified for r in receiver.requests)


def test_without_the_key_a_batch_fails_clearly_and_spends_nothing(
    conn, pool, settings, monkeypatch
):
    with Receiver(secrets=[SECRET]) as receiver:
        _add(conn, settings, _box(KEY_A), SECRET, url=receiver.url)
        add_deliveries(conn, "pub", 3)
        monkeypatch.delenv(ENV, raising=False)
        with pytest.raises(SecretKeyError, match=f"encrypted, but {ENV} is not set"):
            deliver_due(pool, "run-1", settings)
        assert receiver.requests == []
    assert conn.execute("SELECT count(*) AS n FROM delivery_attempt_all").fetchone()["n"] == 0
    assert (
        conn.execute("SELECT max(budget_used) AS b FROM webhook_delivery_all").fetchone()["b"] == 0
    )
    assert set(states(conn)) <= {"pending", "enqueued"}, "nothing leased, nothing terminal"


def test_the_secrets_commands_never_print_a_key_or_a_secret(cli_env, database_url):
    key = run_cli("secrets", "generate-key", env=cli_env).stdout.strip()
    env = dict(cli_env, **{ENV: key})
    added = run_cli(
        "destination", "add", "pub", "--url", "https://p.example/", "--secret", SECRET, env=env
    )
    assert added.returncode == 0 and added.stderr == "", added.stderr
    plain = run_cli(
        "destination", "add", "plain", "--url", "https://p.example/", "--secret", OTHER,
        env=dict(cli_env),
    )  # fmt: skip
    assert plain.returncode == 2, "refused: it would sit in the clear beside an encrypted one"
    status = run_cli("secrets", "status", "--json", env=env)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["destinations"][0]["encrypted_by_key"] == {"1": 1}
    new_key = run_cli("secrets", "generate-key", env=cli_env).stdout.strip()
    rotated = run_cli("secrets", "rekey", env=dict(cli_env, **{ENV: f"{new_key},{key}"}))
    assert rotated.returncode == 0, rotated.stderr
    wrong = run_cli("secrets", "rekey", env=dict(cli_env, **{ENV: key}))
    assert wrong.returncode == 1 and wrong.stderr.count("\n") == 1
    assert "cannot be decrypted" in wrong.stderr
    help_text = run_cli("destination", "add", "--help", env=cli_env).stdout
    assert "WITHOUT IT THEY ARE STORED AS THEY ARE" in " ".join(help_text.split())
    every_output = "".join(r.stdout + r.stderr for r in (added, plain, status, rotated, wrong))
    for hidden in (key, new_key, SECRET, OTHER):
        assert hidden not in every_output
    with psycopg.connect(database_url) as check:
        (stored,) = check.execute("SELECT secrets FROM webhook_destination").fetchone()
    assert SECRET not in stored[0]
