"""``media-hooks emit`` single and ``--file`` bulk, as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from media_hooks_tests.conftest import run_cli


@pytest.fixture
def env(cli_env, database_url) -> dict[str, str]:
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "INSERT INTO webhook_destination (destination_id, url) "
            "VALUES ('pub', 'https://p.example/')"
        )
    return cli_env


def _count(url: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT count(*) FROM webhook_delivery").fetchone()[0]


def _line(n: int, **changes) -> str:
    event = {
        "destination_id": "pub",
        "asset_id": f"asset-{n}",
        "event_type": "transcode.completed",
        "payload": {"n": n},
    }
    return json.dumps({**event, **changes})


def _file(tmp_path: Path, lines: list[str], name: str = "events.jsonl") -> str:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def _assert_one_clear_line(done, *, contains: str) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("media-hooks: "), done.stderr
    assert contains in lines[0]
    assert "Traceback" not in done.stderr


SINGLE = ["--destination", "pub", "--asset-id", "a1", "--event-type", "transcode.completed"]


def test_emit_twice_records_once(env, database_url):
    first = run_cli("emit", *SINGLE, "--payload", '{"b": 1, "a": 2}', env=env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("recorded evt_")
    delivery_id = first.stdout.split()[1]

    again = run_cli("emit", *SINGLE, "--payload", '{"a": 2, "b": 1}', "--json", env=env)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {"delivery_id": delivery_id, "inserted": False}
    assert _count(database_url) == 1

    given = run_cli("emit", *SINGLE, "--payload", "{}", "--delivery-id", "k:1", "--json", env=env)
    assert json.loads(given.stdout) == {"delivery_id": "k:1", "inserted": True}
    given_again = run_cli("emit", *SINGLE, "--payload", "{}", "--delivery-id", "k:1", env=env)
    assert given_again.stdout.strip() == "already present k:1 (nothing recorded)"
    assert _count(database_url) == 2


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--payload", "{not json"], "--payload is not valid JSON"),
        (["--payload", "[1, 2]"], "payload must be a JSON object"),
        (["--payload", "{}", "--delivery-id", "a.b"], "delivery_id"),
    ],
)
def test_single_emit_bad_input(env, database_url, args, problem):
    _assert_one_clear_line(run_cli("emit", *SINGLE, *args, env=env), contains=problem)
    assert _count(database_url) == 0


def test_single_emit_needs_every_field_and_a_known_destination(env, database_url):
    missing = run_cli("emit", "--destination", "pub", "--payload", "{}", env=env)
    _assert_one_clear_line(missing, contains="--asset-id, --event-type")
    unknown = run_cli(
        "emit", "--destination", "nope", "--asset-id", "a", "--event-type", "t",
        "--payload", "{}", env=env,
    )  # fmt: skip
    _assert_one_clear_line(unknown, contains="unknown destination 'nope'")
    assert _count(database_url) == 0


def test_bulk_file_counts_inserted_and_already_present(env, database_url, tmp_path):
    path = _file(tmp_path, [_line(1), _line(2), _line(2), _line(3, delivery_id="k3"), ""])
    done = run_cli("emit", "--file", path, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "inserted 3, already present 0"

    again = run_cli("emit", "--file", path, "--json", env=env)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {"inserted": 0, "already_present": 3}
    assert _count(database_url) == 3


BIG_PAYLOAD = {"blob": "x" * (1024 * 1024)}


@pytest.mark.parametrize(
    ("bad_line", "problem"),
    [
        ('{"destination_id": "pub", ', "line 3: not valid JSON"),
        (json.dumps({"destination_id": "pub", "asset_id": "a", "payload": {}}), "line 3: missing field 'event_type'"),
        (_line(3, payload=[1, 2]), "line 3: payload must be a JSON object"),
        (_line(3, payload="text"), "line 3: payload must be a JSON object"),
        (_line(3, delivery_id="has.dot"), "line 3: delivery_id"),
        (_line(3, destination_id="bad id"), "line 3: destination_id"),
        (_line(3, payload=BIG_PAYLOAD), "line 3: payload is 1048587 bytes"),
        (_line(3, destination_id="nope"), "line 3: unknown destination 'nope'"),
        ("[1, 2, 3]", "line 3: expected a JSON object, got an array"),
    ],
)  # fmt: skip
def test_bulk_is_all_or_nothing(env, database_url, tmp_path, bad_line, problem):
    run_cli("emit", *SINGLE, "--payload", "{}", env=env)
    before = _count(database_url)
    path = _file(tmp_path, [_line(1), _line(2), bad_line, _line(4), _line(5)])
    done = run_cli("emit", "--file", path, env=env)
    _assert_one_clear_line(done, contains=problem)
    assert done.stdout == ""
    assert _count(database_url) == before


def test_bulk_usage_errors(env, tmp_path):
    path = _file(tmp_path, [_line(1)])
    mixed = run_cli("emit", "--file", path, "--destination", "pub", env=env)
    _assert_one_clear_line(mixed, contains="drop --destination")
    missing = run_cli("emit", "--file", str(tmp_path / "absent.jsonl"), env=env)
    _assert_one_clear_line(missing, contains="cannot read")
