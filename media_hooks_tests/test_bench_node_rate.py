"""``python -m bench.node_rate`` at a tiny size: every path runs and the JSON is well formed.

As for the report's smoke run, the figures of a tiny run mean nothing: this checks the shape
of what the benchmark writes, never the values. It needs Node.js and npm (the benchmark
installs bench/pgboss's packages itself).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import cpu
from media_hooks_tests.conftest import REPO

PATHS = {"engine", "node", "pgboss"}
# The Node worker reports no delivery span of its own; only pg-boss its CPU over it.
NOT_REPORTED = {("node", "own_per_second"), ("node", "own_cpu_ms_per_delivery")}
NOT_REPORTED |= {("engine", "own_cpu_ms_per_delivery")}


@pytest.mark.one_server
@pytest.mark.skipif(
    shutil.which("node") is None or shutil.which("npm") is None,
    reason="Node.js and npm are needed for the Node worker and pg-boss",
)
def test_node_rate_writes_well_formed_figures(server_url: str, tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEDIA_HOOKS_", "DAGSTER_"))}
    env.update(MEDIA_HOOKS_DATABASE_URL=server_url, MEDIA_HOOKS_HOME=str(tmp_path / "home"))
    out = tmp_path / "node_rate.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.node_rate", "--deliveries", "40", "--rounds", "1"]
        + ["--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr

    document = json.loads(out.read_text())
    assert document["command"].startswith("python -m bench.node_rate")
    assert len(document["machine"]["load_average"]) == 3
    assert len(document["machine"]["load_average_after"]) == 3
    assert document["postgres"]["version"]
    assert document["size"]["deliveries"] == 40
    assert set(document["figures"]) == PATHS
    server_here = cpu.postmaster(server_url) is not None
    for path, figures in document["figures"].items():
        assert "errors" not in figures, (path, figures["errors"])
        for metric in document["metrics"]:
            if (path, metric) in NOT_REPORTED:
                continue
            if metric == "server_cpu_ms_per_delivery" and not server_here:
                continue
            summary = figures[metric]
            if metric == "steady_per_second" and summary["n"] == 0:
                # 40 deliveries to an instant receiver can all arrive in one scheduling
                # burst: the middle of their span then holds too few starts for a rate.
                continue
            assert summary["n"] == 1, (path, metric)
            assert summary["min"] <= summary["median"] <= summary["max"], (path, metric)
    assert {r["metric"] for r in document["ratios"]} >= {"per_second", "steady_per_second"}
    for ratio in document["ratios"]:
        assert {ratio["of"], ratio["to"]} <= PATHS, ratio
    for path in PATHS:
        assert path in done.stdout, "the table names every path"
