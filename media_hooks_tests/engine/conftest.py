"""One delivery engine, two runtimes: ``deliver`` delivers the due deliveries of the
destinations named with the Python engine or with the Node.js worker (node/), so that a test
of the engine's behaviour taking it holds for both (test_conformance.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from media_hooks.engine.delivery_run import deliver_due
from media_hooks.outbox.cohort import Cohort
from media_hooks_tests.node.conftest import run_worker, worker_report

# Per destination: what its delivery did (DeliveryCounts' names: attempted, succeeded, ...).
Deliver = Callable[..., dict[str, dict[str, int]]]


@pytest.fixture(params=["python", "node"])
def runtime(request) -> str:
    return request.param


@pytest.fixture
def deliver(request, runtime: str, pool, settings, cli_env) -> Deliver:
    """``deliver(*destination_ids, run_id="run-1", guarded=False)``: one run's delivery of
    their due deliveries, waited for; ``guarded``: the SSRF guard on for the deployment (no
    MEDIA_HOOKS_ALLOW_PRIVATE_URLS)."""

    def python(*destination_ids: str, run_id: str = "run-1", guarded: bool = False):
        report = deliver_due(
            pool,
            run_id,
            dataclasses.replace(settings, allow_private_urls=not guarded),
            Cohort(destination_ids=destination_ids),
        )
        return {d: c.as_dict() for d, c in report.by_destination.items()}

    if runtime == "python":
        return python
    node = request.getfixturevalue("node")

    def in_node(*destination_ids: str, run_id: str = "run-1", guarded: bool = False):
        env = dict(cli_env)
        if guarded:
            del env["MEDIA_HOOKS_ALLOW_PRIVATE_URLS"]
        done = run_worker(node, *destination_ids, "--run-id", run_id, "--json", env=env)
        report = worker_report(done)["destinations"]
        return {d: {k: v for k, v in c.items() if k != "claimed"} for d, c in report.items()}

    return in_node
