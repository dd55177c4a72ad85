"""A real RabbitMQ broker, queues of each test's own, and Celery workers each test starts.

The broker is ``MEDIA_HOOKS_TEST_BROKER_URL`` (default: RabbitMQ on 127.0.0.1:5672, guest). When
it does not answer, the session starts RabbitMQ (``rabbitmq-server -detached``) and stops it at
its end; only when that fails too are these tests skipped, saying why. Workers are
``media-hooks worker`` processes, each in a process group of its own with its own home folder
(``LocalWorkers``), ended after the test whatever happened.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("dagster_celery", reason="needs the celery extra: pip install -e '.[celery]'")

from kombu import Connection  # noqa: E402 - only with the extra

from media_hooks.devtools.celery_workers import LocalWorkers, delete_queues  # noqa: E402
from media_hooks.orchestration.celery.settings import CelerySettings, shown  # noqa: E402

BROKER_URL = os.environ.get("MEDIA_HOOKS_TEST_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
BROKER_START_SECONDS = 60.0


def _unreachable(url: str) -> str | None:
    """Why the broker does not answer; None when it does."""
    try:
        with Connection(url, connect_timeout=3) as connection:
            connection.ensure_connection(max_retries=1, timeout=3)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _start_rabbitmq() -> str | None:
    """Starts RabbitMQ here; why it could not be started, or None."""
    if shutil.which("rabbitmq-server") is None:
        return "rabbitmq-server is not installed"
    started = subprocess.run(
        ["rabbitmq-server", "-detached"], capture_output=True, text=True, timeout=60
    )
    if started.returncode != 0:
        return f"rabbitmq-server -detached: {started.stderr.strip()[:200]}"
    return None


@pytest.fixture(scope="session")
def broker_url() -> Iterator[str]:
    why = _unreachable(BROKER_URL)
    started_here = False
    if why is not None:
        failed = _start_rabbitmq()
        if failed is not None:
            pytest.skip(f"no broker at {shown(BROKER_URL)} ({why}), and {failed}")
        started_here = True
        deadline = time.monotonic() + BROKER_START_SECONDS
        while (why := _unreachable(BROKER_URL)) is not None:
            if time.monotonic() > deadline:
                pytest.skip(f"RabbitMQ started here still refuses {shown(BROKER_URL)}: {why}")
            time.sleep(1)  # a server starting: there is no event to wait on
    yield BROKER_URL
    if started_here:
        subprocess.run(["rabbitmqctl", "stop"], capture_output=True, timeout=120)


@pytest.fixture
def queue_prefix(broker_url: str) -> Iterator[str]:
    """Queues of this test's own: nothing another test (or a session elsewhere on the same
    broker) sent is taken here. Deleted afterwards."""
    prefix = f"mh_test_{uuid.uuid4().hex[:10]}"
    yield prefix
    delete_queues(CelerySettings(broker_url, prefix))


@pytest.fixture
def celery_env(cli_env, own_storage_url, broker_url, queue_prefix) -> dict[str, str]:
    """The environment of every process of the test's Celery deployment: the command line,
    each worker (which adds its own home folder)."""
    return dict(
        cli_env,
        MEDIA_HOOKS_DAGSTER_STORAGE_URL=own_storage_url,
        MEDIA_HOOKS_CELERY_BROKER_URL=broker_url,
        MEDIA_HOOKS_CELERY_QUEUE=queue_prefix,
    )


@pytest.fixture
def workers(tmp_path: Path, celery_env: dict[str, str]) -> Iterator[LocalWorkers]:
    with LocalWorkers(tmp_path / "workers", celery_env) as started:
        yield started
