"""`media-hooks run` as a user runs it, and the real UI path: `media-hooks dev`, GraphQL,
a run launched from the Launchpad's default config, deliveries arriving, the lag sensor's page,
and Ctrl-C while runs are in progress."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time

import pytest
import requests
import yaml

from media_hooks.devtools.receiver import Receiver, Reply
from media_hooks.orchestration.outbox_asset import SPECS
from media_hooks_tests.conftest import run_cli, start_cli
from media_hooks_tests.factories import add_deliveries, add_destination, states

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


def test_a_run_that_disables_a_local_destination_does_not_end_quietly(env, conn):
    """Issue 35: a first webhook to a receiver on this machine, the guard on. The run sends
    nothing and says why, in its lines and its JSON."""
    guarded = {k: v for k, v in env.items() if k != "MEDIA_HOOKS_ALLOW_PRIVATE_URLS"}
    add_destination(conn, "mine", "http://127.0.0.1:9/hook", max_in_flight=1)
    add_deliveries(conn, "mine", 2)

    done = run_cli("run", env=guarded, timeout=180)

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == (
        "attention: destination mine disabled by the SSRF guard, 2 delivery(ies) waiting "
        "(`media-hooks destination list`)"
    )
    again = json.loads(run_cli("run", "--json", env=guarded, timeout=180).stdout)
    assert again["attention"] == [
        "destination mine disabled by the SSRF guard, 2 delivery(ies) waiting"
    ]
    assert [r["claimed"] for r in again["runs"]] == [0]


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
RUN_TAGS = "query ($id: ID!) { runOrError(runId: $id) { ... on Run { tags { key value } } } }"
PRESETS = """
query ($selector: PipelineSelector!) { pipelineOrError(params: $selector) {
  __typename ... on Pipeline { presets { name runConfigYaml } } } }
"""
SENSOR_TICKS = """
query ($selector: SensorSelector!) { sensorOrError(sensorSelector: $selector) {
  __typename ... on Sensor { sensorState { ticks(limit: 5) { status skipReason cursor } } } } }
"""
RUNS = """
query ($filter: RunsFilter) { runsOrError(filter: $filter) {
  ... on Runs { results { runId status } } } }
"""
FINISHED = ("SUCCESS", "FAILURE", "CANCELED")
TERMINATE = """
mutation ($id: String!) { terminateRun(runId: $id) { __typename
  ... on TerminateRunFailure { message } ... on PythonError { message } } }
"""
OUTBOX_NODE = """
{ assetNodeOrError(assetKey: {path: ["media_hooks", "outbox"]}) { __typename
  ... on AssetNode { assetChecksOrError { ... on AssetChecks { checks { name
      canExecuteIndividually } } } } } }
"""


def _status(url: str, run_id: str) -> str:
    return _graphql(url, RUN_STATUS, {"id": run_id})["runOrError"]["status"]


def _launch(url: str, run_config: dict) -> str:
    params = {"selector": {**LOCATION, "jobName": "deliver_webhooks"}, "runConfigData": run_config}
    launched = _graphql(url, LAUNCH, {"params": params})["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    return launched["run"]["runId"]


def _launchpad_config(url: str) -> dict:
    """What the Launchpad opens on for deliver_webhooks: the job's default preset."""
    selector = {**LOCATION, "pipelineName": "deliver_webhooks"}
    job = _graphql(url, PRESETS, {"selector": selector})["pipelineOrError"]
    (preset,) = job["presets"]
    return yaml.safe_load(preset["runConfigYaml"])


@pytest.mark.one_server
def test_dagster_ui_loads_everything_and_launches_a_delivery_run(env, conn, receiver, instance):
    add_destination(conn, "alpha", receiver.url + "alpha")
    add_destination(conn, "beta:2", receiver.url + "beta")
    # The instance is the session's: runs of earlier tests (some fail on purpose) are not ours.
    earlier = {r.run_id for r in instance.get_runs()}
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    dev = start_cli("dev", "--port", str(port), env=env, own_session=True, stderr=subprocess.STDOUT)
    held = Receiver(script=lambda info: Reply(delay_seconds=120)).start()
    halting = Receiver(script=lambda info: Reply(delay_seconds=120)).start()
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
            "outbox_checks_sensor",
        }
        # No dialog over the first page a browser opens.
        assert _graphql(url, "{ shouldShowNux }")["shouldShowNux"] is False
        # The outbox in the catalog, each of its checks executable on its own from its page.
        node = _graphql(url, OUTBOX_NODE)["assetNodeOrError"]
        checks = node["assetChecksOrError"]["checks"]
        assert sorted(c["name"] for c in checks) == sorted(spec.name for spec in SPECS)
        assert {c["canExecuteIndividually"] for c in checks} == {"CAN_EXECUTE"}

        # The Launchpad opens on every cohort field; a user edits it and launches.
        config = _launchpad_config(url)
        cohort = config["ops"]["prepare"]["config"]
        assert cohort == {
            "destination_ids": [],
            "event_types": [],
            "asset_ids": [],
            "created_after": None,
            "created_before": None,
            "include_dead": False,
            "requeue_reason": "",
            "page_size": None,
            "max_rows": None,
            "shards": None,
            "runtime": None,
        }
        cohort.update(destination_ids=["alpha"], page_size=2)
        run_id = _launch(url, config)
        # Recorded once our run is queued: the lag sensor sees it in flight and starts no other.
        add_deliveries(conn, "alpha", 5)
        add_deliveries(conn, "beta:2", 5)
        _wait_for(lambda: _status(url, run_id) in FINISHED, 150, "the launched run to finish")
        assert _status(url, run_id) == "SUCCESS"
        assert receiver.wait_for(lambda r: r.effects >= 5, timeout=10)
        sent = conn.execute(
            "SELECT destination_id, count(*) AS n FROM dispatch_outbox WHERE run_id = %s "
            "GROUP BY 1",
            (run_id,),
        ).fetchall()
        assert [(r["destination_id"], r["n"]) for r in sent] == [("alpha", 5)]
        tags = {
            t["key"]: t["value"]
            for t in _graphql(url, RUN_TAGS, {"id": run_id})["runOrError"]["tags"]
        }
        assert tags["media_hooks/outcome"] == "all-delivered"
        assert tags["media_hooks/delivered"] == "5"
        assert tags["media_hooks/cohort.destination_ids"] == "alpha"
        # Its worker, recorded for the recovery passes, is the process Dagster's own launcher
        # started for it.
        worker = json.loads(tags["media_hooks/worker"])
        assert (worker["run_id"], worker["host"]) == (run_id, socket.gethostname())
        assert worker["pid"] not in (os.getpid(), dev.pid)

        # The lag sensor's page: each tick's cursor leads with its health line.
        selector = {**LOCATION, "sensorName": "delivery_lag_sensor"}

        def health_lines():
            sensor = _graphql(url, SENSOR_TICKS, {"selector": selector})["sensorOrError"]
            ticks = sensor["sensorState"]["ticks"]
            return [json.loads(t["cursor"])["health"] for t in ticks if t["cursor"]]

        lines = _wait_for(health_lines, 90, "a lag sensor tick")
        assert any("pending" in line and "relay lag" in line for line in lines), lines

        # Terminate from the UI while a delivery run is sending (its receiver holds every
        # request until the sender's timeout): the run ends CANCELED.
        add_destination(conn, "halted", halting.url, timeout_seconds=15)
        add_deliveries(conn, "halted", 2)
        terminated = _launch(url, {"ops": {"prepare": {"config": {"destination_ids": ["halted"]}}}})
        assert halting.wait_for(lambda r: r.max_in_flight >= 1, timeout=120)
        done = _graphql(url, TERMINATE, {"id": terminated})["terminateRun"]
        assert done["__typename"] == "TerminateRunSuccess", done
        _wait_for(lambda: _status(url, terminated) in FINISHED, 120, "the terminated run to end")
        assert _status(url, terminated) == "CANCELED"

        # Ctrl-C on `media-hooks dev` while a delivery run is sending (the same kind of
        # receiver).
        add_destination(conn, "held", held.url, timeout_seconds=15)
        add_deliveries(conn, "held", 2)
        _launch(url, {"ops": {"prepare": {"config": {"destination_ids": ["held"]}}}})
        assert held.wait_for(lambda r: r.max_in_flight >= 1, timeout=120)
        last = _launch(url, {"ops": {"prepare": {"config": {"destination_ids": ["held"]}}}})
        runs = _graphql(url, RUNS, {"filter": {"pipelineName": "deliver_webhooks"}})
        ours = [r["runId"] for r in runs["runsOrError"]["results"] if r["runId"] not in earlier]
        assert last in ours
    finally:
        os.killpg(dev.pid, signal.SIGINT)
        try:
            output, _ = dev.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(dev.pid, signal.SIGKILL)
            output, _ = dev.communicate()
        held.stop()
        halting.stop()
    assert dev.returncode == 0, output[-3000:]
    assert f"Dagster UI: {url}" in output
    assert "Traceback" not in output, output[-5000:]
    assert "stopping Dagster: canceled run" in output
    # No run was left failed (to start, or mid-step), and no row is left claimed by one.
    assert states(conn).keys() <= {"succeeded", "pending"}, states(conn)
    statuses = {run_id: instance.get_run_by_id(run_id).status.value for run_id in ours}
    assert "FAILURE" not in statuses.values(), statuses
    assert "CANCELED" in statuses.values(), statuses
    # Dagster's own advice to use another command is not ours to pass on (dev_commands.py).
    assert "SupersessionWarning" not in output
    # The effective SSRF setting, so whoever starts it sees what every send is held to.
    assert "SSRF guard: off (MEDIA_HOOKS_ALLOW_PRIVATE_URLS=1)" in output
