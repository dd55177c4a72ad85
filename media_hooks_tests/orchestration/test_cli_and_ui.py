"""`media-hooks run` as a user runs it, and the real UI path: `media-hooks dev`, GraphQL,
a launched run, deliveries arriving."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import requests

from media_hooks_tests.conftest import REPO, run_cli
from media_hooks_tests.factories import add_deliveries, add_destination

LOCATION = {"repositoryLocationName": "media_hooks", "repositoryName": "__repository__"}


@pytest.fixture
def env(cli_env, dagster_storage_url):
    return dict(cli_env, MEDIA_HOOKS_DAGSTER_STORAGE_URL=dagster_storage_url)


def test_run_until_idle_prints_each_run_as_json(env, conn, receiver):
    add_destination(conn, "alpha", receiver.url + "alpha")
    add_destination(conn, "beta", receiver.url + "beta")
    add_deliveries(conn, "alpha", 4)
    add_deliveries(conn, "beta", 2)

    done = run_cli("run", "--until-idle", "--max-rows", "4", "--json", env=env, timeout=180)

    assert done.returncode == 0, done.stderr
    runs = json.loads(done.stdout)["runs"]
    assert [r["claimed"] for r in runs] == [4, 2]
    assert sum(r["succeeded"] for r in runs) == 6
    for r in runs:
        assert set(r) == {
            "run_id",
            "claimed",
            "succeeded",
            "retried",
            "dead",
            "ambiguous",
            "destinations",
        }
        assert sum(d["succeeded"] for d in r["destinations"].values()) == r["succeeded"]
    assert receiver.effects == 6
    run_ids = {r["run_id"] for r in conn.execute("SELECT DISTINCT run_id FROM dispatch_outbox")}
    assert run_ids == {r["run_id"] for r in runs}


def test_run_refuses_bad_numbers_in_one_line(env):
    done = run_cli("run", "--page-size", "0", env=env)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "media-hooks: argument --page-size: must be a whole number at least 1 and at most 10000, "
        "got '0' (see `media-hooks run --help`)"
    )
    for option, value in [("--max-seconds", "nan"), ("--max-seconds", "inf"), ("--max-rows", "-3")]:
        refused = run_cli("run", "--until-idle", option, value, env=env)
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.count("\n") == 1 and f"argument {option}: must be" in refused.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _graphql(url: str, query: str, variables: dict | None = None) -> dict:
    response = requests.post(
        f"{url}/graphql", json={"query": query, "variables": variables or {}}, timeout=30
    )
    response.raise_for_status()
    document = response.json()
    assert "errors" not in document, document
    return document["data"]


def _wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.5)  # polling another process's state: nothing to wait on but its answers
    pytest.fail(f"timed out waiting for {what}")


def _serving(url: str) -> bool:
    try:
        return requests.get(f"{url}/server_info", timeout=2).ok
    except requests.RequestException:
        return False


WORKSPACE_QUERY = """
{ workspaceOrError { __typename ... on Workspace { locationEntries { name
    locationOrLoadError { __typename ... on PythonError { message } } } } } }
"""
REPOSITORY_QUERY = """
query ($selector: RepositorySelector!) { repositoryOrError(repositorySelector: $selector) {
  __typename ... on Repository { jobs { name }
    schedules { name scheduleState { status } } sensors { name sensorState { status } } } } }
"""
LAUNCH = """
mutation ($params: ExecutionParams!) { launchRun(executionParams: $params) { __typename
  ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
  ... on RunConfigValidationInvalid { errors { message } } } }
"""
RUN_STATUS = "query ($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }"


def test_dagster_ui_loads_everything_and_launches_a_delivery_run(env, conn, receiver):
    add_destination(conn, "alpha", receiver.url + "alpha")
    add_destination(conn, "beta:2", receiver.url + "beta")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    dev = subprocess.Popen(
        [sys.executable, "-m", "media_hooks.cli", "dev", "--port", str(port)],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        _wait_for(lambda: _serving(url), 120, "the Dagster UI")
        entries = _graphql(url, WORKSPACE_QUERY)["workspaceOrError"]["locationEntries"]
        assert [e["locationOrLoadError"]["__typename"] for e in entries] == ["RepositoryLocation"]
        repo = _graphql(url, REPOSITORY_QUERY, {"selector": LOCATION})["repositoryOrError"]
        assert {j["name"] for j in repo["jobs"]} >= {
            "deliver_webhooks",
            "requeue_cohort",
            "retention",
        }
        assert {s["name"]: s["scheduleState"]["status"] for s in repo["schedules"]} == {
            "nightly_delivery": "RUNNING",
            "daily_retention": "RUNNING",
        }
        assert {s["name"] for s in repo["sensors"]} == {
            "delivery_lag_sensor",
            "delivery_run_failure_sensor",
        }

        params = {
            "selector": {**LOCATION, "jobName": "deliver_webhooks"},
            "runConfigData": {"ops": {"claim_due_pages": {"config": {"page_size": 5}}}},
        }
        launched = _graphql(url, LAUNCH, {"params": params})["launchRun"]
        assert launched["__typename"] == "LaunchRunSuccess", launched
        run_id = launched["run"]["runId"]
        # Recorded once our run is queued: the lag sensor sees it in flight and starts no other.
        add_deliveries(conn, "alpha", 5)
        add_deliveries(conn, "beta:2", 5)
        status = _wait_for(
            lambda: (
                _graphql(url, RUN_STATUS, {"id": run_id})["runOrError"]["status"]
                in ("SUCCESS", "FAILURE", "CANCELED")
                and _graphql(url, RUN_STATUS, {"id": run_id})["runOrError"]["status"]
            ),
            150,
            "the launched run to finish",
        )
        assert status == "SUCCESS"
        assert receiver.wait_for(lambda r: r.effects == 10, timeout=10)
        sent = conn.execute(
            "SELECT count(*) AS n FROM dispatch_outbox WHERE run_id = %s", (run_id,)
        ).fetchone()["n"]
        assert sent == 10
    finally:
        os.killpg(dev.pid, signal.SIGINT)
        try:
            output, _ = dev.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(dev.pid, signal.SIGKILL)
            output, _ = dev.communicate()
    assert f"Dagster UI: {url}" in output
    # Dagster's own advice to use another command is not ours to pass on (dev_commands.py).
    assert "SupersessionWarning" not in output
    # The effective SSRF setting, so whoever starts it sees what every send is held to.
    assert "SSRF guard: off (MEDIA_HOOKS_ALLOW_PRIVATE_URLS=1)" in output
