"""A real Dagster instance on PostgreSQL for the orchestration tests, and a local receiver.

One instance (its own database on the test server) serves the whole session; each test's
deliveries live in the test's own database, handed to the job as resource config, because
the multiprocess executor's forkserver keeps the environment it started with.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import DagsterInstance

from media_hooks.orchestration import instance as instance_module
from media_hooks.orchestration.running import DeliveryRun, execute_delivery
from media_hooks.receiver import Receiver
from media_hooks_tests.conftest import create_database, drop_database, with_database

SPAWN = {"config": {"max_concurrent": 8, "start_method": {"spawn": {}}}}


@pytest.fixture(scope="session")
def dagster_storage_url(server_url: str) -> Iterator[str]:
    name = create_database(server_url)
    yield instance_module.as_url(with_database(server_url, name))
    drop_database(server_url, name)


@pytest.fixture(scope="session")
def dagster_home(tmp_path_factory, dagster_storage_url: str) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("dagster_home")
    shutil.copyfile(instance_module.INSTANCE_TEMPLATE, home / "dagster.yaml")
    saved = {
        k: os.environ.get(k)
        for k in ("MEDIA_HOOKS_DAGSTER_STORAGE_URL", "MEDIA_HOOKS_ALLOW_PRIVATE_URLS")
    }
    os.environ["MEDIA_HOOKS_DAGSTER_STORAGE_URL"] = dagster_storage_url
    # Constant for the session: step processes read it, and the forkserver keeps its start env.
    os.environ["MEDIA_HOOKS_ALLOW_PRIVATE_URLS"] = "1"
    yield home
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def instance(dagster_home: Path) -> Iterator[DagsterInstance]:
    with DagsterInstance.from_config(str(dagster_home)) as real:
        yield real


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as running:
        yield running


def deliver(
    instance: DagsterInstance, database_url: str, config: dict | None = None, **options
) -> DeliveryRun:
    """One ``deliver_webhooks`` run on this test's database."""
    return execute_delivery(
        instance, config, resources={"postgres": {"database_url": database_url}}, **options
    )
