"""`media-hooks metrics` as a real process: a scrape parses as Prometheus text and matches SQL."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client.parser import text_string_to_metric_families

from media_hooks_tests.conftest import REPO, run_cli
from media_hooks_tests.factories import add_deliveries
from media_hooks_tests.interleaving import wait_for
from media_hooks_tests.operator_data import prepare


@contextmanager
def running_exporter(cli_env, *extra: str) -> Iterator[str]:
    """`media-hooks metrics --port 0 EXTRA...` as a process of its own; yields its URL."""
    process = subprocess.Popen(
        [sys.executable, "-m", "media_hooks.cli", "metrics", "--port", "0", *extra],
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


def _succeeded(conn, destination_id: str) -> int:
    return conn.execute(
        "SELECT count(*) AS n FROM webhook_delivery_all WHERE destination_id = %s"
        " AND state = 'succeeded'",
        (destination_id,),
    ).fetchone()["n"]


def _counted(url: str) -> dict[tuple[str, tuple], float]:
    """A scrape once the exporter has counted the history (its series are absent before)."""
    found: dict[tuple[str, tuple], float] = {}

    def counted() -> bool:
        found.update(_scrape(url))
        return ("media_hooks_history_age_seconds", ()) in found

    wait_for(counted, "the exporter's first count of the history")
    return found


def _scrape(url: str) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_a_scrape_parses_and_matches_the_database(conn, cli_env):
    prepare(conn)
    with running_exporter(cli_env) as url:
        found = _counted(url)
    for row in conn.execute(
        "SELECT destination_id, state, count(*) AS n FROM webhook_delivery_all GROUP BY 1, 2"
    ):
        key = (("destination_id", row["destination_id"]), ("state", row["state"]))
        assert found[("media_hooks_deliveries", key)] == row["n"]
    assert found[("media_hooks_up", ())] == 1
    expired = conn.execute(
        "SELECT count(*) AS n FROM webhook_delivery_all WHERE state = 'leased' AND lease_until < now()"
    ).fetchone()["n"]
    assert found[("media_hooks_expired_leases", ())] == expired == 1
    assert found[("media_hooks_destination_paused", (("destination_id", "beta"),))] == 1
    assert found[("media_hooks_destination_disabled", (("destination_id", "gamma"),))] == 1
    oldest = conn.execute(
        "SELECT extract(epoch FROM now() - min(next_attempt_at))::float AS age "
        "FROM webhook_delivery_all WHERE state = 'pending' AND next_attempt_at <= now()"
    ).fetchone()["age"]
    # The scrape measured a moment before this query, so its age is no greater.
    assert 0 < found[("media_hooks_oldest_due_any_age_seconds", ())] <= oldest


def test_a_bad_port_exits_2(cli_env):
    result = run_cli("metrics", "--port", "70000", env=cli_env)
    assert result.returncode == 2
    assert "--port: must be a whole number at least 0 and at most 65535" in result.stderr


def test_a_bad_history_interval_exits_2(cli_env):
    result = run_cli("metrics", "--port", "0", "--history-every", "-1", env=cli_env)
    assert result.returncode == 2
    assert "--history-every: must be a number of seconds at least 0" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_scrape_serves_the_last_count_of_the_history_and_measures_the_rest(conn, cli_env):
    """Between two counts of the history (here an hour apart) a scrape does not count the
    succeeded deliveries: a success after the count shows at the next count, while the
    live figures (a new pending delivery) show at once."""
    prepare(conn)
    succeeded = ("media_hooks_deliveries", (("destination_id", "alpha"), ("state", "succeeded")))
    pending = ("media_hooks_deliveries", (("destination_id", "alpha"), ("state", "pending")))
    with running_exporter(cli_env, "--history-every", "3600") as url:
        first = _counted(url)
        assert first[succeeded] == _succeeded(conn, "alpha") == 1
        add_deliveries(conn, "alpha", 1, prefix="late", state="succeeded")
        add_deliveries(conn, "alpha", 1, prefix="new")
        later = _scrape(url)
    assert later[pending] == first[pending] + 1
    assert _succeeded(conn, "alpha") == 2
    assert later[succeeded] == 1, "a scrape counted the succeeded history"
    assert (
        later[("media_hooks_history_age_seconds", ())]
        >= first[("media_hooks_history_age_seconds", ())]
    )
