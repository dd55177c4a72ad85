"""``media-hooks destination ...`` as a user runs it: real processes, a real database."""

from __future__ import annotations

import json

import psycopg
import pytest

from media_hooks_tests.conftest import run_cli

# The command line itself (parsing, output, exit codes) runs in CI's first pass only: the
# destination statements are tested on both servers by test_destinations.py.
pytestmark = pytest.mark.one_server

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
# Looks like a secret but is not base64: the error must not echo it.
BAD_SECRET = "whsec_s3cr3t!value"


def _count(url: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT count(*) FROM webhook_destination").fetchone()[0]


def _assert_one_clear_line(done, *, contains: str) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("media-hooks: ")
    assert contains in lines[0]
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["pub.lisher", "--url", "https://p.example/"], "'.'"),
        (["pub", "--url", "ftp://p.example/"], "http:// or https://"),
        (["pub", "--url", "https://"], "must name a host"),
        (
            ["pub", "--url", "https://p.example/", "--rate", "0"],
            "rate must be a number of starts per second at least",
        ),
        (
            ["pub", "--url", "https://p.example/", "--rate", "1e-300"],
            "rate must be a number of starts per second at least",
        ),
        (
            [
                "pub",
                "--url",
                "https://p.example/",
                "--backoff-base",
                "1e300",
                "--backoff-cap",
                "1e300",
            ],
            "backoff base must be a number of seconds at least 0.1 and at most 86400",
        ),
        (["pub", "--url", "https://p.example/", "--max-in-flight", "100000"], "max in flight"),
        (["pub", "--url", "https://p.example/", "--rate", "fast"], "invalid float value"),
        (["pub", "--url", "https://p.example/", "--burst", "0"], "burst must be"),
        (["pub", "--url", "https://p.example/", "--max-in-flight", "0"], "max in flight"),
        (
            ["pub", "--url", "https://p.example/", "--timeout", "0"],
            "timeout must be a number of seconds at least",
        ),
        (["pub", "--url", "https://p.example/", "--timeout", "86"], "lease"),
        (["pub", "--url", "https://p.example/", "--max-attempts", "0"], "max attempts"),
        (["pub", "--url", "https://p.example/", "--backoff-base", "0"], "backoff base"),
        (
            ["pub", "--url", "https://p.example/", "--backoff-base", "9", "--backoff-cap", "3"],
            "backoff cap",
        ),
        (["pub", "--url", "https://p.example/", "--secret", BAD_SECRET], "whsec_<base64>"),
        (["pub", "--url", "https://p.example/", "--secret", "s3cr3t!value"], "whsec_<base64>"),
        (["pub"], "--url"),
    ],
)
def test_bad_values_exit_2_with_one_line_and_write_nothing(cli_env, database_url, args, problem):
    done = run_cli("destination", "add", *args, env=cli_env)
    _assert_one_clear_line(done, contains=problem)
    assert "s3cr3t!value" not in done.stderr
    assert _count(database_url) == 0


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/hooks",
        "http://10.20.30.40/hooks",
        "http://169.254.169.254/latest/meta-data",
        "http://localhost:9000/hooks",
    ],
)
def test_ssrf_guard_on_and_off(cli_env, database_url, url):
    guarded = {k: v for k, v in cli_env.items() if k != "MEDIA_HOOKS_ALLOW_PRIVATE_URLS"}
    refused = run_cli("destination", "add", "pub", "--url", url, env=guarded)
    _assert_one_clear_line(refused, contains="MEDIA_HOOKS_ALLOW_PRIVATE_URLS=1")
    assert _count(database_url) == 0

    allowed = run_cli("destination", "add", "pub", "--url", url, env=cli_env)
    assert allowed.returncode == 0, allowed.stderr
    assert _count(database_url) == 1


def test_allow_private_url_is_the_destinations_own_choice_and_list_shows_it(cli_env, database_url):
    guarded = {k: v for k, v in cli_env.items() if k != "MEDIA_HOOKS_ALLOW_PRIVATE_URLS"}
    url = "http://127.0.0.1:8765/hook"
    added = run_cli("destination", "add", "mine", "--url", url, "--allow-private-url", env=guarded)
    assert added.returncode == 0, added.stderr
    # Updated without the option: what is stored decides, and the new URL passes.
    moved = run_cli("destination", "add", "mine", "--url", url + "2", env=guarded)
    assert moved.returncode == 0, moved.stderr
    listed = run_cli("destination", "list", env=guarded)
    assert f"{url}2 (private address allowed)" in listed.stdout
    document = json.loads(run_cli("destination", "list", "--json", env=guarded).stdout)
    assert [d["allow_private_url"] for d in document["destinations"]] == [True]
    refused = run_cli(
        "destination", "add", "mine", "--url", url, "--no-allow-private-url", env=guarded
    )
    _assert_one_clear_line(refused, contains="--allow-private-url")


def test_public_ip_literal_is_accepted_by_the_guard(cli_env, database_url):
    guarded = {k: v for k, v in cli_env.items() if k != "MEDIA_HOOKS_ALLOW_PRIVATE_URLS"}
    done = run_cli("destination", "add", "pub", "--url", "https://93.184.216.34/h", env=guarded)
    assert done.returncode == 0, done.stderr
    assert _count(database_url) == 1


def test_add_then_update_keeps_options_not_given(cli_env, database_url):
    created = run_cli(
        "destination", "add", "pub", "--url", "https://a.example/", "--rate", "2.5",
        "--secret", SECRET, env=cli_env,
    )  # fmt: skip
    assert (created.returncode, created.stdout.strip()) == (0, "created destination pub")
    updated = run_cli(
        "destination", "add", "pub", "--url", "https://b.example/", "--burst", "3", "--json",
        env=cli_env,
    )  # fmt: skip
    assert updated.returncode == 0, updated.stderr
    assert json.loads(updated.stdout) == {"destination_id": "pub", "created": False}
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT url, rate_per_second, burst, secrets FROM webhook_destination"
        ).fetchone()
    assert row == ("https://b.example/", 2.5, 3, [SECRET])


def test_list_never_prints_secrets(cli_env):
    for name in ("pub-a", "pub-b"):
        done = run_cli(
            "destination", "add", name, "--url", f"https://{name}.example/",
            "--secret", SECRET, "--secret", "whsec_c2Vjb25k", env=cli_env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr

    text = run_cli("destination", "list", env=cli_env)
    assert text.returncode == 0, text.stderr
    assert "whsec_" not in text.stdout and "whsec_" not in text.stderr
    header, first, second = text.stdout.strip().splitlines()
    assert header.split()[:2] == ["id", "url"]
    assert first.startswith("pub-a") and second.startswith("pub-b")
    assert first.index("https://") == header.index("url"), "columns are aligned"

    as_json = run_cli("destination", "list", "--json", env=cli_env)
    assert as_json.returncode == 0, as_json.stderr
    assert "whsec_" not in as_json.stdout
    document = json.loads(as_json.stdout)
    assert [d["destination_id"] for d in document["destinations"]] == ["pub-a", "pub-b"]
    assert all(d["secret_count"] == 2 and "secrets" not in d for d in document["destinations"])


def test_enable_disable_and_states_in_list(cli_env, database_url):
    for name in ("pub-a", "pub-b"):
        run_cli("destination", "add", name, "--url", "https://p.example/", env=cli_env)
    missing_reason = run_cli("destination", "disable", "pub-a", env=cli_env)
    _assert_one_clear_line(missing_reason, contains="--reason")

    disabled = run_cli("destination", "disable", "pub-a", "--reason", "410 Gone", env=cli_env)
    assert disabled.returncode == 0, disabled.stderr
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "UPDATE webhook_destination SET paused_until = now() + interval '1 hour', "
            "paused_reason = '429 Retry-After' WHERE destination_id = 'pub-b'"
        )
    listing = run_cli("destination", "list", env=cli_env).stdout
    assert "disabled (410 Gone)" in listing
    assert "paused until " in listing and "(429 Retry-After)" in listing

    enabled = run_cli("destination", "enable", "pub-a", env=cli_env)
    assert enabled.returncode == 0, enabled.stderr
    states = {
        d["destination_id"]: (d["state"], d["disabled_reason"])
        for d in json.loads(run_cli("destination", "list", "--json", env=cli_env).stdout)[
            "destinations"
        ]
    }
    assert states == {"pub-a": ("enabled", None), "pub-b": ("paused", None)}

    unknown = run_cli("destination", "enable", "nope", env=cli_env)
    _assert_one_clear_line(unknown, contains="no destination 'nope'")


def test_empty_list(cli_env):
    done = run_cli("destination", "list", env=cli_env)
    assert done.returncode == 0
    assert "no destinations" in done.stdout
    assert json.loads(run_cli("destination", "list", "--json", env=cli_env).stdout) == {
        "destinations": []
    }


def _listed(cli_env) -> dict[str, dict]:
    done = run_cli("destination", "list", "--json", env=cli_env)
    assert done.returncode == 0, done.stderr
    return {d["destination_id"]: d for d in json.loads(done.stdout)["destinations"]}


def test_subscriptions_and_per_asset_rules_are_set_listed_and_kept(cli_env):
    """Issue 14: --event-type (repeatable: exact names and `prefix.*`) replaces the list, '*'
    goes back to every type; --ordering and --coalesce are kept when not given."""
    created = run_cli(
        "destination", "add", "pub", "--url", "https://p.example/",
        "--event-type", "transcode.completed", "--event-type", "rights.*",
        "--event-type", "rights.*", "--ordering", "asset", "--coalesce", "asset", env=cli_env,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    pub = _listed(cli_env)["pub"]
    assert pub["event_types"] == ["rights.*", "transcode.completed"]
    assert (pub["ordering"], pub["coalescing"]) == ("asset", "asset")
    text = run_cli("destination", "list", env=cli_env).stdout
    assert "rights.*, transcode.completed" in text and "ordered, latest wins" in text

    run_cli("destination", "add", "pub", "--url", "https://p.example/", "--burst", "2", env=cli_env)
    assert _listed(cli_env)["pub"]["event_types"] == ["rights.*", "transcode.completed"]
    run_cli(
        "destination", "add", "pub", "--url", "https://p.example/", "--event-type", "a.b",
        "--ordering", "none", env=cli_env,
    )  # fmt: skip
    pub = _listed(cli_env)["pub"]
    assert (pub["event_types"], pub["ordering"], pub["coalescing"]) == (["a.b"], "none", "asset")
    run_cli(
        "destination", "add", "pub", "--url", "https://p.example/", "--event-type", "*", env=cli_env
    )
    assert _listed(cli_env)["pub"]["event_types"] == []
    assert "every type" in run_cli("destination", "list", env=cli_env).stdout
