"""``media-hooks emit`` single and ``--file`` bulk, as a user runs them."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from media_hooks_tests.conftest import REPO, run_cli
from media_hooks_tests.fingerprints import content_fingerprint

# The command line itself (parsing, output, exit codes) runs in CI's first pass only: emit's
# statements, bulk COPY included, are tested on both servers by test_emit.py.
pytestmark = pytest.mark.one_server


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
        return conn.execute("SELECT count(*) FROM webhook_delivery_all").fetchone()[0]


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
NO_EVENTS = {
    "events_recorded": 0,
    "events_already_present": 0,
    "events_unmatched": 0,
    "unmatched_sample": [],
}


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
    assert json.loads(again.stdout) == {"inserted": 0, "already_present": 3, **NO_EVENTS}
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


DEEP = "[" * 2000 + "]" * 2000
LONG_NUMBER = "9" * 5000


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        ('{"n": ' + LONG_NUMBER + "}", "a number has more than 4300 digits"),
        ('{"deep": ' + DEEP + "}", "nested too deeply"),
        ('{"deep": ' + "[" * 200 + "]" * 200 + "}", "payload is nested more than 128 levels"),
    ],
)
def test_hostile_payloads_are_refused_cleanly_both_ways(
    env, database_url, tmp_path, payload, problem
):
    single = run_cli("emit", *SINGLE, "--payload", payload, env=env)
    _assert_one_clear_line(single, contains=problem)
    line = (
        '{"destination_id": "pub", "asset_id": "a", "event_type": "t", "payload": ' + payload + "}"
    )
    bulk = run_cli("emit", "--file", _file(tmp_path, [_line(1), line]), env=env)
    _assert_one_clear_line(bulk, contains="line 2: ")
    assert problem in bulk.stderr
    assert _count(database_url) == 0


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"asset_id": "a" * 10_000_000}, "line 2 is longer than 8388608 bytes"),
        ({"asset_id": "a" * 2_000_000}, "line 2: asset_id is 2000000 characters long"),
        ({"event_type": "t" * 5_000_000}, "line 2: event_type is 5000000 characters long"),
    ],
)
def test_overlong_fields_in_a_file_are_refused(env, database_url, tmp_path, changes, problem):
    done = run_cli("emit", "--file", _file(tmp_path, [_line(1), _line(2, **changes)]), env=env)
    _assert_one_clear_line(done, contains=problem)
    assert _count(database_url) == 0


def test_a_conflicting_duplicate_in_a_file_names_both_lines(env, database_url, tmp_path):
    lines = [
        _line(1, delivery_id="k"),
        _line(2),
        _line(3, delivery_id="k"),
        _line(1, delivery_id="k"),
    ]
    done = run_cli("emit", "--file", _file(tmp_path, lines), env=env)
    _assert_one_clear_line(
        done, contains="line 3: delivery_id 'k' is already used by line 1 for a different event"
    )
    assert _count(database_url) == 0
    identical = [_line(1, delivery_id="k"), _line(2), _line(1, delivery_id="k")]
    again = run_cli("emit", "--file", _file(tmp_path, identical, "ok.jsonl"), "--json", env=env)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {"inserted": 2, "already_present": 0, **NO_EVENTS}


def _run_measured(args: list[str], env: dict[str, str], tmp_path: Path) -> tuple[int, str, int]:
    """Run media-hooks; its exit status, stderr and peak memory (KiB). Address space is capped
    at 2 GiB, so a regression fails the test instead of exhausting the machine."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 * 1024**3, 2 * 1024**3))

    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "media_hooks.cli", *args],
            env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=err, preexec_fn=cap,
        )  # fmt: skip
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, err_path.read_text(), usage.ru_maxrss


def test_emit_file_dev_zero_is_refused_in_bounded_memory(env, database_url, tmp_path):
    status, stderr, peak_kib = _run_measured(["emit", "--file", "/dev/zero"], env, tmp_path)
    assert status == 2, stderr
    assert stderr.strip() == (
        "media-hooks: line 1 is longer than 8388608 bytes, the most one event's line may have"
    )
    assert peak_kib < 300 * 1024, f"peak memory {peak_kib // 1024} MiB"
    assert _count(database_url) == 0


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "is empty: no events to record"),
        (b"\n  \n\n", "has only blank lines: no events to record"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe", "line 1: not UTF-8 text"),
        (b"\x00\x01\x02\n", "line 1: not valid JSON"),
    ],
)
def test_empty_and_binary_files_are_refused(env, database_url, tmp_path, content, problem):
    path = tmp_path / "events.jsonl"
    path.write_bytes(content)
    _assert_one_clear_line(run_cli("emit", "--file", str(path), env=env), contains=problem)
    assert _count(database_url) == 0


def test_a_connection_killed_mid_copy_is_one_line_and_exit_1(env, database_url, tmp_path):
    path = tmp_path / "big.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for n in range(300_000):
            f.write(_line(n) + "\n")
    with psycopg.connect(database_url, autocommit=True) as watcher:
        before = content_fingerprint(watcher)
        proc = subprocess.Popen(
            [sys.executable, "-m", "media_hooks.cli", "emit", "--file", str(path)],
            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            copying = None
            while copying is None and time.monotonic() < deadline and proc.poll() is None:
                copying = watcher.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid() "
                    "AND query LIKE '%%COPY media_hooks_emit_staging%%' AND state = 'active'"
                ).fetchone()
                time.sleep(0.01)
            assert copying is not None, "the COPY was never seen running"
            watcher.execute("SELECT pg_terminate_backend(%s)", copying)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 1, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in err, err
        assert lines[0].startswith("media-hooks: the database connection failed while recording")
        assert "run the same command again" in lines[0]
        assert out == ""
        assert content_fingerprint(watcher) == before


def test_emit_an_event_without_a_destination_fans_out_and_says_when_nothing_matched(env):
    """Issue 14: --event-id instead of --destination; exit 0 and "matched no destination" for
    an event no subscription matches (a typo shows)."""
    added = run_cli(
        "destination", "add", "pub", "--url", "https://p.example/", "--event-type", "rights.*",
        env=env,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    event = ["--asset-id", "a1", "--payload", '{"revision": 1}']
    typo = run_cli("emit", "--event-id", "e0", "--event-type", "right.updated", *event, env=env)
    assert typo.returncode == 0, typo.stderr
    assert "matched no destination" in typo.stdout

    done = run_cli(
        "emit", "--event-id", "e1", "--event-type", "rights.updated", *event, "--json", env=env
    )
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert (document["recorded"], document["destinations"], document["inserted"]) == (
        True,
        ["pub"],
        1,
    )
    again = run_cli("emit", "--event-id", "e1", "--event-type", "rights.updated", *event, env=env)
    assert again.stdout.strip() == "already present event e1 (nothing recorded)"
    inspected = run_cli("inspect", "e1", env=env)
    assert inspected.returncode == 0, inspected.stderr
    assert "event e1: rights.updated for asset a1" in inspected.stdout
    assert "due now, waiting for a run" in inspected.stdout
    by_type = run_cli("status", "--by", "event-type", env=env)
    assert by_type.returncode == 0, by_type.stderr
    assert "rights.updated" in by_type.stdout and "event type" in by_type.stdout
