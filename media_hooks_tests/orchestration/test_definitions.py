"""The definitions resolve, and read as the table of contents of the Dagster layer."""

from __future__ import annotations

import subprocess
import sys

from dagster import DefaultScheduleStatus, DefaultSensorStatus, Definitions

from media_hooks.orchestration.definitions import defs, deliver_webhooks_job
from media_hooks.orchestration.metadata import mapping_key
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
    }
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


def test_mapping_keys_are_valid_readable_and_unique():
    keys = [mapping_key(d, 1) for d in ("alpha", "a-b", "a_b", "a:b", "x" * 200)]
    assert keys[0] == "alpha__1"
    assert keys[1].startswith("a_b_") and keys[3].startswith("a_b_")
    assert len(set(keys)) == len(keys)
    assert all(k.replace("_", "").isalnum() for k in keys)
