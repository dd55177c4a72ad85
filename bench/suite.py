"""The benchmark suite: every measurement in one session, then the JSON, the plots, the report.

A measurement is a function from the session to a document (``title``, ``size``,
``metrics``, ``figures``, ``ratios``, ``targets``, ``notes``; see ``bench.report`` for how
each is shown). A measurement that fails is recorded with its error and the others go on.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import (
    celery,
    claim_rate,
    deliver_rate,
    emit_rate,
    fidelity,
    latency,
    memory,
    node_rate,
    plots,
    processes,
    publishers,
    report,
    sustained,
)
from bench.processes import REPO
from bench.scratch import machine, postgres
from bench.session import Session, session
from bench.sizes import Size

# In the order they run. Memory runs last: its runs are watched for a fixed time anyway, so
# when the session's time limit comes first it shortens them instead of skipping a section.
MEASUREMENTS: dict[str, Callable[[Session], dict[str, Any]]] = {
    "emit": emit_rate.measure,
    "claim": claim_rate.measure,
    "deliver": deliver_rate.measure,
    "fixed_cost": deliver_rate.measure_fixed_cost,
    "publishers": publishers.measure,
    "fidelity": fidelity.measure,
    "latency": latency.measure,
    "memory": memory.measure,
}
# Run only when named (``--only sustained,celery``): a sustained run is long by nature, and is
# its own command too (``python -m bench.sustained``); Celery needs a broker and its extra;
# the Node worker beside pg-boss needs Node.js and npm (``python -m bench.node_rate`` too).
ON_REQUEST: dict[str, Callable[[Session], dict[str, Any]]] = {
    "sustained": sustained.measure,
    "celery": celery.measure,
    "node": node_rate.measure,
}
ALL = {**MEASUREMENTS, **ON_REQUEST}
# The measurements that run the job (and so need a Dagster storage).
RUN_DAGSTER = {"deliver", "fixed_cost", "publishers", "latency", "memory", "celery"}


def _git() -> dict[str, Any]:
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    return {"commit": git("rev-parse", "HEAD") or None, "dirty": bool(git("status", "--porcelain"))}


def _skip_reason(name: str, size: Size) -> str | None:
    if name == "fixed_cost" and not size.fixed_cost_destinations:
        return "measured at the full size only (two more job runs, one of 16 destinations)"
    return None


def run(size: Size, only: Sequence[str], out: Path, command: str) -> dict[str, Any]:
    """Run the measurements of ``size`` (all, or ``only``) and write the results to ``out``."""
    started = time.monotonic()
    document: dict[str, Any] = {
        "schema": 1,
        "size": size.name,
        "rounds": size.rounds,
        "command": command,
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "git": _git(),
        "machine": machine(),
        "measurements": {},
    }
    document["machine"]["load_average_before"] = document["machine"].pop("load_average")
    document["machine"]["own_sessions"] = processes.own_sessions
    names = [name for name in MEASUREMENTS if not only or name in only]
    names += [name for name in ON_REQUEST if name in only]
    with session(size) as bench:
        document["postgres"] = postgres(bench.scratch.server)
        for number, name in enumerate(names, start=1):
            print(f"[{number}/{len(names)}] {name} ...", end=" ", flush=True)
            began = time.monotonic()
            reason = _skip_reason(name, size)
            if reason is None and bench.remaining() <= 0:
                reason = f"the session's time limit ({size.session_seconds:.0f} s) was spent"
            if reason is not None:
                result = {"skipped": reason}
            else:
                try:
                    if name in RUN_DAGSTER:
                        bench.dagster_template()  # loading Dagster is not the measurement's
                    with bench.time_slice(size.seconds.get(name, size.session_seconds)):
                        result = ALL[name](bench)
                except Exception as exc:  # recorded, and the other measurements go on
                    traceback.print_exc(file=sys.stderr)
                    result = {"error": f"{type(exc).__name__}: {exc}"}
                result["time_share_seconds"] = size.seconds.get(name, size.session_seconds)
            result["measured_seconds"] = round(time.monotonic() - began, 1)
            document["measurements"][name] = result
            print(result.get("skipped") or result.get("error") or f"{result['measured_seconds']} s")
    document["seconds"] = round(time.monotonic() - started, 1)
    document["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    document["machine"]["load_average_after"] = machine()["load_average"]
    out.mkdir(parents=True, exist_ok=True)
    write(document, out)  # the figures are safe before anything is drawn from them
    document["plots"] = plots.draw(document, out)
    write(document, out)
    (out / "REPORT.md").write_text(report.render(document))
    return document


def write(document: dict[str, Any], out: Path) -> None:
    (out / "latest.json").write_text(json.dumps(document, indent=2, default=str) + "\n")
