"""Bulk emit throughput: deliveries recorded per second through ``emit_many`` and ``emit --file``.

Usage: ``.venv/bin/python bench/bulk_emit.py [--rows 100000]``. Runs against the server of
``MEDIA_HOOKS_DATABASE_URL`` when set, otherwise the embedded default, in a fresh database it
creates (migrated, one destination) and drops afterwards. Prints the figures and writes them to
``bench/results/bulk_emit.json``. Target (issue 2): at least 20,000 deliveries/s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import psycopg
from scratch import scratch_database, write_results

from media_hooks.config import Settings
from media_hooks.destinations import DestinationSpec, upsert_destination
from media_hooks.emit import Event, emit_jsonl, emit_many

REPO = Path(__file__).resolve().parent.parent
DESTINATION = "bench-publisher"
TARGET_PER_SECOND = 20_000


def events(rows: int, run: str) -> Iterator[Event]:
    """Realistic transcoding events, each a new delivery (ids derived from the event)."""
    for n in range(rows):
        yield Event(
            destination_id=DESTINATION,
            asset_id=f"asset-{run}-{n:07d}",
            event_type="transcode.completed",
            payload={
                "rendition": "1080p",
                "codec": "h264",
                "duration_ms": 60_000 + n,
                "bytes": 250_000_000 + n,
                "uri": f"s3://media/{run}/{n:07d}/1080p.mp4",
            },
        )


def write_jsonl(path: Path, rows: int, run: str) -> None:
    with path.open("w", encoding="utf-8") as out:
        for event in events(rows, run):
            record = {
                "destination_id": event.destination_id,
                "asset_id": event.asset_id,
                "event_type": event.event_type,
                "payload": event.payload,
            }
            out.write(json.dumps(record, separators=(",", ":")) + "\n")


def backend_cpu_seconds(pid: int) -> float | None:
    """CPU time of a local PostgreSQL backend (None when it is not on this machine): on a shared
    machine, wall time measures the neighbours too."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(label: str, rows: int, action, backend_pid: int | None = None) -> dict:
    server_before = backend_cpu_seconds(backend_pid) if backend_pid else None
    client_before = time.process_time()
    started = time.perf_counter()
    result = action()
    seconds = time.perf_counter() - started
    figure = {"rows": rows, "seconds": round(seconds, 3), "per_second": round(rows / seconds)}
    line = f"{label:<44} {rows:>7} rows  {seconds:6.2f} s  {figure['per_second']:>7} /s"
    if server_before is not None:
        client = time.process_time() - client_before
        server = backend_cpu_seconds(backend_pid) - server_before
        figure.update(client_cpu_seconds=round(client, 2), server_cpu_seconds=round(server, 2))
        line += f"  (cpu: client {client:.2f} s, server {server:.2f} s)"
    print(f"{line}  {result}")
    return figure


def bench(url: str, rows: int) -> dict:
    with psycopg.connect(url) as conn:
        pid = conn.info.backend_pid
        batch = list(events(rows, "api"))
        figures = {}

        def api():
            counts = emit_many(conn, batch)
            conn.commit()
            return counts

        figures["emit_many"] = timed("emit_many (Python API, one transaction)", rows, api, pid)
        figures["emit_many_again"] = timed("emit_many again (all already present)", rows, api, pid)

        with tempfile.TemporaryDirectory() as folder:
            inprocess = Path(folder) / "inprocess.jsonl"
            write_jsonl(inprocess, rows, "jsonl")

            def jsonl():
                with inprocess.open("rb") as source:
                    counts = emit_jsonl(conn, source)
                conn.commit()
                return counts

            figures["emit_jsonl"] = timed("emit_jsonl (file parsing, in process)", rows, jsonl, pid)

            cli_file = Path(folder) / "cli.jsonl"
            write_jsonl(cli_file, rows, "cli")
            env = dict(os.environ, MEDIA_HOOKS_DATABASE_URL=url)
            command = [sys.executable, "-m", "media_hooks.cli", "emit", "--file", str(cli_file)]

            def cli():
                done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=REPO)
                if done.returncode != 0:
                    raise SystemExit(f"emit --file failed: {done.stderr.strip()}")
                return done.stdout.strip()

            figures["cli_emit_file"] = timed("media-hooks emit --file (whole process)", rows, cli)
        total = conn.execute("SELECT count(*) FROM webhook_delivery").fetchone()[0]
        assert total == 3 * rows, f"expected {3 * rows} deliveries, found {total}"
        figures["server_version"] = conn.info.parameter_status("server_version")
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    args = parser.parse_args()
    settings = Settings.from_env()
    load_average = round(os.getloadavg()[0], 2)
    with scratch_database() as url:
        with psycopg.connect(url, autocommit=True) as conn:
            spec = DestinationSpec(DESTINATION, "http://127.0.0.1:9/hooks", rate_per_second=1000)
            upsert_destination(conn, spec, replace(settings, allow_private_urls=True))
        figures = bench(url, args.rows)
    slowest = min(figures[k]["per_second"] for k in ("emit_many", "emit_jsonl"))
    document = {
        "benchmark": "bulk_emit",
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "database": "embedded" if settings.database_url is None else "MEDIA_HOOKS_DATABASE_URL",
        "load_average_at_start": load_average,
        "target_per_second": TARGET_PER_SECOND,
        "meets_target": slowest >= TARGET_PER_SECOND,
        "command": "python bench/bulk_emit.py --rows " + str(args.rows),
        **figures,
    }
    path = write_results("bulk_emit", document)
    print(f"target {TARGET_PER_SECOND}/s met: {document['meets_target']} -> {path}")
    return 0 if document["meets_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
