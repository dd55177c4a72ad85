"""Fan-out (issue 14): deliveries created per second by ``media-hooks emit --file`` of events
that fan out to 5 destinations each, against the same deliveries given one line each.

- ``events``: a JSON-lines file of N events (event_id, no destination); 5 destinations are
  subscribed to their type (exact names and a ``prefix.*``), so N x 5 deliveries are created.
- ``lines``: the same N x 5 deliveries as one line each (destination_id given): the bulk path
  before fan-out, as a reference.

Each run is a whole ``media-hooks emit --file`` process (interpreter start included) into a
fresh clone of a database holding the destinations. Prints the figures and writes them to
bench/results/fanout.json.

    python -m bench.fanout_rate [--events 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import psycopg

from bench.processes import REPO, python_command, run_measured
from bench.scratch import Scratch, postgres, server_url, write_results

TARGET_PER_SECOND = 20_000
FAN_OUT = 5
# Five publishers, subscribed by exact name and by prefix, plus one that never matches.
SUBSCRIPTIONS = {
    "pub-1": ["transcode.completed"],
    "pub-2": ["transcode.*"],
    "pub-3": ["transcode.completed", "rights.*"],
    "pub-4": [],  # every type
    "pub-5": ["transcode.*", "rights.updated"],
    "pub-other": ["rights.*"],
}


def _seed(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for destination_id, patterns in SUBSCRIPTIONS.items():
            conn.execute(
                "INSERT INTO webhook_destination (destination_id, url) VALUES (%s, %s)",
                (destination_id, f"http://127.0.0.1:9/{destination_id}"),
            )
            for pattern in patterns:
                conn.execute(
                    "INSERT INTO destination_subscription (destination_id, pattern) "
                    "VALUES (%s, %s)",
                    (destination_id, pattern),
                )


def _payload(n: int) -> dict[str, Any]:
    return {
        "rendition": "1080p",
        "codec": "h264",
        "duration_ms": 60_000 + n,
        "uri": f"s3://media/{n:07d}/1080p.mp4",
    }


def _write_files(folder: Path, events: int) -> tuple[Path, Path]:
    fanned = folder / "events.jsonl"
    single = folder / "lines.jsonl"
    targets = [d for d in SUBSCRIPTIONS if d != "pub-other"]
    with fanned.open("w") as out_events, single.open("w") as out_lines:
        for n in range(events):
            common = {
                "asset_id": f"asset-{n:07d}",
                "event_type": "transcode.completed",
                "payload": _payload(n),
            }
            out_events.write(json.dumps({"event_id": f"ev-{n:07d}", **common}) + "\n")
            for destination_id in targets:
                out_lines.write(json.dumps({"destination_id": destination_id, **common}) + "\n")
    return fanned, single


def _env(url: str, home: Path) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEDIA_HOOKS_", "DAGSTER_"))}
    env.update(MEDIA_HOOKS_DATABASE_URL=url, MEDIA_HOOKS_HOME=str(home), PYTHONPATH=str(REPO))
    return env


def _run(url: str, home: Path, path: Path, deliveries: int) -> float:
    finished = run_measured(
        python_command("media_hooks.cli", "emit", "--file", str(path)), _env(url, home)
    )
    if not finished.complete:
        raise RuntimeError(finished.failure())
    with psycopg.connect(url) as conn:
        (count,) = conn.execute("SELECT count(*) FROM webhook_delivery").fetchone()
    assert count == deliveries, (count, deliveries, finished.stdout)
    return deliveries / finished.seconds


def measure(events: int, rounds: int) -> dict[str, Any]:
    deliveries = events * FAN_OUT
    runs: dict[str, list[float]] = {"events": [], "lines": []}
    with Scratch(server_url(), "mh_bench_fanout") as scratch, tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        fanned, single = _write_files(folder, events)
        scratch.template("fanout", _seed)
        for _ in range(rounds):
            for name, path in (("events", fanned), ("lines", single)):
                with scratch.database("fanout") as url:
                    runs[name].append(_run(url, folder, path, deliveries))
        server = postgres(scratch.create(scratch.template("fanout")))
    figures = {
        name: {
            "median": statistics.median(values),
            "min": min(values),
            "max": max(values),
            "runs": values,
        }
        for name, values in runs.items()
    }
    median = figures["events"]["median"]
    return {
        "title": "Fan-out: deliveries/s created by emit --file of events to 5 destinations each",
        "command": f"python -m bench.fanout_rate --events {events} --rounds {rounds}",
        "size": {"events": events, "fan_out": FAN_OUT, "deliveries": deliveries},
        "postgres": server,
        "metric": "deliveries created per second, whole `media-hooks emit --file` process",
        "figures": figures,
        "target": {
            "what": "at least 20,000 deliveries/s through emit --file of fanning-out events",
            "value": median,
            "met": median >= TARGET_PER_SECOND,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    result = measure(args.events, args.rounds)
    path = write_results("fanout", result)
    for name, figure in result["figures"].items():
        print(f"{name:>7}: median {figure['median']:,.0f} deliveries/s (runs {figure['runs']})")
    print(f"target met: {result['target']['met']}; written to {path}")


if __name__ == "__main__":
    main()
