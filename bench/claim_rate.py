"""(2) Claim: rows/s of the reconciler on a due backlog, beside its own statement and the sketch.

At each page size, a destination's backlog claimed as a delivery run claims it:

- ``one``: ``media_hooks.outbox.claims.claim_destination_page`` page after page, one run;
- ``two``: two runs at once, each on its own connection in its own thread (SKIP LOCKED
  divides the rows; the work is the server's, so threads stand for processes here);
- ``bare``: the ``claim_destination_page`` statement alone in a loop, a transaction per page
  (after ``plan_by_index``, as the reconciler runs it): the floor, so ``one / bare`` is what
  the reconciler's Python costs.

And ``sketch``: the design record's ``enqueue_due_page`` as written (a page selected FOR
UPDATE SKIP LOCKED, then an INSERT and an UPDATE per row, page size 250), adapted only to
name the tables and columns this layout has: the due rows are the timer's, and the row's update
moves its state row and sets its timer in flight in one statement (since migration 0027 the
body is read from the delivery, not stored with each dispatch, so the sketch's copy of it, and
its read of the payload, are left out; since 0032 a message id names its dispatch,
``delivery_id:1`` here, where the record hashed the id).
And ``run_unanalyzed`` beside ``run_analyzed``: the claim, pages of 250, on a backlog whose
statistics are those of the empty tables (its speed must not depend on ANALYZE having run).

Every run claims a whole backlog in a fresh clone of a seeded database.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.rows import dict_row

from bench import stats
from bench.scratch import Destination, add_destinations, add_due_deliveries
from bench.session import Session
from media_hooks.outbox.claims import claim_destination_page
from media_hooks.outbox.cohort import Cohort
from media_hooks.store.sqlfiles import query

DESTINATION = "dest-1"
SKETCH_PAGE = 250
SKETCH_SELECT = """
SELECT s.delivery_id, s.destination_id, s.created_at
FROM delivery_timer AS t
JOIN delivery_state AS s USING (delivery_id)
WHERE t.kind = 'due' AND t.fire_at <= now() AND s.state = 'pending'
ORDER BY t.fire_at, t.delivery_id
FOR UPDATE OF t, s SKIP LOCKED
LIMIT %s
"""
SKETCH_INSERT = """
INSERT INTO dispatch_outbox_v3
    (message_id, delivery_id, dispatch_no, destination_id, run_id, delivery_created_at, created_at)
VALUES (%s, %s, 1, %s, %s, %s, now())
ON CONFLICT (message_id, delivery_created_at) DO NOTHING
"""
SKETCH_UPDATE = """
WITH moved AS (
    UPDATE delivery_state
    SET state = 'enqueued', updated_at = now()
    WHERE delivery_id = %(delivery_id)s AND state = 'pending'
    RETURNING delivery_id
)
UPDATE delivery_timer
SET kind = 'inflight', fire_at = now()
WHERE delivery_id IN (SELECT delivery_id FROM moved)
"""


def seeded(rows: int, analyze: bool = True) -> Callable[[str], None]:
    def seed(url: str) -> None:
        add_destinations(url, [Destination(DESTINATION, "http://127.0.0.1:9/")])
        add_due_deliveries(url, "claim-", {DESTINATION: rows}, analyze=analyze)

    return seed


def _connect(url: str) -> psycopg.Connection:
    return psycopg.connect(url, autocommit=True, row_factory=dict_row)


def bare(url: str, page_size: int) -> int:
    params = {
        "run_id": "bare",
        "destination_id": DESTINATION,
        "page_size": page_size,
        **Cohort().params(),
    }
    statement = query("claim_destination_page")
    total = 0
    with _connect(url) as conn:
        while True:
            with conn.transaction():
                conn.execute(query("plan_by_index"))  # as the reconciler runs it
                claimed = len(conn.execute(statement, params).fetchall())
            total += claimed
            if claimed < page_size:
                return total


def one(url: str, page_size: int = 250, run_id: str = "one") -> int:
    """A delivery run's claim: the destination's pages until one comes back empty (a short
    page may only mean that another run holds the rest)."""
    total = 0
    with _connect(url) as conn:
        while page := claim_destination_page(conn, run_id, DESTINATION, Cohort(), page_size):
            total += len(page)
    return total


def two(url: str, page_size: int) -> int:
    claimed: list[int] = []
    start = threading.Barrier(2)

    def reconciler(n: int) -> None:
        start.wait()
        claimed.append(one(url, page_size, f"two-{n}"))

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
                    # The record hashed the delivery's id; the outbox holds a message id to
                    # the dispatch it names (migration 0032), the first one here.
                    message_id = f"{row['delivery_id']}:1"
                    conn.execute(
                        SKETCH_INSERT,
                        [message_id, row["delivery_id"], row["destination_id"], "sketch",
                         row["created_at"]],
                    )  # fmt: skip
                    conn.execute(SKETCH_UPDATE, {"delivery_id": row["delivery_id"]})
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
    # The claim's speed must not depend on ANALYZE having run.
    paths["run_analyzed"] = timed(small, size.sketch_rows, one)
    paths["run_unanalyzed"] = timed(stale, size.sketch_rows, one)
    runs = session.interleaved(paths)
    figures = stats.summarize(runs, ["per_second"])
    pairs = []
    for page in size.claim_pages:
        pairs += [(f"one_{page}", f"bare_{page}"), (f"two_{page}", f"one_{page}")]
        pairs.append((f"one_{page}", "sketch"))
    pairs.append(("run_unanalyzed", "run_analyzed"))
    ratios = stats.ratios(figures, pairs, "per_second")
    targets = [
        stats.target(
            f"a run's claim at least 0.8x its bare statement, page {r['to'].split('_')[1]}",
            r["value"],
            0.8,
        )
        for r in ratios
        if r["to"].startswith("bare_")
    ]
    targets.append(
        stats.target(
            "a run's claim without ANALYZE since the load at least 0.8x with it: speed does "
            "not depend on ANALYZE",
            ratios[-1]["value"],
            0.8,
        )
    )
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
            "two: two runs at once on their own connections; rows/s of both together.",
            "run_analyzed / run_unanalyzed: one run, pages of 250, on the sketch's backlog, "
            "with statistics taken after the load, and with the statistics of the empty "
            "tables (ANALYZE before the load, autovacuum off).",
        ],
    }
