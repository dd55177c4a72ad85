"""(1) Emit: deliveries recorded per second in bulk, against a bare COPY of the same rows.

- ``emit_many``: the producer's API (``media_hooks.outbox.emit.emit_many``), one transaction: it
  validates each event, serializes its body, stages the rows with COPY and records the new
  ones in one INSERT.
- ``emit --file``: ``media-hooks emit --file`` on a JSON-lines file, the whole process
  (interpreter start, parsing, the same bulk path).
- ``bare COPY``: the rows ``emit_many`` wrote (read back from its database: the same ids,
  bodies and timestamps) copied straight into the tables it wrote them to (identity, body,
  state, timer) with binary COPY, one transaction: the floor of writing them, with no
  validation, no staging and no conflict check.

Each run writes into a fresh clone of a database holding one destination.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from bench import stats
from bench.processes import python_command, run_measured
from bench.scratch import Destination, add_destinations
from bench.session import Session
from media_hooks.outbox.emit import Event, emit_many

DESTINATION = "bench-publisher"
# Issue 2's target for bulk emit.
TARGET_PER_SECOND = 20_000
# What emit_many writes for a delivery, table by table (sql/queries/emit.sql), in the order
# COPY writes them: each table's columns and their types.
WRITTEN = {
    "delivery_identity": (
        "delivery_id, destination_id, created_at",
        ["text", "text", "timestamptz"],
    ),
    "delivery_body": (
        "delivery_id, created_at, payload, body",
        ["text", "timestamptz", "jsonb", "bytea"],
    ),
    "delivery_state": (
        "delivery_id, destination_id, asset_id, event_type, created_at, updated_at, "
        "next_attempt_at, budget_started_at, emit_seq, wait_reason, queued",
        ["text"] * 4 + ["timestamptz"] * 4 + ["int8", "text", "bool"],
    ),
    "delivery_timer": (
        "delivery_id, destination_id, kind, fire_at",
        ["text", "text", "text", "timestamptz"],
    ),
}


def events(rows: int) -> Iterator[Event]:
    """Realistic transcoding events, each a new delivery (ids derived from the event)."""
    for n in range(rows):
        yield Event(
            destination_id=DESTINATION,
            asset_id=f"asset-{n:07d}",
            event_type="transcode.completed",
            payload={
                "rendition": "1080p",
                "codec": "h264",
                "duration_ms": 60_000 + n,
                "bytes": 250_000_000 + n,
                "uri": f"s3://media/{n:07d}/1080p.mp4",
            },
        )


def _one_destination(url: str) -> None:
    add_destinations(url, [Destination(DESTINATION, "http://127.0.0.1:9/hooks", 1000, 10)])


def _emit_many(url: str, batch: list[Event]) -> dict[str, Any]:
    with psycopg.connect(url) as conn:
        started = time.perf_counter()
        counts = emit_many(conn, batch)
        conn.commit()
        seconds = time.perf_counter() - started
    assert counts.inserted == len(batch), counts
    return {"per_second": len(batch) / seconds}


def _emit_file(session: Session, url: str, path: Path, rows: int) -> dict[str, Any]:
    command = python_command("media_hooks.cli", "emit", "--file", str(path))
    finished = run_measured(command, env=session.env(url), timeout=session.size.run_timeout)
    if not finished.complete:
        return {"per_second": None, "complete": False, "error": finished.failure()}
    return {"per_second": rows / finished.seconds}


def _written_rows(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """The rows as ``emit_many`` wrote them, table by table, ready for COPY (a payload as its
    JSON text: COPY sends it without parsing it in Python)."""
    written = {}
    with psycopg.connect(url) as conn:
        for table, (columns, _) in WRITTEN.items():
            names = columns.split(", ")
            read = ", ".join("payload::text" if n == "payload" else n for n in names)
            rows = conn.execute(f"SELECT {read} FROM {table}").fetchall()
            if "payload" in names:
                at = names.index("payload")
                rows = [(*r[:at], Jsonb(r[at], dumps=str), *r[at + 1 :]) for r in rows]
            written[table] = rows
    return written


def _bare_copy(url: str, written: dict[str, list[tuple[Any, ...]]]) -> dict[str, Any]:
    with psycopg.connect(url) as conn:
        started = time.perf_counter()
        with conn.cursor() as cur:
            for table, (columns, types) in WRITTEN.items():
                with cur.copy(f"COPY {table} ({columns}) FROM STDIN (FORMAT binary)") as copy:
                    copy.set_types(types)
                    for row in written[table]:
                        copy.write_row(row)
        conn.commit()
        rows = len(written["delivery_state"])
        return {"per_second": rows / (time.perf_counter() - started)}


def measure(session: Session) -> dict[str, Any]:
    rows = session.size.emit_rows
    batch = list(events(rows))
    template = "one-destination"
    session.scratch.template(template, _one_destination)
    with tempfile.TemporaryDirectory(dir=session.home) as folder:
        jsonl = Path(folder) / "events.jsonl"
        with jsonl.open("w", encoding="utf-8") as out:
            for event in batch:
                record = {k: v for k, v in vars(event).items() if v is not None}
                out.write(json.dumps(record, separators=(",", ":")) + "\n")
        with session.scratch.database(template) as url:
            _emit_many(url, batch)
            written = _written_rows(url)

        def fresh(action):
            def run() -> dict[str, Any]:
                with session.scratch.database(template) as url:
                    return action(url)

            return run

        runs = session.interleaved(
            {
                "emit_many": fresh(lambda url: _emit_many(url, batch)),
                "emit_file": fresh(lambda url: _emit_file(session, url, jsonl, rows)),
                "bare_copy": fresh(lambda url: _bare_copy(url, written)),
            },
        )
    figures = stats.summarize(runs, ["per_second"])
    return {
        "title": "Emit: bulk rows/s vs bare COPY of the same rows",
        "metrics": {"per_second": "rows/s"},
        "size": {"rows": rows, "destinations": 1},
        "figures": figures,
        "ratios": stats.ratios(
            figures, [("emit_many", "bare_copy"), ("emit_file", "bare_copy")], "per_second"
        ),
        "targets": [
            stats.target(
                "bulk emit (emit_many) at least 20,000 rows/s (issue 2)",
                figures["emit_many"]["per_second"]["median"],
                TARGET_PER_SECOND,
            )
        ],
        "notes": [
            "emit --file is a whole `media-hooks emit --file` process, interpreter start "
            "included: at small sizes the start dominates.",
        ],
    }
