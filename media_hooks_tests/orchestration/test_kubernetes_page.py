"""docs/deployment/kubernetes.md cannot rot (issue 31, item 4): its instance and its run config
are Dagster's and dagster-k8s's real configuration, checked with dagster-k8s installed (the
``k8s`` extra).

Outside a cluster there is no in-cluster configuration to load, so where dagster-k8s loads one
(the run launcher, the step executor) the checks give it a kubeconfig of a cluster that is never
contacted; and the instance's storage is pointed at the test's PostgreSQL server.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance, InitExecutorContext, reconstructable, validate_run_config
from dagster._core.instance.config import dagster_instance_config
from dagster._core.launcher import RunLauncher
from dagster._serdes import ConfigurableClassData
from psycopg import conninfo

from media_hooks.orchestration import executors
from media_hooks.orchestration.definitions import deliver_webhooks_job
from media_hooks.orchestration.jobs import delivery_executor
from media_hooks_tests.conftest import REPO

dagster_k8s = pytest.importorskip(
    "dagster_k8s", reason="needs the k8s extra: pip install -e '.[k8s]'"
)

PAGE = REPO / "docs" / "deployment" / "kubernetes.md"
STORAGES = ("run_storage", "event_log_storage", "schedule_storage")
KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
  - name: never-contacted
    cluster:
      server: https://127.0.0.1:9
contexts:
  - name: never-contacted
    context:
      cluster: never-contacted
      user: nobody
current-context: never-contacted
users:
  - name: nobody
    user:
      token: not-a-token
"""


def _blocks() -> dict[str, dict]:
    """The page's checked YAML blocks, by the name in their ``<!-- checked: NAME -->`` line."""
    pattern = re.compile(r"<!-- checked: ([a-z-]+) -->\n```yaml\n(.*?)```", re.DOTALL)
    return {name: yaml.safe_load(text) for name, text in pattern.findall(PAGE.read_text())}


@pytest.fixture
def kubeconfig(tmp_path: Path) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    return str(path)


def _outside_a_cluster(config: dict, kubeconfig: str) -> dict:
    return {**config, "load_incluster_config": False, "kubeconfig_file": kubeconfig}


def test_the_page_has_its_three_checked_blocks():
    assert set(_blocks()) == {"values", "instance", "run-config"}


def test_the_instance_is_valid_and_its_launcher_is_k8s(tmp_path, kubeconfig):
    instance = _blocks()["instance"]
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(instance))
    dagster_instance_config(str(tmp_path))  # raises on a key or a type Dagster does not take

    declared = instance["run_launcher"]
    launcher = ConfigurableClassData(
        declared["module"],
        declared["class"],
        yaml.safe_dump(_outside_a_cluster(declared["config"], kubeconfig)),
    ).rehydrate(as_type=RunLauncher)

    assert isinstance(launcher, dagster_k8s.K8sRunLauncher)
    assert launcher.job_namespace == "media-hooks"
    assert launcher.supports_check_run_worker_health  # run monitoring can judge its pods
    assert instance["run_monitoring"]["enabled"] is True


def test_the_instance_loads_on_postgresql(tmp_path, kubeconfig, empty_database_url, monkeypatch):
    instance = _blocks()["instance"]
    server = conninfo.conninfo_to_dict(empty_database_url)
    host = server.get("host") or "localhost"
    for key in STORAGES:
        database = instance[key]["config"]["postgres_db"]
        assert database["password"] == {"env": "DAGSTER_PG_PASSWORD"}  # never in the file
        database.update(
            hostname="localhost" if host.startswith("/") else host,
            port=int(server.get("port") or 5432),
            username=server.get("user") or "postgres",
            db_name=server["dbname"],
        )
        if host.startswith("/"):  # the embedded test server listens on a socket folder
            database["params"] = {"host": host}
    monkeypatch.setenv("DAGSTER_PG_PASSWORD", server.get("password") or "")
    launcher = instance["run_launcher"]
    launcher["config"] = _outside_a_cluster(launcher["config"], kubeconfig)
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(instance))

    with DagsterInstance.from_config(str(tmp_path)) as loaded:
        assert isinstance(loaded.run_launcher, dagster_k8s.K8sRunLauncher)
        assert loaded.get_runs() == []  # its storage answered, its tables created


def test_the_values_say_what_the_instance_says():
    blocks = _blocks()
    values, instance = blocks["values"], blocks["instance"]
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    env = {e["name"]: e["value"] for e in deployment["env"]}
    assert env == {"MEDIA_HOOKS_EXECUTOR": "k8s", "MEDIA_HOOKS_SHARDS": "8"}
    assert deployment["dagsterApiGrpcArgs"][-1] == "media_hooks.orchestration.definitions"
    launcher = values["runLauncher"]["config"]["k8sRunLauncher"]
    assert launcher["jobNamespace"] == instance["run_launcher"]["config"]["job_namespace"]
    assert [s["name"] for s in launcher["envSecrets"]] == instance["run_launcher"]["config"][
        "env_secrets"
    ]
    database = instance["run_storage"]["config"]["postgres_db"]
    assert values["postgresql"]["postgresqlDatabase"] == database["db_name"]
    assert values["postgresql"]["postgresqlHost"] == database["hostname"]


def test_the_run_config_selects_the_k8s_executor_of_the_delivery_job(kubeconfig):
    run_config = _blocks()["run-config"]
    job = deliver_webhooks_job()
    validate_run_config(job, run_config)  # raises on a key or a type the job does not take

    # The executor it chooses, built as a run pod builds it (outside a cluster here).
    chosen = run_config["execution"]["config"]["k8s"]
    outside = {"execution": {"config": {"k8s": _outside_a_cluster(chosen, kubeconfig)}}}
    processed = validate_run_config(job, {**run_config, **outside})
    executor = executors.create(
        InitExecutorContext(
            job=reconstructable(deliver_webhooks_job),
            executor_def=delivery_executor,
            executor_config=processed["execution"][delivery_executor.name],
            instance=DagsterInstance.ephemeral(),
        )
    )

    from dagster._core.executor.step_delegating import StepDelegatingExecutor

    assert isinstance(executor, StepDelegatingExecutor)
    assert executor._max_concurrent == 8  # noqa: SLF001 - what the page promises
    assert run_config["ops"]["prepare"]["config"]["shards"] == 8


def test_k8s_is_a_choice_of_the_environment(monkeypatch):
    monkeypatch.setenv(executors.EXECUTOR_VARIABLE, "k8s")
    assert executors.default_choice() == "k8s"
