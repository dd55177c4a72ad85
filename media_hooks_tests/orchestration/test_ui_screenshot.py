"""The outbox's page in the Dagster catalog, seen in a real browser (Debian's Chromium, headless)
on a running `media-hooks dev`, after a run against a broken outbox: the page opens on the
asset (no dialog over it) and its checks show the failures.

Skipped when Chromium is not installed (`apt-get install chromium`). The screenshot is written
to MEDIA_HOOKS_SCREENSHOT_DIR when it is set (CI keeps it), else to the test's folder.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import requests

from media_hooks.orchestration import outbox_asset
from media_hooks_tests.conftest import run_cli, start_cli
from media_hooks_tests.factories import add_deliveries, add_destination

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# A fresh profile, nothing fetched but the page: no first-run screens, updates or sync.
QUIET = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Virtual time the page gets to load and run its queries before the capture.
PAGE_BUDGET_MS = "20000"

pytestmark = [
    pytest.mark.one_server,
    pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serving(url: str) -> bool:
    try:
        return requests.get(f"{url}/server_info", timeout=2).ok
    except requests.RequestException:
        return False


def _chromium(profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CHROMIUM, *QUIET, f"--user-data-dir={profile}", "--window-size=1600,1100", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _latest_evaluations(instance) -> list:
    """The newest evaluation of each of the outbox's checks, as the page shows them."""
    found = []
    for spec in outbox_asset.SPECS:
        (newest,) = instance.event_log_storage.get_asset_check_execution_history(spec.key, limit=1)
        found.append(newest.event.dagster_event.event_specific_data)
    return found


@pytest.fixture
def env(cli_env, own_storage_url):
    # The guard on, as a newcomer has it; Dagster's history of this module's own.
    guarded = {k: v for k, v in cli_env.items() if k != "MEDIA_HOOKS_ALLOW_PRIVATE_URLS"}
    return dict(guarded, MEDIA_HOOKS_DAGSTER_STORAGE_URL=own_storage_url)


def test_the_outbox_page_shows_its_failing_checks(env, conn, own_instance, tmp_path):
    # A first webhook to a receiver on this machine, without --allow-private-url: the run
    # disables it. And an outbox broken by hand: a dead delivery without its identity row.
    add_destination(conn, "mine", "http://127.0.0.1:9/hook", max_in_flight=1)
    add_deliveries(conn, "mine", 2)
    (broken,) = add_deliveries(conn, "mine", 1, state="dead")
    conn.execute("DELETE FROM delivery_identity WHERE delivery_id = %s", (broken,))
    ran = run_cli("run", env=env, timeout=180)
    assert ran.returncode == 0, ran.stderr

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    dev = start_cli("dev", "--port", str(port), env=env, own_session=True, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not _serving(url):
            assert time.monotonic() < deadline, "the Dagster UI did not start"
            assert dev.poll() is None, dev.communicate()[0][-3000:]
            time.sleep(0.5)  # another process starting: nothing to wait on but its answer
        page = f"{url}/assets/media_hooks/outbox"
        shots = Path(os.environ.get("MEDIA_HOOKS_SCREENSHOT_DIR") or tmp_path)
        shots.mkdir(parents=True, exist_ok=True)
        picture = shots / "outbox-checks.png"
        budget = f"--virtual-time-budget={PAGE_BUDGET_MS}"
        taken = _chromium(tmp_path / "shot-profile", budget, f"--screenshot={picture}", page)
        assert picture.exists() and picture.stat().st_size > 20_000, taken.stderr[-2000:]
        dom = _chromium(tmp_path / "dom-profile", budget, "--dump-dom", page).stdout
    finally:
        os.killpg(dev.pid, signal.SIGINT)
        try:
            output, _ = dev.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(dev.pid, signal.SIGKILL)
            output, _ = dev.communicate()
    assert "local destinations (a receiver on 127.0.0.1, a private network) will be refused" in (
        output
    )
    assert "destination mine is disabled by the SSRF guard" in output
    # The page, as the browser rendered it: the asset, its check results, no community dialog.
    assert "Latest check results" in dom, dom[-3000:]
    failed = {
        e.check_name: e.severity.value for e in _latest_evaluations(own_instance) if not e.passed
    }
    assert failed == {
        "delivery_without_identity": "ERROR",
        "destinations_sending": "WARN",
        "last_run_delivered": "WARN",
    }
    assert "media_hooks" in dom and "outbox" in dom
    assert "Join the Dagster community" not in dom
    print(f"screenshot: {picture}")
