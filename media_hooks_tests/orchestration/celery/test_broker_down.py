"""The Celery deployment when the broker is down or nobody serves it, and bad settings
(issue 31): one clear line naming the broker (never its password), no run left STARTED,
nothing claimed; ``media-hooks worker``'s exit statuses."""

from __future__ import annotations

import socket

import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter, reconstructable

from media_hooks.orchestration.definitions import deliver_webhooks_job
from media_hooks.orchestration.instance import CELERY_INSTANCE_TEMPLATE
from media_hooks_tests.conftest import run_cli
from media_hooks_tests.factories import add_deliveries, add_destination, states

PASSWORD = "hunter2-secret"


@pytest.fixture
def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound, then let go)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def down_broker(closed_port: int) -> tuple[str, str]:
    """A broker URL with a password that nothing answers, and how it must be shown."""
    return (
        f"amqp://guest:{PASSWORD}@127.0.0.1:{closed_port}//",
        f"amqp://guest@127.0.0.1:{closed_port}//",
    )


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def test_a_run_with_the_broker_down_fails_at_once_having_claimed_nothing(
    conn, cli_env, own_storage_url, own_instance, down_broker
):
    url, shown = down_broker
    add_destination(conn, "pub", "http://127.0.0.1:9/pub")
    add_deliveries(conn, "pub", 3)
    env = dict(
        cli_env,
        MEDIA_HOOKS_DAGSTER_STORAGE_URL=own_storage_url,
        MEDIA_HOOKS_CELERY_BROKER_URL=url,
    )

    done = run_cli("run", env=env, timeout=120)

    assert done.returncode == 1
    line = _one_line(done.stderr)
    assert f"cannot reach the Celery broker at {shown}" in line
    assert PASSWORD not in done.stderr + done.stdout
    (run,) = own_instance.get_runs(RunsFilter(job_name="deliver_webhooks"))
    assert run.status == DagsterRunStatus.FAILURE
    assert states(conn) == {"pending": 3}
    assert conn.execute("SELECT count(*) AS n FROM dispatch_outbox").fetchone()["n"] == 0


def test_a_run_no_worker_serves_fails_at_once_having_claimed_nothing(
    conn, celery_env, own_instance
):
    add_destination(conn, "pub", "http://127.0.0.1:9/pub")
    add_deliveries(conn, "pub", 3)

    done = run_cli("run", env=celery_env, timeout=120)

    assert done.returncode == 1
    queue = f"{celery_env['MEDIA_HOOKS_CELERY_QUEUE']}_steps"
    assert f"no Celery worker serves the queue {queue}" in _one_line(done.stderr)
    (run,) = own_instance.get_runs(RunsFilter(job_name="deliver_webhooks"))
    assert run.status == DagsterRunStatus.FAILURE
    assert states(conn) == {"pending": 3}


def test_a_launch_with_the_broker_down_fails_the_run_with_one_line(
    tmp_path, own_storage_url, own_instance, down_broker, monkeypatch
):
    url, shown = down_broker
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(CELERY_INSTANCE_TEMPLATE.read_text())
    monkeypatch.setenv("MEDIA_HOOKS_CELERY_BROKER_URL", url)
    monkeypatch.setenv("MEDIA_HOOKS_DAGSTER_STORAGE_URL", own_storage_url)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with DagsterInstance.from_config(str(home)) as instance:
        job = deliver_webhooks_job()
        run = instance.create_run_for_job(
            job_def=job,
            run_config={},
            job_code_origin=reconstructable(deliver_webhooks_job).get_python_origin(),
        )
        with pytest.raises(Exception, match="cannot reach the Celery broker") as raised:
            instance.launch_run(run.run_id, workspace=None)

        assert shown in str(raised.value) and PASSWORD not in str(raised.value)
        assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.FAILURE


def test_a_worker_with_the_broker_down_says_so_and_exits_1(cli_env, down_broker):
    url, shown = down_broker

    done = run_cli("worker", env=dict(cli_env, MEDIA_HOOKS_CELERY_BROKER_URL=url), timeout=120)

    assert done.returncode == 1
    assert _one_line(done.stderr) == (
        f"media-hooks: cannot reach the Celery broker at {shown}: [Errno 111] Connection refused"
    )
    assert PASSWORD not in done.stderr + done.stdout


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"MEDIA_HOOKS_CELERY_BROKER_URL": None},
            "MEDIA_HOOKS_CELERY_BROKER_URL is not set",
        ),
        (
            {"MEDIA_HOOKS_CELERY_BROKER_URL": f"127.0.0.1:5672 guest:{PASSWORD}"},
            "MEDIA_HOOKS_CELERY_BROKER_URL must be a broker URL",
        ),
        (
            {"MEDIA_HOOKS_CELERY_QUEUE": "a queue"},
            "MEDIA_HOOKS_CELERY_QUEUE must be 1-100 letters",
        ),
        (
            {"MEDIA_HOOKS_DATABASE_URL": None},
            "a worker needs MEDIA_HOOKS_DATABASE_URL",
        ),
    ],
)
def test_a_worker_refuses_bad_settings_with_exit_2(cli_env, down_broker, changes, expected):
    env = dict(cli_env, MEDIA_HOOKS_CELERY_BROKER_URL=down_broker[0])
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value

    done = run_cli("worker", env=env, timeout=120)

    assert done.returncode == 2, done.stderr
    assert expected in _one_line(done.stderr)
    assert PASSWORD not in done.stderr + done.stdout
