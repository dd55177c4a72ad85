"""`media-hooks metrics` as a real process: a scrape parses as Prometheus text and matches SQL."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from media_hooks_tests.conftest import REPO, run_cli
from media_hooks_tests.operator_data import prepare


@pytest.fixture
def exporter(cli_env) -> Iterator[str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "media_hooks.cli", "metrics", "--port", "0"],
        env=cli_env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # The first line names the URL once the server listens; readline waits for it.
        line = process.stdout.readline()
        match = re.search(r"(http://\S+/metrics)", line)
        assert match, (line, process.stderr.read() if process.poll() is not None else "")
        yield match.group(1)
    finally:
        process.terminate()
        assert process.wait(timeout=10) == 0


def _scrape(url: str) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_a_scrape_parses_and_matches_the_database(conn, exporter):
    prepare(conn)
    found = _scrape(exporter)
    for row in conn.execute(
        "SELECT destination_id, state, count(*) AS n FROM webhook_delivery GROUP BY 1, 2"
    ):
        key = (("destination_id", row["destination_id"]), ("state", row["state"]))
        assert found[("media_hooks_deliveries", key)] == row["n"]
    assert found[("media_hooks_up", ())] == 1
    expired = conn.execute(
        "SELECT count(*) AS n FROM webhook_delivery WHERE state = 'leased' AND lease_until < now()"
    ).fetchone()["n"]
    assert found[("media_hooks_expired_leases", ())] == expired == 1
    assert found[("media_hooks_destination_paused", (("destination_id", "beta"),))] == 1
    assert found[("media_hooks_destination_disabled", (("destination_id", "gamma"),))] == 1
    oldest = conn.execute(
        "SELECT extract(epoch FROM now() - min(next_attempt_at))::float AS age "
        "FROM webhook_delivery WHERE state = 'pending' AND next_attempt_at <= now()"
    ).fetchone()["age"]
    # The scrape measured a moment before this query, so its age is no greater.
    assert 0 < found[("media_hooks_oldest_due_any_age_seconds", ())] <= oldest


def test_a_bad_port_exits_2(cli_env):
    result = run_cli("metrics", "--port", "70000", env=cli_env)
    assert result.returncode == 2
    assert "--port: must be a whole number at least 0 and at most 65535" in result.stderr
