"""A real Dagster instance on PostgreSQL for the orchestration tests, and a local receiver.

One instance (its own database on the test server) serves the whole session; each test's
deliveries live in the test's own database, handed to the job as resource config, because
the multiprocess executor's forkserver keeps the environment it started with.

Tests whose subject is the instance's run history (which runs are in flight, failed, dead)
take ``own_instance``: a Dagster instance of their module's own, wiped before each test.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import DagsterInstance

from media_hooks.devtools.receiver import Receiver, Reply
from media_hooks.orchestration import instance as instance_module
from media_hooks.orchestration.instance import STORAGE_VARIABLE
from media_hooks.orchestration.ops.delivery import DELIVERY_POOL
from media_hooks.orchestration.running import DeliveryRun, execute_delivery
from media_hooks_tests.conftest import create_database, drop_database, with_database

# The multiprocess executor, for tests whose steps must die alone (a crash point kills its process).
SPAWN = {"config": {"multiprocess": {"max_concurrent": 8, "start_method": {"spawn": {}}}}}


def _storage_database(server_url: str) -> Iterator[str]:
    """A new database for Dagster's storage, as the URL Dagster takes; dropped afterwards."""
    name = create_database(server_url)
    yield instance_module.as_url(with_database(server_url, name))
    drop_database(server_url, name)


@pytest.fixture(scope="session")
def dagster_storage_url(server_url: str) -> Iterator[str]:
    yield from _storage_database(server_url)


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


@pytest.fixture(scope="module")
def own_storage_url(server_url: str) -> Iterator[str]:
    """Dagster's storage in a database of this module's own."""
    yield from _storage_database(server_url)


@pytest.fixture(scope="module")
def own_instance_module(tmp_path_factory, dagster_home: Path, own_storage_url: str):
    home = tmp_path_factory.mktemp("own_dagster_home")
    shutil.copyfile(instance_module.INSTANCE_TEMPLATE, home / "dagster.yaml")
    session_storage = os.environ[STORAGE_VARIABLE]
    os.environ[STORAGE_VARIABLE] = own_storage_url  # read once, as the instance loads
    try:
        own = DagsterInstance.from_config(str(home))
    finally:
        os.environ[STORAGE_VARIABLE] = session_storage
    with own:
        yield own


@pytest.fixture
def own_instance(own_instance_module: DagsterInstance) -> DagsterInstance:
    """A Dagster instance with no run history (its module's own, wiped for this test)."""
    own_instance_module.wipe()
    own_instance_module.event_log_storage.delete_concurrency_limit(DELIVERY_POOL)
    return own_instance_module


class Gate:
    """A receiver script: hold each request (the effect is committed) until opened."""

    def __init__(self) -> None:
        self.open = threading.Event()

    def __call__(self, info) -> Reply:
        return Reply() if self.open.is_set() else Reply(delay_seconds=120)


@pytest.fixture
def gated() -> Iterator[tuple[Receiver, Gate]]:
    gate = Gate()
    with Receiver(script=gate) as receiver:
        yield receiver, gate


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


def hold_pool_slot(storage, run_id: str, step_key: str = "deliver_shard[shard_1_of_1]") -> None:
    """A slot of the delivery pool held by ``run_id``, as a running delivery step holds one."""
    if DELIVERY_POOL not in storage.get_concurrency_keys():
        storage.initialize_concurrency_limit_to_default(DELIVERY_POOL)
    claim = storage.claim_concurrency_slot(DELIVERY_POOL, run_id, step_key)
    assert claim.is_claimed, claim


def slot_holders(storage) -> list[str]:
    """The runs holding slots of the delivery pool, one entry per slot."""
    return sorted(s.run_id for s in storage.get_concurrency_info(DELIVERY_POOL).claimed_slots)
