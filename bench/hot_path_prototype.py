"""Issue 34, parts 2 and 3: what a delivery costs the database in today's layout and in the
proposed one (docs/design/hot-path.md), measured on throwaway databases.

    python -m bench.hot_path_prototype --deliveries 20000 --out DIR

Both layouts go through the same life, one delivery at a time in pages, on one connection (no
concurrency: this measures what each statement writes, not how fast): emit in transactions of
1,000, then claim a page of 250 per destination, lease in steps of 25, record each step's
outcomes (``--fail-percent`` of attempts retryable, until they succeed: due again at once in
``proposed``; in ``current``, whose record decides the backoff, after the shortest it honours,
0.1 s, which the run waits for), then purge every terminal delivery. For each phase: WAL bytes
per delivery (``pg_current_wal_lsn``), and for each table its inserts, updates, HOT updates and
deletes;
where the server has pg_walinspect with ``pg_get_wal_block_info`` (PostgreSQL 16 and later),
the WAL of each phase by relation and by kind of record (``bench.wal``).

- ``current``: the project's migrated schema and its own statements (``emit_many``,
  ``claim_destination_page``, ``lease_with_permits``, ``record_classified``,
  ``purge_terminal_batch``).
- ``proposed``: the prototype DDL below (a narrow hot row with no index on a column that
  changes; a narrow timer table for the claim and the sweeps; the immutable payload and body
  written once in a table of their own; outbox and attempt rows written once; terminal
  history in daily partitions, dropped whole), with statements that do what the project's do.
  ``--fillfactor`` sets the hot row's.

Writes ``hot_path_prototype.json`` to ``--out`` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from bench import wal
from bench.scratch import Destination, Scratch, add_destinations, machine, postgres, server_url

PAGE = 250
STEP = 25
EMIT_BATCH = 1000
DESTINATIONS = 4
PAD = "x" * 250

# The prototype: see docs/design/hot-path.md for each choice.
PROPOSED_DDL = """
CREATE TABLE p_destination (destination_id text PRIMARY KEY);

-- Identity: written once at emit, never updated; expired row by row after the duplicate window.
CREATE TABLE p_identity (
    delivery_id text PRIMARY KEY, destination_id text NOT NULL, created_at timestamptz NOT NULL);
CREATE INDEX p_identity_created ON p_identity (created_at);

-- The immutable part, written once: payload, body and what never changes.
CREATE TABLE p_body (
    delivery_id text NOT NULL, created_at timestamptz NOT NULL, destination_id text NOT NULL,
    asset_id text NOT NULL, event_type text NOT NULL, payload jsonb NOT NULL, body bytea NOT NULL,
    emit_seq bigint
) PARTITION BY RANGE (created_at);
CREATE INDEX p_body_id ON p_body (delivery_id);

-- The hot row: open deliveries only; no index on a column any transition changes.
CREATE TABLE p_state (
    delivery_id text PRIMARY KEY, destination_id text NOT NULL, asset_id text NOT NULL,
    event_type text NOT NULL, created_at timestamptz NOT NULL, emit_seq bigint,
    state text NOT NULL DEFAULT 'pending', attempt_count integer NOT NULL DEFAULT 0,
    budget_used integer NOT NULL DEFAULT 0, budget_started_at timestamptz NOT NULL DEFAULT now(),
    dispatch_count integer NOT NULL DEFAULT 0, next_attempt_at timestamptz NOT NULL DEFAULT now(),
    lease_until timestamptz, lease_token uuid, lease_started_at timestamptz, lease_run_id text,
    current_message_id text, last_outcome text, last_error text, wait_reason text,
    updated_at timestamptz NOT NULL DEFAULT now(), closed_reason text, closed_by text
) WITH (fillfactor = {fillfactor});
-- Per-asset order: immutable columns only, so no transition is kept from HOT by it.
CREATE INDEX p_state_asset_queue ON p_state (destination_id, asset_id, created_at, emit_seq)
    INCLUDE (event_type);

-- The timer: when the claim may take a delivery (kind 'due'), or when a sweep must look at
-- one in flight (kind 'inflight'). Insert at emit, update at claim, delete at the end.
CREATE TABLE p_timer (
    delivery_id text PRIMARY KEY, destination_id text NOT NULL, kind text NOT NULL,
    fire_at timestamptz NOT NULL);
CREATE INDEX p_timer_due ON p_timer (destination_id, fire_at, delivery_id) WHERE kind = 'due';
CREATE INDEX p_timer_inflight ON p_timer (fire_at) WHERE kind = 'inflight';

-- History, written once, in daily partitions dropped whole.
CREATE TABLE p_outbox (
    message_id text NOT NULL, delivery_id text NOT NULL, dispatch_no integer NOT NULL,
    destination_id text NOT NULL, run_id text NOT NULL, created_at timestamptz NOT NULL,
    published_at timestamptz
) PARTITION BY RANGE (created_at);
CREATE INDEX p_outbox_delivery ON p_outbox (delivery_id);
CREATE INDEX p_outbox_run ON p_outbox (run_id, destination_id);

CREATE TABLE p_attempt (
    delivery_id text NOT NULL, attempt_no integer NOT NULL, destination_id text NOT NULL,
    message_id text, run_id text, lease_token uuid, started_at timestamptz NOT NULL,
    finished_at timestamptz NOT NULL, outcome text, http_status integer, error text,
    response_excerpt text, next_attempt_at timestamptz, retry_reason text
) PARTITION BY RANGE (finished_at);
CREATE INDEX p_attempt_delivery ON p_attempt (delivery_id, attempt_no);
CREATE INDEX p_attempt_started ON p_attempt (started_at);

CREATE TABLE p_done (
    delivery_id text NOT NULL, destination_id text NOT NULL, asset_id text NOT NULL,
    event_type text NOT NULL, created_at timestamptz NOT NULL, state text NOT NULL,
    attempt_count integer NOT NULL, last_outcome text, last_error text, wait_reason text,
    closed_reason text, closed_by text, finished_at timestamptz NOT NULL
) PARTITION BY RANGE (finished_at);
CREATE INDEX p_done_delivery ON p_done (delivery_id);
CREATE INDEX p_done_dead ON p_done (destination_id, finished_at) WHERE state = 'dead';
"""
PARTITIONED = ("p_body", "p_outbox", "p_attempt", "p_done")

P_EMIT = """
WITH wanted AS (
    SELECT * FROM unnest(%(ids)s::text[], %(destinations)s::text[], %(assets)s::text[],
                         %(payloads)s::text[]) AS w(delivery_id, destination_id, asset_id, payload)
),
identity AS (
    INSERT INTO p_identity (delivery_id, destination_id, created_at)
    SELECT delivery_id, destination_id, now() FROM wanted
    ON CONFLICT (delivery_id) DO NOTHING
    RETURNING delivery_id
),
born AS (
    SELECT w.*, nextval('p_emit_seq') AS emit_seq FROM wanted AS w JOIN identity USING (delivery_id)
),
bodies AS (
    INSERT INTO p_body (delivery_id, created_at, destination_id, asset_id, event_type, payload,
                        body, emit_seq)
    SELECT delivery_id, now(), destination_id, asset_id, 'transcode.completed', payload::jsonb,
           convert_to(payload, 'UTF8'), emit_seq
    FROM born
),
states AS (
    INSERT INTO p_state (delivery_id, destination_id, asset_id, event_type, created_at, emit_seq)
    SELECT delivery_id, destination_id, asset_id, 'transcode.completed', now(), emit_seq FROM born
)
INSERT INTO p_timer (delivery_id, destination_id, kind, fire_at)
SELECT delivery_id, destination_id, 'due', now() FROM born
"""
P_CLAIM = """
WITH due AS (
    SELECT t.delivery_id
    FROM p_timer AS t
    WHERE t.destination_id = %(destination_id)s AND t.kind = 'due' AND t.fire_at <= now()
    ORDER BY t.fire_at, t.delivery_id
    LIMIT %(page)s
    FOR UPDATE SKIP LOCKED
),
timers AS (
    UPDATE p_timer AS t SET kind = 'inflight', fire_at = now() + interval '90 seconds'
    WHERE t.delivery_id = ANY (ARRAY(SELECT delivery_id FROM due))
    RETURNING t.delivery_id
),
enqueued AS (
    UPDATE p_state AS s
    SET state = 'enqueued', dispatch_count = s.dispatch_count + 1,
        current_message_id = s.delivery_id || ':' || (s.dispatch_count + 1), wait_reason = NULL,
        updated_at = now()
    WHERE s.delivery_id = ANY (ARRAY(SELECT delivery_id FROM timers))
    RETURNING s.delivery_id, s.destination_id, s.dispatch_count, s.current_message_id
)
INSERT INTO p_outbox (message_id, delivery_id, dispatch_no, destination_id, run_id, created_at,
                      published_at)
SELECT current_message_id, delivery_id, dispatch_count, destination_id, %(run_id)s, now(), now()
FROM enqueued
RETURNING message_id, delivery_id
"""
P_LEASE = """
WITH leased AS (
    UPDATE p_state AS s
    SET state = 'leased', lease_token = gen_random_uuid(),
        lease_until = now() + interval '90 seconds', lease_started_at = now(),
        lease_run_id = %(run_id)s, attempt_count = s.attempt_count + 1,
        budget_used = s.budget_used + 1, updated_at = now()
    FROM unnest(%(ids)s::text[], %(messages)s::text[]) AS w(delivery_id, message_id)
    WHERE s.delivery_id = w.delivery_id AND s.current_message_id = w.message_id
      AND s.state = 'enqueued'
    RETURNING s.delivery_id, s.created_at, s.lease_token, s.attempt_count
)
SELECT l.delivery_id, l.lease_token, l.attempt_count, b.body
FROM leased AS l
JOIN p_body AS b ON b.delivery_id = l.delivery_id AND b.created_at = l.created_at
"""
P_RECORD = """
WITH result AS (
    SELECT * FROM unnest(%(ids)s::text[], %(tokens)s::uuid[], %(outcomes)s::text[])
                  AS r(delivery_id, lease_token, outcome)
),
finished AS (
    DELETE FROM p_state AS s USING result AS r
    WHERE s.delivery_id = r.delivery_id AND s.lease_token = r.lease_token
      AND r.outcome = 'success'
    RETURNING s.*, r.outcome
),
retried AS (
    UPDATE p_state AS s
    SET state = 'pending', next_attempt_at = now(), lease_until = NULL, lease_token = NULL,
        lease_started_at = NULL, lease_run_id = NULL, last_outcome = r.outcome,
        last_error = 'HTTP 500', wait_reason = 'backoff', updated_at = now()
    FROM result AS r
    WHERE s.delivery_id = r.delivery_id AND s.lease_token = r.lease_token
      AND r.outcome <> 'success'
    RETURNING s.delivery_id, s.destination_id, s.attempt_count, s.current_message_id,
              s.lease_run_id, r.lease_token, r.outcome, s.next_attempt_at
),
moved AS (
    SELECT f.delivery_id, f.destination_id, f.attempt_count, f.current_message_id,
           f.lease_run_id, f.lease_token, f.lease_started_at, f.outcome, NULL::timestamptz AS due
    FROM finished AS f
    UNION ALL
    SELECT r.delivery_id, r.destination_id, r.attempt_count, r.current_message_id,
           r.lease_run_id, r.lease_token, now(), r.outcome, r.next_attempt_at
    FROM retried AS r
),
attempts AS (
    INSERT INTO p_attempt (delivery_id, attempt_no, destination_id, message_id, run_id,
                           lease_token, started_at, finished_at, outcome, http_status,
                           next_attempt_at)
    SELECT delivery_id, attempt_count, destination_id, current_message_id, lease_run_id,
           lease_token, coalesce(lease_started_at, now()), now(), outcome,
           CASE WHEN outcome = 'success' THEN 200 ELSE 500 END, due
    FROM moved
),
done AS (
    INSERT INTO p_done (delivery_id, destination_id, asset_id, event_type, created_at, state,
                        attempt_count, last_outcome, finished_at)
    SELECT delivery_id, destination_id, asset_id, event_type, created_at, 'succeeded',
           attempt_count, outcome, now()
    FROM finished
),
timers_done AS (
    DELETE FROM p_timer AS t USING finished AS f WHERE t.delivery_id = f.delivery_id
)
UPDATE p_timer AS t SET kind = 'due', fire_at = r.next_attempt_at
FROM retried AS r WHERE t.delivery_id = r.delivery_id
"""
P_EXPIRE_IDENTITY = """
WITH expired AS (
    SELECT i.delivery_id FROM p_identity AS i
    WHERE i.created_at < %(cutoff)s
      AND NOT EXISTS (SELECT 1 FROM p_state AS s WHERE s.delivery_id = i.delivery_id)
    ORDER BY i.created_at LIMIT 1000 FOR UPDATE SKIP LOCKED
)
DELETE FROM p_identity AS i USING expired AS e WHERE i.delivery_id = e.delivery_id
"""

TABLES_CURRENT = ("webhook_delivery", "dispatch_outbox_v2", "delivery_attempt", "delivery_identity",
                  "destination_limiter")  # fmt: skip
TABLES_PROPOSED = ("p_state", "p_timer", "p_identity", "p_body", "p_outbox", "p_attempt",
                   "p_done")  # fmt: skip
COUNTERS = """
SELECT relname AS name, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del
FROM pg_stat_user_tables WHERE relname LIKE ANY (%(patterns)s)
"""


SIZES = """
SELECT c.relname AS name, pg_total_relation_size(c.oid) AS bytes
FROM pg_class AS c
WHERE c.relkind IN ('r', 'p') AND c.relname LIKE ANY (%(patterns)s)
"""


def bytes_per_delivery(
    conn: psycopg.Connection, tables: tuple[str, ...], deliveries: int
) -> dict[str, float]:
    """Each table's heap, indexes and TOAST (its partitions' summed) per delivery."""
    totals = dict.fromkeys(tables, 0)
    for row in conn.execute(SIZES, {"patterns": [f"{t}%" for t in tables]}):
        table = max((t for t in tables if row["name"].startswith(t)), key=len)
        totals[table] += row["bytes"]
    return {table: round(total / deliveries, 1) for table, total in totals.items()}


def footprint(conn: psycopg.Connection, tables: tuple[str, ...], deliveries: int) -> dict:
    """Bytes per delivered delivery as the delivery left the tables, and after a VACUUM (what
    a table settles at when vacuum keeps up: dead versions' space reused)."""
    before = bytes_per_delivery(conn, tables, deliveries)
    conn.execute("VACUUM")
    return {"as_written": before, "after_vacuum": bytes_per_delivery(conn, tables, deliveries)}


class Meter:
    """WAL and table counters around a phase, on one connection."""

    def __init__(self, conn: psycopg.Connection, tables: tuple[str, ...]) -> None:
        self.conn = conn
        self.patterns = [f"{t}%" for t in tables]
        self.tables = tables
        self.block_info = wal.has_block_info(conn)

    def _counters(self) -> dict[str, dict[str, int]]:
        self.conn.execute("SELECT pg_stat_force_next_flush()")
        self.conn.execute("SELECT pg_stat_clear_snapshot()")
        totals: dict[str, dict[str, int]] = {t: {} for t in self.tables}
        for row in self.conn.execute(COUNTERS, {"patterns": self.patterns}):
            table = max((t for t in self.tables if row["name"].startswith(t)), key=len)
            for key in ("n_tup_ins", "n_tup_upd", "n_tup_hot_upd", "n_tup_del"):
                totals[table][key] = totals[table].get(key, 0) + row[key]
        return totals

    def phase(self, deliveries: int, action: Callable[[], None]) -> dict[str, Any]:
        before_counters = self._counters()
        before = self.conn.execute("SELECT pg_current_wal_insert_lsn() AS lsn").fetchone()["lsn"]
        began = time.monotonic()
        action()
        seconds = time.monotonic() - began
        after = self.conn.execute("SELECT pg_current_wal_insert_lsn() AS lsn").fetchone()["lsn"]
        after_counters = self._counters()
        written = self.conn.execute(
            "SELECT pg_wal_lsn_diff(%s, %s)::bigint AS bytes", (after, before)
        ).fetchone()["bytes"]
        per_table = {}
        for table in self.tables:
            delta = {
                k: after_counters[table].get(k, 0) - before_counters[table].get(k, 0)
                for k in ("n_tup_ins", "n_tup_upd", "n_tup_hot_upd", "n_tup_del")
            }
            # (A partition dropped in the phase takes its counters with it: no figure then.)
            per_table[table] = {
                k.removeprefix("n_tup_"): round(v / deliveries, 3) if v >= 0 else None
                for k, v in delta.items()
            }
            per_table[table]["hot_ratio"] = (
                round(delta["n_tup_hot_upd"] / delta["n_tup_upd"], 3)
                if delta["n_tup_upd"]
                else None
            )
        found = {
            "seconds": round(seconds, 2),
            "wal_bytes_per_delivery": round(written / deliveries, 1),
            "per_delivery": per_table,
        }
        if self.block_info:
            kinds, _ = wal.by_kind(self.conn, before, after)
            found["wal_by_kind_per_delivery"] = wal.per_delivery(kinds, deliveries)
            found["wal_by_relation_per_delivery"] = wal.per_delivery(
                wal.by_relation(self.conn, before, after), deliveries
            )
        return found


def _outcome(n: int, fail_percent: int) -> str:
    return "retryable" if (n * 7919) % 100 < fail_percent else "success"


# Today's layout, through the project's own functions ------------------------------------------


def run_current(url: str, deliveries: int, fail_percent: int) -> dict[str, Any]:
    from media_hooks.outbox import claims, leases
    from media_hooks.outbox.cohort import Cohort
    from media_hooks.outbox.emit import Event, emit_many
    from media_hooks.outbox.leases import Classified
    from media_hooks.store.sqlfiles import query

    destinations = [f"dest-{n}" for n in range(1, DESTINATIONS + 1)]
    add_destinations(
        url, [Destination(d, f"http://127.0.0.1:9/{d}", max_in_flight=STEP) for d in destinations]
    )
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        # The database decides when a retry is due: the shortest backoff it honours (0.1 s).
        conn.execute(
            "UPDATE webhook_destination SET backoff_base_seconds = 0.1, backoff_cap_seconds = 0.1"
        )
        meter = Meter(conn, TABLES_CURRENT)

        def emit() -> None:
            for start in range(0, deliveries, EMIT_BATCH):
                with conn.transaction():
                    emit_many(
                        conn,
                        (
                            Event(destinations[n % DESTINATIONS], f"asset-{n % 10007}",
                                  "transcode.completed", {"n": n, "rendition": "1080p", "pad": PAD},
                                  f"p-{n}")
                            for n in range(start, min(start + EMIT_BATCH, deliveries))
                        ),
                    )  # fmt: skip

        attempts = [0]
        # Each destination's permits of its last step, handed back with its next one.
        returned: dict[str, list[int]] = {d: [] for d in destinations}

        def deliver() -> None:
            run_id = "run-prototype"
            while True:
                moved = 0
                for destination in destinations:
                    page = claims.claim_destination_page(conn, run_id, destination, Cohort(), PAGE)
                    moved += len(page)
                    for at in range(0, len(page), STEP):
                        step = leases.lease_with_permits(
                            conn, run_id, destination, page[at : at + STEP], holder=run_id,
                            lease_seconds=90, release_slots=returned[destination],
                        )  # fmt: skip
                        returned[destination] = step.grant.slots
                        outcomes = []
                        for lease in step.leases:
                            attempts[0] += 1
                            outcome = _outcome(attempts[0], fail_percent)
                            outcomes.append(
                                Classified(lease, outcome, 200 if outcome == "success" else 500,
                                           None, None if outcome == "success" else "HTTP 500",
                                           None, time.monotonic())
                            )  # fmt: skip
                        leases.record_classified(conn, outcomes)
                if moved == 0:
                    # Nothing due: done, unless retries wait for their backoff.
                    wait = conn.execute(
                        "SELECT extract(epoch FROM min(next_attempt_at) - now()) AS s"
                        " FROM webhook_delivery WHERE state = 'pending'"
                    ).fetchone()["s"]
                    if wait is None:
                        return
                    time.sleep(max(float(wait), 0.0))

        def purge() -> None:
            while True:
                row = conn.execute(
                    query("purge_terminal_batch"), {"cutoff": "infinity", "batch_size": 1000}
                ).fetchone()
                if row["deliveries"] == 0:
                    return

        phases = {
            "emit": meter.phase(deliveries, emit),
            "deliver": meter.phase(deliveries, deliver),
            "bytes_per_delivery": footprint(conn, meter.tables, deliveries),
        }
        return {
            **phases,
            "retention": meter.phase(deliveries, purge),
            "attempts_per_delivery": round(attempts[0] / deliveries, 3),
        }


# The proposed layout --------------------------------------------------------------------------


def run_proposed(url: str, deliveries: int, fail_percent: int, fillfactor: int) -> dict[str, Any]:
    destinations = [f"dest-{n}" for n in range(1, DESTINATIONS + 1)]
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        conn.execute(PROPOSED_DDL.format(fillfactor=fillfactor))
        conn.execute("CREATE SEQUENCE p_emit_seq")
        for table in PARTITIONED:
            conn.execute(
                f"CREATE TABLE {table}_today PARTITION OF {table}"
                " FOR VALUES FROM (now() - interval '1 day') TO (now() + interval '1 day')"
            )
        meter = Meter(conn, TABLES_PROPOSED)

        def emit() -> None:
            for start in range(0, deliveries, EMIT_BATCH):
                numbers = range(start, min(start + EMIT_BATCH, deliveries))
                conn.execute(
                    P_EMIT,
                    {
                        "ids": [f"p-{n}" for n in numbers],
                        "destinations": [destinations[n % DESTINATIONS] for n in numbers],
                        "assets": [f"asset-{n % 10007}" for n in numbers],
                        "payloads": [
                            json.dumps({"n": n, "rendition": "1080p", "pad": PAD}) for n in numbers
                        ],
                    },
                )

        attempts = [0]

        def deliver() -> None:
            while True:
                moved = 0
                for destination in destinations:
                    run_id = f"run-{uuid.uuid4().hex[:8]}"
                    page = conn.execute(
                        P_CLAIM, {"destination_id": destination, "page": PAGE, "run_id": run_id}
                    ).fetchall()
                    moved += len(page)
                    for at in range(0, len(page), STEP):
                        offered = page[at : at + STEP]
                        leased = conn.execute(
                            P_LEASE,
                            {
                                "run_id": run_id,
                                "ids": [m["delivery_id"] for m in offered],
                                "messages": [m["message_id"] for m in offered],
                            },
                        ).fetchall()
                        outcomes = []
                        for _ in leased:
                            attempts[0] += 1
                            outcomes.append(_outcome(attempts[0], fail_percent))
                        conn.execute(
                            P_RECORD,
                            {
                                "ids": [lease["delivery_id"] for lease in leased],
                                "tokens": [lease["lease_token"] for lease in leased],
                                "outcomes": outcomes,
                            },
                        )
                if moved == 0:
                    return

        def purge() -> None:
            for table in PARTITIONED:
                conn.execute(f"DROP TABLE {table}_today")
            while conn.execute(P_EXPIRE_IDENTITY, {"cutoff": "infinity"}).rowcount:
                pass

        phases = {
            "emit": meter.phase(deliveries, emit),
            "deliver": meter.phase(deliveries, deliver),
            "bytes_per_delivery": footprint(conn, meter.tables, deliveries),
        }
        return {
            **phases,
            "retention": meter.phase(deliveries, purge),
            "attempts_per_delivery": round(attempts[0] / deliveries, 3),
        }


def render(document: dict[str, Any]) -> str:
    lines = [
        "| layout | emit WAL B/delivery | deliver WAL B/delivery | retention WAL B/delivery "
        "| hot row updates/delivery | HOT ratio (hot row) | disk B/delivery after VACUUM |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, result in document["layouts"].items():
        hot = "webhook_delivery" if name == "current" else "p_state"
        deliver = result["deliver"]["per_delivery"][hot]
        lines.append(
            f"| {name} | {result['emit']['wal_bytes_per_delivery']:,.0f} | "
            f"{result['deliver']['wal_bytes_per_delivery']:,.0f} | "
            f"{result['retention']['wal_bytes_per_delivery']:,.0f} | {deliver['upd']} | "
            f"{deliver['hot_ratio']} | "
            f"{sum(result['bytes_per_delivery']['after_vacuum'].values()):,.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hot_path_prototype", description=__doc__)
    parser.add_argument("--deliveries", type=int, default=20_000)
    parser.add_argument("--fail-percent", type=int, default=10)
    parser.add_argument(
        "--fillfactor", type=int, action="append", help="repeatable; default 100, 70 and 50"
    )
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args(argv)
    server = server_url()
    layouts: dict[str, Any] = {}
    with Scratch(server, "mh_hot_path") as scratch:
        with scratch.database() as url:
            layouts["current"] = run_current(url, args.deliveries, args.fail_percent)
        for fillfactor in args.fillfactor or [100, 70, 50]:
            url = scratch.create()
            layouts[f"proposed_ff{fillfactor}"] = run_proposed(
                url, args.deliveries, args.fail_percent, fillfactor
            )
    document = {
        "command": " ".join(["python -m bench.hot_path_prototype", *(argv or sys.argv[1:])]),
        "deliveries": args.deliveries,
        "fail_percent": args.fail_percent,
        "machine": machine(),
        "postgres": postgres(server),
        "layouts": layouts,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "hot_path_prototype.json").write_text(json.dumps(document, indent=2) + "\n")
    print(render(document))
    return 0


if __name__ == "__main__":
    sys.exit(main())
