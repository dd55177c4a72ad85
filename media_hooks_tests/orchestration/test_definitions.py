"""The definitions resolve, and read as the table of contents of the Dagster layer."""

from __future__ import annotations

import subprocess
import sys

from dagster import DefaultScheduleStatus, DefaultSensorStatus, Definitions

from media_hooks.observe import checks
from media_hooks.orchestration.definitions import defs, deliver_webhooks_job
from media_hooks.orchestration.ops.delivery import Prepared, Shard, shard_caps
from media_hooks.outbox.cohort import Cohort
from media_hooks_tests.conftest import REPO


def test_definitions_resolve_with_every_job_schedule_and_sensor():
    Definitions.validate_loadable(defs)
    repo = defs.get_repository_def()
    assert {j.name for j in repo.get_all_jobs()} >= {
        "deliver_webhooks",
        "requeue_cohort",
        "retention",
    }
    assert {s.name for s in repo.schedule_defs} == {"nightly_delivery", "daily_retention"}
    assert {s.name for s in repo.sensor_defs} == {
        "delivery_lag_sensor",
        "delivery_run_failure_sensor",
        "outbox_checks_sensor",
    }
    # The outbox in the catalog, with its checks: one per invariant of `media-hooks check`,
    # and the figures, the destinations and the newest run's.
    assert [k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()] == [
        "media_hooks/outbox"
    ]
    # The invariants, the counts, and the figure checks (oldest due, relay lag, oldest
    # snapshot, partitions ahead, destinations sending, last run delivered).
    assert len(repo.asset_graph.asset_check_keys) == len(checks.CHECKS) + 1 + 6
    assert all(s.default_status == DefaultScheduleStatus.RUNNING for s in repo.schedule_defs)
    assert all(s.default_status == DefaultSensorStatus.RUNNING for s in repo.sensor_defs)
    assert deliver_webhooks_job().name == "deliver_webhooks"


def test_the_engine_never_imports_dagster():
    code = (
        "import sys, pkgutil, importlib, media_hooks\n"
        "for m in pkgutil.iter_modules(media_hooks.__path__, 'media_hooks.'):\n"
        "    if m.name not in ('media_hooks.orchestration', 'media_hooks.cli'):\n"
        "        importlib.import_module(m.name)\n"
        "print('dagster' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.stdout.strip() == "False", out.stderr


def test_shards_divide_the_destinations_each_to_exactly_one_step():
    prepared = Prepared(Cohort(), page_size=250, max_rows=None, shards=3, due_destinations=0)
    shards = [Shard(index, 3, prepared) for index in range(3)]
    destinations = [f"pub-{n}" for n in range(60)] + ["a-b", "a_b", "a:b", "x" * 200]
    for destination in destinations:
        assert sum(shard.serves(destination) for shard in shards) == 1, destination
    assert all(sum(map(shard.serves, destinations)) > 0 for shard in shards)
    assert [s.mapping_key for s in shards] == ["shard_1_of_3", "shard_2_of_3", "shard_3_of_3"]


def test_a_capped_run_splits_its_cap_by_the_due_destinations_each_shard_serves():
    assert shard_caps(None, [3, 0]) == [None, None]
    assert shard_caps(10, [2, 0, 2]) == [5, 0, 5]
    assert shard_caps(10, [1, 2]) == [3, 7]  # 3.33 and 6.67: the larger remainder takes the row
    assert shard_caps(4, [0, 0]) == [2, 2]  # nothing due when prepared: equal parts
    assert shard_caps(1, [1, 1, 1]) == [1, 0, 0]
    for cap in range(0, 40):
        for served in ([1, 1, 1], [5, 0, 2], [0, 3, 0, 1]):
            assert sum(shard_caps(cap, served)) == cap
