"""(2) Claim: rows/s of the reconciler on a due backlog, beside its own statement and the sketch.

At each page size:

- ``one``: ``media_hooks.outbox.claims.claim_due`` (a cohort's due pages, oldest first), one
  reconciler;
- ``two``: two reconcilers at once, each on its own connection in its own thread (SKIP LOCKED
  divides the rows; the work is the server's, so threads stand for processes here);
- ``bare``: the ``claim_due_page`` statement alone in a loop, a transaction per page (after
  ``plan_by_index``, as the reconciler runs a whole cohort's pages): the floor, so
  ``one / bare`` is what the reconciler's Python costs.

And ``sketch``: the design record's ``enqueue_due_page`` as written (a page selected FOR
UPDATE SKIP LOCKED, then an INSERT and an UPDATE per row, page size 250), adapted only to
name the columns our outbox requires. And ``small_unanalyzed`` beside ``small_analyzed``:
the claim on a backlog whose statistics are those of the empty tables (issue 13 part 2 wants
its speed not to depend on ANALYZE having run); and the same pair for the claim a delivery
run makes (``run_analyzed`` / ``run_unanalyzed``: ``claim_destination_page``, page after page
of 250, as each destination's worker claims).

Every run claims a whole backlog in a fresh clone of a seeded database.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from hashlib import sha256
from typing import Any

import psycopg
from psycopg.rows import dict_row

from bench import stats
from bench.scratch import Destination, add_destinations, add_due_deliveries
from bench.session import Session
from media_hooks.outbox.claims import claim_destination_page, claim_due
from media_hooks.outbox.cohort import Cohort
from media_hooks.store.sqlfiles import query

SKETCH_PAGE = 250
SKETCH_SELECT = """
SELECT delivery_id, destination_id, asset_id, event_type, payload
FROM webhook_delivery
WHERE state = 'pending' AND next_attempt_at <= now()
ORDER BY next_attempt_at, delivery_id
FOR UPDATE SKIP LOCKED
LIMIT %s
"""
SKETCH_INSERT = """
INSERT INTO dispatch_outbox (message_id, delivery_id, dispatch_no, destination_id, run_id, body, created_at)
VALUES (%s, %s, 1, %s, %s, %s, now())
ON CONFLICT (message_id) DO NOTHING
"""
SKETCH_UPDATE = """
UPDATE webhook_delivery
SET state = 'enqueued', updated_at = now()
WHERE delivery_id = %s AND state = 'pending'
"""


def seeded(rows: int, analyze: bool = True) -> Callable[[str], None]:
    def seed(url: str) -> None:
        add_destinations(url, [Destination("dest-1", "http://127.0.0.1:9/")])
        add_due_deliveries(url, "claim-", {"dest-1": rows}, analyze=analyze)

    return seed


def _connect(url: str) -> psycopg.Connection:
    return psycopg.connect(url, autocommit=True, row_factory=dict_row)


def bare(url: str, page_size: int) -> int:
    params = {"run_id": "bare", "page_size": page_size, **Cohort().params()}
    statement = query("claim_due_page")
    total = 0
    with _connect(url) as conn:
        while True:
            with conn.transaction():
                conn.execute(query("plan_by_index"))  # as the reconciler claims a whole cohort
                claimed = sum(r["claimed"] for r in conn.execute(statement, params).fetchall())
            total += claimed
            if claimed < page_size:
                return total


def one(url: str, page_size: int, run_id: str = "one") -> int:
    with _connect(url) as conn:
        return claim_due(conn, run_id, Cohort(), page_size=page_size).claimed


def per_destination(url: str, page_size: int = 250) -> int:
    """A delivery run's claim: one destination's pages until one comes back short."""
    total = 0
    with _connect(url) as conn:
        while True:
            claimed = len(claim_destination_page(conn, "run", "dest-1", Cohort(), page_size))
            total += claimed
            if claimed < page_size:
                return total


def two(url: str, page_size: int) -> int:
    claimed: list[int] = []
    start = threading.Barrier(2)

    def reconciler(n: int) -> None:
        with _connect(url) as conn:
            start.wait()
            claimed.append(claim_due(conn, f"two-{n}", Cohort(), page_size=page_size).claimed)

    threads = [threading.Thread(target=reconciler, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(claimed)


def sketch(url: str, page_size: int = SKETCH_PAGE) -> int:
    """The record's enqueue_due_page, page after page until none is left."""
    total = 0
    with _connect(url) as conn:
        while True:
            with conn.transaction():
                rows = conn.execute(SKETCH_SELECT, [page_size]).fetchall()
                for row in rows:
                    body = json.dumps(row, sort_keys=True, separators=(",", ":"))
                    message_id = sha256(f"webhook:{row['delivery_id']}".encode()).hexdigest()
                    conn.execute(
                        SKETCH_INSERT,
                        [message_id, row["delivery_id"], row["destination_id"], "sketch", body],
                    )
                    conn.execute(SKETCH_UPDATE, [row["delivery_id"]])
            total += len(rows)
            if len(rows) < page_size:
                return total


def measure(session: Session) -> dict[str, Any]:
    size = session.size
    backlog = f"claim-{size.claim_rows}"
    small = f"claim-{size.sketch_rows}"
    stale = f"claim-{size.sketch_rows}-unanalyzed"
    session.scratch.template(backlog, seeded(size.claim_rows))
    session.scratch.template(small, seeded(size.sketch_rows))
    session.scratch.template(stale, seeded(size.sketch_rows, analyze=False))

    def timed(template: str, rows: int, claim: Callable[[str], int]) -> Callable[[], dict]:
        def run() -> dict:
            with session.scratch.database(template) as url:
                started = time.perf_counter()
                claimed = claim(url)
                seconds = time.perf_counter() - started
            assert claimed == rows, f"claimed {claimed} of {rows}"
            return {"per_second": rows / seconds}

        return run

    paths: dict[str, Callable[[], dict]] = {}
    for page in size.claim_pages:
        for name, claim in (("bare", bare), ("one", one), ("two", two)):
            paths[f"{name}_{page}"] = timed(
                backlog, size.claim_rows, lambda url, c=claim, p=page: c(url, p)
            )
    paths["sketch"] = timed(small, size.sketch_rows, sketch)
    # Issue 13, part 2: the claim's speed must not depend on ANALYZE having run.
    paths["small_analyzed"] = timed(small, size.sketch_rows, lambda url: one(url, 1000))
    paths["small_unanalyzed"] = timed(stale, size.sketch_rows, lambda url: one(url, 1000))
    paths["run_analyzed"] = timed(small, size.sketch_rows, per_destination)
    paths["run_unanalyzed"] = timed(stale, size.sketch_rows, per_destination)
    runs = session.interleaved(paths)
    figures = stats.summarize(runs, ["per_second"])
    pairs = []
    for page in size.claim_pages:
        pairs += [(f"one_{page}", f"bare_{page}"), (f"two_{page}", f"one_{page}")]
        pairs.append((f"one_{page}", "sketch"))
    pairs.append(("small_unanalyzed", "small_analyzed"))
    pairs.append(("run_unanalyzed", "run_analyzed"))
    ratios = stats.ratios(figures, pairs, "per_second")
    targets = [
        stats.target(
            f"claim_due at least 0.8x its bare statement, page {r['to'].split('_')[1]} (issue 3)",
            r["value"],
            0.8,
        )
        for r in ratios
        if r["to"].startswith("bare_")
    ]
    targets += [
        stats.target(
            f"{what} without ANALYZE since the load at least 0.8x with it: speed does not "
            "depend on ANALYZE (issue 13, part 2)",
            ratio["value"],
            0.8,
        )
        for what, ratio in (("claim_due", ratios[-2]), ("a delivery run's claim", ratios[-1]))
    ]
    return {
        "title": "Claim: rows/s by page size, one and two reconcilers, vs the bare statement "
        "and the record's row-at-a-time sketch",
        "metrics": {"per_second": "rows/s"},
        "size": {
            "backlog": size.claim_rows,
            "pages": list(size.claim_pages),
            "sketch_backlog": size.sketch_rows,
            "sketch_page": SKETCH_PAGE,
        },
        "figures": figures,
        "ratios": ratios,
        "targets": targets,
        "notes": [
            "sketch: the design record's enqueue_due_page (one SELECT per page, then an INSERT "
            "and an UPDATE per row), on a smaller backlog of the same rows.",
            "two: two reconcilers at once on their own connections; rows/s of both together.",
            "small_analyzed / small_unanalyzed: one reconciler, page 1,000, on the sketch's "
            "backlog, with statistics taken after the load, and with the statistics of the "
            "empty tables (ANALYZE before the load, autovacuum off). run_analyzed / "
            "run_unanalyzed: the same backlogs claimed as a delivery run claims them "
            "(claim_destination_page, pages of 250).",
        ],
    }
