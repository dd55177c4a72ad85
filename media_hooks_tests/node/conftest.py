"""The Node.js package (node/) against real PostgreSQL and the project's receiver.

Its processes are started as a user would start them: ``node node/bin/media-hooks-node.js``
for the worker, and a small driver (emit_driver.mjs) that calls the package's emit functions
inside a ``pg`` transaction of its own. These tests skip when ``node`` is not installed; the
package's dependencies are installed (``npm ci``) once per session when they are missing.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from media_hooks_tests.conftest import NODE_DIR, REPO

CLI = NODE_DIR / "bin" / "media-hooks-node.js"
EMIT_DRIVER = Path(__file__).with_name("emit_driver.mjs")


@pytest.fixture
def node_env(cli_env: dict[str, str]) -> dict[str, str]:
    """The environment of a Node process bound to this test's database (private URLs allowed:
    receivers live on 127.0.0.1)."""
    return dict(cli_env)


def run_worker(
    node: str, *args: str, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``media-hooks-node worker ...`` as a real process, waited for."""
    return subprocess.run(
        [node, str(CLI), "worker", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def start_worker(node: str, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """``media-hooks-node worker ...`` started, not waited for (the caller ends it)."""
    return subprocess.Popen(
        [node, str(CLI), "worker", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )


def worker_report(done: subprocess.CompletedProcess[str]) -> dict:
    """The worker's ``--json`` report; fails with its stderr when it did not end normally."""
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def run_emit(node: str, database_url: str, transaction: str, calls: list[dict]) -> list[dict]:
    """Call the package's emit functions, in order, on one connection: inside a transaction
    that ends with ``transaction`` ('commit' or 'rollback'), or outside one ('none'). Each
    call's result is {"ok": value} or {"error": {"name", "message"}}."""
    scenario = {"url": database_url, "transaction": transaction, "calls": calls}
    done = subprocess.run(
        [node, str(EMIT_DRIVER)],
        input=json.dumps(scenario),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)
