"""The hot statements are index scans on a realistic table, not sequential scans (issue 2).

Each plan is printed (``pytest -s`` shows them) and checked: no statement of the delivery
protocol may read a whole table of deliveries, dispatches or attempts.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import psycopg
import pytest
from psycopg.rows import dict_row

from media_hooks.cohort import Cohort
from media_hooks.db import with_database
from media_hooks.reconciler import claim_due
from media_hooks.sqlfiles import query
from media_hooks_tests.conftest import create_database, drop_database
from media_hooks_tests.factories import add_deliveries, add_destination

BIG_TABLES = {"webhook_delivery", "dispatch_outbox", "delivery_attempt"}


def _seq_scans(plan: dict) -> list[str]:
    found = []
    if plan.get("Node Type") == "Seq Scan" and plan.get("Relation Name") in BIG_TABLES:
        found.append(
            f"{plan['Relation Name']} ({plan.get('Parent Relationship')}, {plan.get('Subplan Name', '')})"
        )
    for child in plan.get("Plans", []):
        found.extend(_seq_scans(child))
    return found


@pytest.fixture(scope="module")
def loaded(server_url, template_name):
    """One loaded database for every plan: EXPLAIN without ANALYZE changes nothing."""
    name = create_database(server_url, template=template_name)
    with psycopg.connect(
        with_database(server_url, name), autocommit=True, row_factory=dict_row
    ) as conn:
        add_destination(conn, "cdn")
        add_deliveries(conn, "cdn", 20_000)
        for run in range(20):  # many runs' dispatches: a run is a small part of the outbox
            claim_due(conn, f"run-{run}", Cohort(), page_size=500, max_rows=500)
        # A history: one finished attempt for every delivery.
        conn.execute(
            """
            INSERT INTO delivery_attempt (delivery_id, attempt_no, destination_id, lease_token, finished_at, outcome)
            SELECT delivery_id, 1, destination_id, gen_random_uuid(), now(), 'retryable' FROM webhook_delivery
            """
        )
        conn.execute("VACUUM ANALYZE")
        yield conn
    drop_database(server_url, name)


def _ids(n: int) -> list[str]:
    return [f"d-cdn-{i}" for i in range(1, n + 1)]


STATEMENTS = {
    "claim_due_page": lambda: {"run_id": "r", "page_size": 250, **Cohort().params()},
    "plan_batches": lambda: {"run_id": "run-1", "batch_size": 1000},
    "publish_page": lambda: {
        "run_id": "run-1",
        "destination_id": "cdn",
        "after_message_id": "",
        "last_message_id": "~",
        "page_size": 500,
    },
    "lease_deliveries": lambda: {
        "run_id": "r",
        "lease_seconds": 90,
        "delivery_ids": _ids(100),
        "message_ids": [f"{i}:1" for i in _ids(100)],
    },
    "record_outcomes": lambda: {
        "delivery_ids": _ids(100),
        "lease_tokens": [uuid.uuid4()] * 100,
        "outcomes": ["success"] * 100,
        "http_statuses": [200] * 100,
        "errors": [None] * 100,
        "excerpts": [None] * 100,
        "delays": [0.0] * 100,
        "delay_reasons": [None] * 100,
        "started_at": [datetime.now(UTC)] * 100,
        "finished_at": [datetime.now(UTC)] * 100,
    },
    "defer_deliveries": lambda: {
        "delivery_ids": _ids(100),
        "message_ids": [f"{i}:1" for i in _ids(100)],
        "due_at": datetime.now(UTC),
        "reason": "x",
    },
    "sweep_expired_leases": lambda: {"limit_rows": 1000},
    "sweep_stale_enqueues": lambda: {"timeout_seconds": 3600, "limit_rows": 1000},
    "release_run": lambda: {"run_id": "run-1"},
}


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_hot_statement_uses_indexes(loaded, name):
    statement = f"EXPLAIN (FORMAT JSON) {query(name)}"
    (plan,) = loaded.execute(statement.encode(), STATEMENTS[name]()).fetchone()["QUERY PLAN"]
    print(f"\n{name}:\n{json.dumps(plan['Plan'], indent=1)[:4000]}")
    assert _seq_scans(plan["Plan"]) == []
