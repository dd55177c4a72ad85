"""`media-hooks inspect`: the story and verdict as a real process prints them."""

from __future__ import annotations

import json

import pytest

from media_hooks_tests.conftest import run_cli
from media_hooks_tests.operator_data import RUN, prepare


@pytest.fixture
def prepared(conn) -> dict[str, str]:
    return prepare(conn)


def test_inspect_prints_the_story_and_verdict(prepared, cli_env):
    result = run_cli("inspect", prepared["requeued"], env=cli_env)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    order = [
        out.index(word) for word in ("recorded:", "dispatch 1 by run", "attempt 1", "requeued by")
    ]
    assert order == sorted(order)
    assert "verdict: due now, waiting for a run" in out
    assert f"Dagster runs: {RUN}" in out


def test_inspect_json_has_the_verdict_and_runs(prepared, cli_env):
    result = run_cli("inspect", prepared["lease_expired"], "--json", env=cli_env)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["verdict"]["kind"] == "lease_expired"
    assert document["run_ids"] == [RUN]
    (attempt,) = [e for e in document["events"] if e["kind"] == "attempt"]
    assert attempt["finished_at"] is None


def test_inspect_an_unknown_delivery_exits_2_with_one_line(prepared, cli_env):
    result = run_cli("inspect", "no-such-delivery", env=cli_env)
    assert result.returncode == 2
    assert result.stdout == ""
    assert (
        result.stderr == "media-hooks: no delivery 'no-such-delivery' (and no event by that id)\n"
    )
