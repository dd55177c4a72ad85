"""The inside of each measured process except the job's: the engine and the peers.

Run as processes of their own by ``bench.run_peer``. Each delivers the due deliveries of the database at URL to their destinations' URLs and
prints one JSON line: ``{"seconds": …, "delivered": …}`` (``seconds``: the delivery itself,
without the interpreter's start). The harness (``bench.paths``) starts them as processes of
their own and times them from outside too.

- ``engine``: ``media_hooks.engine.delivery_run.deliver_due`` (sweeps, claim, batches in threads),
  with the configuration from the environment, as a host timer or a script would run it.
- ``bare``: a plain ``requests.Session`` posting the same bodies one after another: the
  cost of HTTP alone, no database in the loop.
- ``rejected``: the design record's rejected design, "a single nightly process that selects
  every pending row, calls each destination, and marks success inline".
- ``procrastinate``: a Procrastinate worker (a Python PostgreSQL task queue) running a task
  that POSTs each body, ``--concurrency`` jobs at once; the jobs are deferred beforehand by
  ``defer_procrastinate_jobs`` (the queue's equivalent of emit). Its sync task runs in the
  event loop's default thread pool, sized here to the concurrency (Python's default of
  ``cpus + 4`` threads would cap it).
"""

from __future__ import annotations

import threading
import time

import psycopg
import requests

PENDING = """
SELECT s.delivery_id, w.url, b.body
FROM delivery_state AS s
JOIN webhook_destination AS w USING (destination_id)
JOIN delivery_body AS b ON b.delivery_id = s.delivery_id AND b.created_at = s.created_at
WHERE s.state = 'pending'
ORDER BY s.next_attempt_at, s.delivery_id
"""
# A delivery that succeeded leaves the open deliveries for history (its timer with it).
MARK_SUCCEEDED = """
WITH ended AS (
    DELETE FROM delivery_state WHERE delivery_id = %s AND state = 'pending'
    RETURNING *
),
timer AS (
    DELETE FROM delivery_timer WHERE delivery_id IN (SELECT delivery_id FROM ended)
)
INSERT INTO delivery_history
    (delivery_id, destination_id, asset_id, event_type, created_at, emit_seq, queued, state,
     attempt_count, budget_used, budget_started_at, dispatch_count, next_attempt_at,
     last_outcome, finished_at)
SELECT delivery_id, destination_id, asset_id, event_type, created_at, emit_seq, queued,
       'succeeded', attempt_count, budget_used, budget_started_at, dispatch_count,
       next_attempt_at, 'success', now()
FROM ended
"""
PROCRASTINATE_TASK = "bench.peers.post_body"


def _session() -> requests.Session:
    session = requests.Session()
    session.trust_env = False  # as the project's Sender: no proxy lookup per request
    return session


def _post(session: requests.Session, url: str, delivery_id: str, body: bytes) -> None:
    headers = {
        "Content-Type": "application/json",
        "webhook-id": delivery_id,
        "Idempotency-Key": delivery_id,
    }
    response = session.post(url, data=body, headers=headers, timeout=30)
    response.raise_for_status()


def engine(url: str, run_id: str, **options: int) -> dict:
    """``deliver_due`` with its own defaults, and any ``options`` given (page_size, ...)."""
    from media_hooks.core.config import Settings
    from media_hooks.engine.delivery_run import deliver_due
    from media_hooks.store import db

    with psycopg.connect(url) as conn:
        destinations = conn.execute("SELECT count(*) FROM webhook_destination").fetchone()[0]
    # One connection per destination batch at once, and a few for the claim and records.
    with db.open_pool(url, max_size=destinations + 4) as pool:
        started = time.perf_counter()
        report = deliver_due(pool, run_id, Settings.from_env(), **options)
        seconds = time.perf_counter() - started
    return {
        "seconds": seconds,
        "delivered": report.totals.succeeded,
        "claimed": report.claim.claimed,
        "attempted": report.totals.attempted,
    }


def bare(url: str) -> dict:
    with psycopg.connect(url) as conn:
        rows = conn.execute(PENDING).fetchall()
    started = time.perf_counter()
    with _session() as session:
        for delivery_id, target, body in rows:
            _post(session, target, delivery_id, bytes(body))
    return {"seconds": time.perf_counter() - started, "delivered": len(rows)}


def rejected(url: str) -> dict:
    started = time.perf_counter()
    delivered = 0
    with psycopg.connect(url, autocommit=True) as conn, _session() as session:
        for delivery_id, target, body in conn.execute(PENDING).fetchall():
            try:
                _post(session, target, delivery_id, bytes(body))
            except requests.RequestException:
                continue  # left pending for the next night
            conn.execute(MARK_SUCCEEDED, (delivery_id,))
            delivered += 1
    return {"seconds": time.perf_counter() - started, "delivered": delivered}


_local = threading.local()


def post_body(url: str, delivery_id: str, body: str) -> None:
    """The Procrastinate task: one POST, on a keep-alive session of its thread."""
    if not hasattr(_local, "session"):
        _local.session = _session()
    _post(_local.session, url, delivery_id, body.encode())


def procrastinate_app(url: str):
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))
    app.task(name=PROCRASTINATE_TASK, queue="webhooks")(post_body)
    return app


def install_procrastinate(url: str) -> None:
    """Procrastinate's schema in the database at ``url``."""
    app = procrastinate_app(url)
    with app.open():
        app.schema_manager.apply_schema()


def defer_procrastinate_jobs(url: str, chunk: int = 1000) -> int:
    """One Procrastinate job per pending delivery, with the same URL and body; then the jobs
    table is analyzed, as autovacuum would after such a load. Procrastinate's job fetch is
    planned from those statistics: without them its worker took 273-291 jobs/s here, with them
    403-424 (the issue measured it at about 390)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(PENDING).fetchall()
    app = procrastinate_app(url)
    with app.open():
        task = app.tasks[PROCRASTINATE_TASK]
        for start in range(0, len(rows), chunk):
            task.batch_defer(
                *(
                    {"url": target, "delivery_id": delivery_id, "body": bytes(body).decode()}
                    for delivery_id, target, body in rows[start : start + chunk]
                )
            )
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE procrastinate_jobs")
    return len(rows)


def procrastinate_worker(url: str, concurrency: int) -> dict:
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    app = procrastinate_app(url)

    async def work() -> float:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=concurrency))
        async with app.open_async():
            started = time.perf_counter()
            await app.run_worker_async(
                queues=["webhooks"],
                concurrency=concurrency,
                wait=False,
                install_signal_handlers=False,
            )
            return time.perf_counter() - started

    seconds = asyncio.run(work())
    with psycopg.connect(url) as conn:
        delivered = conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
        ).fetchone()[0]
    return {"seconds": seconds, "delivered": delivered}
