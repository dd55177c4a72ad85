"""``python -m bench --smoke --only celery``: the Celery section runs on a real broker and its
report is well formed (the shape, never the figures of a tiny run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from media_hooks_tests.conftest import REPO

pytestmark = pytest.mark.one_server


def test_the_celery_section_runs_and_reports(server_url: str, broker_url: str, tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEDIA_HOOKS_", "DAGSTER_"))}
    env.update(
        MEDIA_HOOKS_DATABASE_URL=server_url,
        MEDIA_HOOKS_HOME=str(tmp_path / "home"),
        MEDIA_HOOKS_BENCH_BROKER_URL=broker_url,
    )
    out = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--only", "celery", "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr

    celery = json.loads((out / "latest.json").read_text())["measurements"]["celery"]
    assert "error" not in celery, celery.get("error")
    assert set(celery["figures"]) == {
        "local",
        "one_worker",
        "two_workers",
        "two_workers_one_killed",
    }
    for path, figures in celery["figures"].items():
        assert "errors" not in figures, (path, figures["errors"])
        assert figures["fraction_of_limits"]["n"] == 1, path
    killed = celery["figures"]["two_workers_one_killed"]
    for metric in ("lost", "succeeded_twice", "unexplained_repeats", "check_exit"):
        assert killed[metric]["n"] == 1, metric
    assert len(celery["killed"]["executed_by"]) == 2  # the killed shard ran again elsewhere
    assert {t["target"] for t in celery["targets"]} and all(
        {"target", "value", "met"} <= set(t) for t in celery["targets"]
    )
    assert "## 9. Celery workers" in (out / "REPORT.md").read_text()
